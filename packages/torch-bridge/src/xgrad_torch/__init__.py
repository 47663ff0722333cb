"""A PyTorch PrivateUse1 device backed by xgrad tensors.

Uses only the public `xgrad` API."""

__version__ = "0.1.0"
