"""layerfit.engine"""
