"""layerfit.capture"""
