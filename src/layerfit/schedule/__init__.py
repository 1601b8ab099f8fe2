"""layerfit.schedule"""
