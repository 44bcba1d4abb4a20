"""specadapt: speculative decoding an operator can trust."""

__version__ = "0.1.0"
