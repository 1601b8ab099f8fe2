"""layerfit.memory"""
