"""layerfit.serve"""
