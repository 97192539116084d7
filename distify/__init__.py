"""distify: convert a single-GPU PyTorch training script into a distributed one."""

__version__ = "0.1.0"
