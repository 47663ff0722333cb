"""The Tensor API split by concern into layered mixins that `xgrad.tensor.Tensor` completes."""
