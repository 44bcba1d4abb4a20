"""Speculative decoding in PyTorch: the ground truth for output identity and speedup theory."""
