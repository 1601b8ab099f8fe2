"""layerfit.zoo"""
