"""Dense layers: `Linear`, `Embedding`, `LSTMCell`."""

from __future__ import annotations

import math

from xgrad.dtype import dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad.tensor import Tensor


def _uniform(*shape: int, bound: float) -> Tensor:

    return Tensor.uniform(*shape, low=-bound, high=bound).is_param_()


class Linear:
    """`x @ weight.T + bias` with weight (out_features, in_features), as torch stores it; weight and bias uniform
    in +-1/sqrt(in_features).

    >>> from xgrad import Tensor
    >>> Linear(3, 2)(Tensor.ones(4, 3)).shape
    (4, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform(out_features, in_features, bound=bound)
        self.bias = _uniform(out_features, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.weight.shape[1]:
            raise ShapeError(f"Linear expects inputs (..., {self.weight.shape[1]}), got shape {x.shape}")
        return x.linear(self.weight.transpose(), self.bias)


class Embedding:
    """A lookup table: integer indices of any shape -> rows of `weight` (vocab_size, embed_size), initialised with
    `Tensor.glorot_uniform` as in tinygrad (torch draws from a standard normal). The lookup compares the indices
    with an arange and sums the selected rows, so its backward is a plain reduction.

    >>> from xgrad import Tensor
    >>> emb = Embedding(10, 4)
    >>> emb(Tensor([[1, 2, 3]])).shape
    (1, 3, 4)
    """

    def __init__(self, vocab_size: int, embed_size: int) -> None:

        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size).is_param_()

    def __call__(self, idx: Tensor) -> Tensor:

        if not dtypes.is_int(idx.dtype):
            raise DTypeError(f"Embedding indices must be integers, got {idx.dtype.name}; cast them with .int()")
        vocab = Tensor.arange(self.vocab_sz, device=idx.device, dtype=idx.dtype)
        hit = idx.reshape(idx.shape + (1,)) == vocab  # (..., vocab)
        return hit.reshape(hit.shape + (1,)).where(self.weight, 0.0).sum(-2)


class LSTMCell:
    """One LSTM step: `cell(x, (h, c)) -> (h', c')` with gates (input, forget, cell, output) stacked in that order
    in `weight_ih` (4*hidden, input) and `weight_hh` (4*hidden, hidden), as torch lays them out; every weight and
    bias uniform in +-1/sqrt(hidden). Without a state it starts from zeros. The state may also be one tensor
    (2, batch, hidden) as in tinygrad.

    >>> from xgrad import Tensor
    >>> h, c = LSTMCell(3, 5)(Tensor.ones(2, 3))
    >>> h.shape, c.shape
    ((2, 5), (2, 5))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        bound = 1 / math.sqrt(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = _uniform(4 * hidden_size, input_size, bound=bound)
        self.weight_hh = _uniform(4 * hidden_size, hidden_size, bound=bound)
        self.bias_ih = _uniform(4 * hidden_size, bound=bound) if bias else None
        self.bias_hh = _uniform(4 * hidden_size, bound=bound) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | Tensor | None = None) -> tuple[Tensor, Tensor]:

        if x.ndim != 2 or x.shape[1] != self.weight_ih.shape[1]:
            raise ShapeError(f"LSTMCell expects inputs (batch, {self.weight_ih.shape[1]}), got shape {x.shape}")
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
            h, c = zeros, zeros
        elif isinstance(hc, Tensor):
            if hc.shape != (2, x.shape[0], self.hidden_size):
                raise ShapeError(f"LSTMCell state must be (2, {x.shape[0]}, {self.hidden_size}), got {hc.shape}")
            h, c = (hc.shrink(((k, k + 1), None, None)).reshape(hc.shape[1:]) for k in range(2))
        else:
            h, c = hc
        gates = x.linear(self.weight_ih.transpose(), self.bias_ih) + h.linear(self.weight_hh.transpose(), self.bias_hh)
        hs = self.hidden_size
        i, f, g, o = (gates.shrink((None, (k * hs, (k + 1) * hs))) for k in range(4))
        new_c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        new_h = o.sigmoid() * new_c.tanh()
        return new_h.contiguous(), new_c.contiguous()
