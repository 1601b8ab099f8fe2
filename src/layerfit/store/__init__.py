"""layerfit.store"""
