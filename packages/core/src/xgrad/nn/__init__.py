"""Neural-network building blocks: layers (`xgrad.nn`), optimizers (`xgrad.nn.optim`), state I/O (`xgrad.nn.state`).

Layers are plain Python objects: their weights are Tensors marked `is_param`, found by walking attributes
(`xgrad.nn.state.get_parameters`); calling a layer applies it.

>>> from xgrad import Tensor
>>> from xgrad import nn
>>> conv, fc = nn.Conv2d(1, 4, 3), nn.Linear(4 * 6 * 6, 10)
>>> fc(conv(Tensor.ones(2, 1, 8, 8)).relu().flatten(1)).shape
(2, 10)
"""

from xgrad.nn import optim, state  # noqa: E402  (`nn.optim.Adam`, `nn.state.safe_save` as in tinygrad)
from xgrad.nn.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from xgrad.nn.layers import Embedding, Linear, LSTMCell
from xgrad.nn.norm import BatchNorm, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm, LayerNorm, LayerNorm2d, RMSNorm

__all__ = [
    "BatchNorm",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Embedding",
    "GroupNorm",
    "InstanceNorm",
    "LSTMCell",
    "LayerNorm",
    "LayerNorm2d",
    "Linear",
    "RMSNorm",
    "optim",
    "state",
]
