"""A stand-in for six (not installed here): only ``six.moves.urllib``, used by pytorch/examples
super_resolution (its download is skipped: prep.py makes the image folder first)."""
