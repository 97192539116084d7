"""A stand-in for Pillow: ``Image`` wraps a (C, H, W) float tensor in [0, 1]."""
