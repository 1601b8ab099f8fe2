"""layerfit.tradeoff"""
