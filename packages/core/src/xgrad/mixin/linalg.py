"""Linear algebra: dot/linear/einsum, triangles, normalize, and the factorizations qr, svd and newton_schulz.

Everything is composed of movement ops, elementwise ops and sums, so autograd differentiates it. The iterative
factorizations run a fixed number of steps chosen from the shape (no data-dependent loop), each step made
`contiguous()` (and `contiguous_backward()`) so the forward and backward graphs stay one kernel per step instead of
growing with the iteration count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from xgrad.dtype import DType, least_upper_dtype, to_dtype
from xgrad.errors import ArgumentError, ShapeError
from xgrad.mixin.base import TensorBase

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

ELLIPSIS = "..."


class LinalgMixin(TensorBase):
    __slots__ = ()

    # ---- products ----
    def dot(self, w: Tensor, dtype: DType | str | None = None) -> Tensor:
        """Matrix product (same rules as `matmul`) in the inputs' common dtype; `dtype` is the accumulation and result
        dtype.

        >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).dot(Tensor([1.0, 1.0])).tolist()
        [3.0, 7.0]
        """
        dt = least_upper_dtype(self.dtype, w.dtype) if dtype is None else to_dtype(dtype)
        x, y = (self._t(), w) if dtype is None else (self._t().cast(dt), w.cast(dt))
        # ReduceMixin's plain sum of products (ints accumulate in at least int32), cast back to the result dtype
        return x._sum_of_products(y).cast(dt)

    def matmul(self, x: Tensor, reverse: bool = False, dtype: DType | str | None = None) -> Tensor:
        """`self @ x` (`x @ self` with `reverse=True`), with numpy's rules for 1-d and batched operands. Like `dot`
        (as in tinygrad) the result has the inputs' common dtype: int8 @ int8 accumulates wider but returns int8,
        wrapping as numpy does; `dtype` sets the accumulation and result dtype.

        >>> Tensor([[1, 2], [3, 4]]).matmul(Tensor([[1], [1]])).tolist()
        [[3], [7]]
        >>> a = Tensor([[100, 100]], dtype=dtypes.int8)
        >>> a.matmul(a.T).dtype == dtypes.int8, a.matmul(a.T, dtype=dtypes.int32).item()
        (True, 20000)
        """
        return x.dot(self._t(), dtype) if reverse else self.dot(x, dtype)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
        """`self @ weight + bias` with `weight` of shape (in, out) as in tinygrad (torch's is (out, in)); a 1-d weight
        scales elementwise.

        >>> Tensor([[1.0, 2.0]]).linear(Tensor([[1.0], [1.0]]), Tensor([0.5])).tolist()
        [[3.5]]
        """
        out = self._t().mul(weight) if weight.ndim == 1 else self.dot(weight, dtype)
        return out if bias is None else out.add(bias)

    @classmethod
    def einsum(cls, formula: str, *operands: Tensor | Sequence[Tensor], dtype: DType | str | None = None) -> Tensor:
        """Einstein summation: `"ij,jk->ik"`. Without `->` the output is the letters used once, sorted, after any
        ellipsis dimensions. A letter repeated within one operand takes the diagonal; `...` broadcasts.

        >>> Tensor.einsum("ij,j->i", Tensor([[1.0, 2.0], [3.0, 4.0]]), Tensor([1.0, 1.0])).tolist()
        [3.0, 7.0]
        >>> Tensor.einsum("ii", Tensor([[1.0, 2.0], [3.0, 4.0]])).item()
        5.0
        """
        xs: list[Tensor] = []
        for op in operands:
            xs += list(op) if isinstance(op, (list, tuple)) else [cast("Tensor", op)]
        inputs, output = _parse_einsum(formula.replace(" ", ""), [x.ndim for x in xs])
        sizes: dict[str, int] = {}
        prepared = []
        for x, letters in zip(xs, inputs):
            x, letters = _einsum_diagonals(x, letters)
            for letter, size in zip(letters, x.shape):
                if size != 1 and sizes.get(letter, 1) not in (1, size):
                    raise ShapeError(f"einsum {formula!r}: index {letter!r} has sizes {sizes[letter]} and {size}")
                sizes[letter] = max(sizes.get(letter, 1), size)
            prepared.append((x, letters))
        reduced = [letter for letter in sizes if letter not in output]
        order = list(output) + reduced
        aligned = []
        for x, letters in prepared:
            perm = sorted(range(len(letters)), key=lambda a: order.index(letters[a]))
            shape = tuple(x.shape[letters.index(letter)] if letter in letters else 1 for letter in order)
            aligned.append(x.permute(perm).reshape(shape) if letters else x.reshape(shape))
        out = aligned[0]
        for y in aligned[1:]:
            out = out * y
        out = out.expand(tuple(sizes[letter] for letter in order))
        result_dtype = to_dtype(dtype) if dtype is not None else least_upper_dtype(*(x.dtype for x in xs))
        if reduced:
            out = out.sum(tuple(range(len(output), len(order))), dtype=result_dtype)
        return out.cast(result_dtype)

    # ---- triangles and norms ----
    def _triangle_mask(self, diagonal: int, lower: bool) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"tril/triu need at least 2 dimensions, got shape {self.shape}")
        rows, cols = self.shape[-2:]
        arange = self._tensor_cls().arange
        offset = arange(cols, device=self.device).reshape(1, cols) - arange(rows, device=self.device).reshape(rows, 1)
        return offset <= diagonal if lower else offset >= diagonal

    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two dimensions (entries with col - row <= diagonal); the rest is zero.

        >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
        [[1, 0], [3, 4]]
        """
        return self._triangle_mask(diagonal, lower=True).where(self._t(), self._t().zeros_like())

    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two dimensions (entries with col - row >= diagonal); the rest is zero.

        >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
        [[1, 2], [0, 4]]
        """
        return self._triangle_mask(diagonal, lower=False).where(self._t(), self._t().zeros_like())

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """Divide by the `p`-norm along `dim`, at least `eps` (torch.nn.functional.normalize).

        >>> Tensor([[0.0, -2.0], [4.0, 0.0]]).normalize().tolist()
        [[0.0, -1.0], [1.0, 0.0]]
        """
        x = self._t()._float()
        if p == 2.0:
            norm = x.square().sum(dim, keepdim=True).sqrt()
        elif p == 1.0:
            norm = x.abs().sum(dim, keepdim=True)
        elif math.isinf(p):
            norm = x.abs().max(dim, keepdim=True) if p > 0 else x.abs().min(dim, keepdim=True)
        else:
            norm = x.abs().pow(p).sum(dim, keepdim=True).pow(1.0 / p)
        return x / norm.maximum(eps)

    # ---- factorizations ----
    def qr(self) -> tuple[Tensor, Tensor]:
        """Householder QR of the last two dimensions, complete mode: Q (..., m, m) orthogonal, R (..., m, n) upper
        triangular, Q @ R == self. Signs follow LAPACK (and torch): R[i, i] = -sign(x) * norm unless the column below
        the diagonal is already zero. One reflection per column, each made contiguous.

        >>> q, r = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
        >>> [[round(v, 4) for v in row] for row in r.tolist()]
        [[-5.0, -2.2], [0.0, 0.4]]
        """
        if self.ndim < 2:
            raise ShapeError(f"qr needs a matrix (at least 2 dimensions), got shape {self.shape}")
        m, n = self.shape[-2:]
        batch = self.shape[:-2]
        x = self._t()._float()
        # reflect [R | Q^T] from the left at once: Q = H_1 H_2 ... means Q^T = ... H_2 H_1, one kernel per step
        eye = _eye(self, m, x.dtype).reshape((1,) * len(batch) + (m, m)).expand(batch + (m, m))
        both = x.cat(eye, dim=-1).contiguous()
        row = self._tensor_cls().arange(m, device=self.device).reshape(m, 1)
        for i in range(min(m, n)):
            col = both.shrink(tuple((0, s) for s in batch) + ((0, m), (i, i + 1)))  # (..., m, 1)
            x0 = (row == i).where(col, 0.0).sum(-2, keepdim=True)
            below = (row > i).where(col, 0.0)
            sigma = below.square().sum(-2, keepdim=True)
            skip = sigma == 0
            norm = (x0.square() + sigma).sqrt()
            beta = (x0 < 0).where(norm, -norm)
            tau = skip.where(0.0, (beta - x0) / skip.where(1.0, beta))
            v = (row == i).where(1.0, below / skip.where(1.0, x0 - beta))
            both = (both - tau * v * (v * both).sum(-2, keepdim=True)).contiguous().contiguous_backward()
        crop = tuple((0, s) for s in batch) + ((0, m),)
        return both.shrink(crop + ((n, n + m),)).transpose(-1, -2), both.shrink(crop + ((0, n),)).triu()

    def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Singular value decomposition of the last two dimensions: U, S, V with self == U @ diag(S) @ V^T (V, not
        torch's Vh = V^T, as in tinygrad). S is descending. U is (..., m, m) and V (..., n, n), or with
        `full_matrices=False` (..., m, k) and (..., n, k), k = min(m, n).

        Householder QR first, then one-sided (Hestenes) Jacobi on the k x k triangle with round-robin column pairs,
        a fixed ceil(log2 k) + 4 sweeps of k - 1 rounds (k rounded up to even). Accuracy, relative to the largest
        singular value, for random matrices up to 16 x 16: singular values, U @ diag(S) @ V^T - self and U^T U - I
        about 1e-6 in float32 and 1e-15 in float64; strongly clustered singular values converge slower. For a
        rank-deficient matrix the columns of U belonging to zero singular values are zero, not orthonormal.

        >>> u, s, v = Tensor([[3.0, 0.0], [0.0, -4.0]]).svd()
        >>> [round(x, 4) for x in s.tolist()]
        [4.0, 3.0]
        """
        if self.ndim < 2:
            raise ShapeError(f"svd needs a matrix (at least 2 dimensions), got shape {self.shape}")
        m, n = self.shape[-2:]
        if m < n:
            u_t, s_t, v_t = self._t().transpose(-1, -2).svd(full_matrices)
            return v_t, s_t, u_t
        if n == 0:
            raise ShapeError(f"svd of a matrix with no columns, shape {self.shape}")
        batch = self.shape[:-2]
        q, r = self.qr()
        a = r.shrink(tuple((0, s) for s in batch) + ((0, n), (0, n)))
        a, v = _jacobi_sweeps(a)
        s, order = a.square().sum(-2).sqrt().sort(-1, descending=True)
        k = a.shape[-1]
        pick = (order.unsqueeze(-2) == self._tensor_cls().arange(k, device=self.device).reshape(k, 1)).cast(a.dtype)
        a, v = a.matmul(pick), v.matmul(pick)
        u_small = a / (s != 0).where(s, 1.0).unsqueeze(-2)
        crop = tuple((0, x) for x in batch)
        u_small = u_small.shrink(crop + ((0, n), (0, n)))
        v, s = v.shrink(crop + ((0, n), (0, n))), s.shrink(crop + ((0, n),))
        if full_matrices:
            rest = _eye(self, m, a.dtype).shrink(((0, m), (n, m))).pad(((0, 0), (n, 0)))
            u = q.matmul(u_small.pad(tuple((0, 0) for _ in batch) + ((0, m - n), (0, m - n))) + rest)
        else:
            u = q.shrink(crop + ((0, m), (0, n))).matmul(u_small)
        return u, s, v

    def newton_schulz(self, steps: int, params: Sequence[float], eps: float = 1e-7) -> Tensor:
        """Newton-Schulz iteration toward the nearest semi-orthogonal matrix (Muon): X = self / (||self||_F + eps),
        then `steps` times X = sum_i params[i] * (X X^T)^i X, on the last two dimensions (on the transpose when there
        are more rows than columns).

        >>> x = Tensor([[2.0, 0.0], [0.0, 2.0]]).newton_schulz(8, (1.5, -0.5))
        >>> [[round(v, 3) for v in row] for row in x.tolist()]
        [[1.0, 0.0], [0.0, 1.0]]
        """
        if self.ndim < 2:
            raise ShapeError(f"newton_schulz needs a matrix (at least 2 dimensions), got shape {self.shape}")
        if self.shape[-2] > self.shape[-1]:
            return self._t().transpose(-1, -2).newton_schulz(steps, params, eps).transpose(-1, -2)
        x = self._t()._float()
        g = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
        for _ in range(steps):
            gram = g.matmul(g.transpose(-1, -2))
            term = g
            total = g * params[0] if params else g.zeros_like()
            for p in params[1:]:
                term = gram.matmul(term)
                total = total + term * p
            g = total
        return g


def _eye(like: LinalgMixin, n: int, dtype: DType) -> Tensor:
    arange = like._tensor_cls().arange
    return (arange(n, device=like.device).reshape(n, 1) == arange(n, device=like.device).reshape(1, n)).cast(dtype)


def _jacobi_sweeps(a: Tensor) -> tuple[Tensor, Tensor]:
    """One-sided Jacobi on the columns of a (..., n, n): returns (A V, V) with the columns of A V orthogonal. Column
    pairs (j, h + j) are rotated together; then the columns move one place in a round-robin (circle method: column 0
    stays, the top row shifts right, the bottom row left) so every pair meets once per sweep. An odd n gets a zero
    column (its singular value 0 sorts last and is cut off by the caller). A and V are stacked as rows of one
    tensor, so a round is two kernels: the 2x2 Gram matrices of the pairs, and the rotation."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    big = n + n % 2
    half = big // 2
    keep = tuple((0, s) for s in batch)
    if big != n:
        a = a.pad(tuple((0, 0) for _ in batch) + ((0, 0), (0, 1)))
    v = _eye(a, big, a.dtype).reshape((1,) * len(batch) + (big, big)).expand(batch + (big, big))
    w = a.cat(v, dim=-2).contiguous()
    rows = n + big
    sweeps = math.ceil(math.log2(big)) + 4
    for _ in range(sweeps * (big - 1) if n > 1 else 0):
        pairs = w.shrink(keep + ((0, n), (0, big))).reshape(batch + (n, 2, half)).transpose(-3, -2)  # (..., 2, n, h)
        gram = (pairs.unsqueeze(-4) * pairs.unsqueeze(-3)).sum(-2)  # (..., 2, 2, h)

        def entry(i: int, j: int, gram: Tensor = gram) -> Tensor:
            return gram.shrink(keep + ((i, i + 1), (j, j + 1), (0, half))).reshape(batch + (1, half))

        alpha, beta, gamma = entry(0, 0), entry(1, 1), entry(0, 1)
        rotate = gamma != 0
        zeta = (beta - alpha) / (2 * rotate.where(gamma, 1.0))
        t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
        t = rotate.where(t, 0.0)
        c = (1 + t.square()).rsqrt()
        s = c * t
        p, q = w.shrink(keep + ((0, rows), (0, half))), w.shrink(keep + ((0, rows), (half, big)))
        w = _round_robin(c * p - s * q, s * p + c * q).contiguous().contiguous_backward()
    return w.shrink(keep + ((0, n), (0, big))), w.shrink(keep + ((n, rows), (0, big)))


def _round_robin(p: Tensor, q: Tensor) -> Tensor:
    """The columns of the next round: top [p0, q0, p1 .. p_{h-2}], bottom [q1 .. q_{h-1}, p_{h-1}]."""
    h = p.shape[-1]
    if h == 1:
        return p.cat(q, dim=-1)

    def cols(t: Tensor, lo: int, hi: int) -> Tensor:
        return t.shrink(tuple((0, s) for s in t.shape[:-1]) + ((lo, hi),))

    top = [cols(p, 0, 1), cols(q, 0, 1)] + ([cols(p, 1, h - 1)] if h > 2 else [])
    return top[0].cat(*top[1:], cols(q, 1, h), cols(p, h - 1, h), dim=-1)


def _parse_einsum(formula: str, ndims: list[int]) -> tuple[list[list[str]], list[str]]:
    """Split an einsum formula into per-operand index lists and the output list. Ellipsis dimensions become the
    indices '.0', '.1', ... aligned from the right across operands (so they broadcast like numpy)."""
    lhs, arrow, rhs = formula.partition("->")
    parts = lhs.split(",")
    if len(parts) != len(ndims):
        raise ArgumentError(f"einsum {formula!r} names {len(parts)} operands but {len(ndims)} were given")
    n_ellipsis = 0
    for part, nd in zip(parts, ndims):
        letters = part.replace(ELLIPSIS, "")
        if not letters.isalpha() and letters:
            raise ArgumentError(f"einsum {formula!r}: indices must be letters, got {part!r}")
        if ELLIPSIS in part:
            n_ellipsis = max(n_ellipsis, nd - len(letters))
        elif len(letters) != nd:
            raise ShapeError(f"einsum {formula!r}: operand {part!r} has {len(letters)} indices but {nd} dimensions")
    ell = [f".{i}" for i in range(n_ellipsis)]
    inputs = []
    for part, nd in zip(parts, ndims):
        before, has_ellipsis, after = part.partition(ELLIPSIS)
        count = nd - len(before) - len(after)
        if has_ellipsis and count < 0:
            raise ShapeError(f"einsum {formula!r}: operand {part!r} has more indices than its {nd} dimensions")
        inputs.append(list(before) + (ell[n_ellipsis - count :] if has_ellipsis else []) + list(after))
    if arrow:
        before, has_ellipsis, after = rhs.partition(ELLIPSIS)
        output = list(before) + (ell if has_ellipsis else []) + list(after)
        used = {i for indices in inputs for i in indices}
        if len(set(output)) != len(output) or any(i not in used for i in output):
            raise ArgumentError(f"einsum {formula!r}: output indices must be distinct and appear in an input")
        if n_ellipsis and not has_ellipsis:
            raise ArgumentError(f"einsum {formula!r}: the output needs '...' when the inputs use it")
    else:
        counts: dict[str, int] = {}
        for indices in inputs:
            for i in indices:
                counts[i] = counts.get(i, 0) + 1
        output = ell + sorted(i for i, c in counts.items() if c == 1 and not i.startswith("."))
    return inputs, output


def _einsum_diagonals(x: Tensor, letters: list[str]) -> tuple[Tensor, list[str]]:
    """Take the diagonal of every index repeated within one operand, leaving each index once."""
    letters = list(letters)
    while len(set(letters)) != len(letters):
        dup = next(i for i in letters if letters.count(i) > 1)
        a = letters.index(dup)
        b = letters.index(dup, a + 1)
        if x.shape[a] != x.shape[b]:
            raise ShapeError(f"einsum: repeated index {dup!r} has sizes {x.shape[a]} and {x.shape[b]} in {x.shape}")
        rest = [i for i in range(x.ndim) if i not in (a, b)]
        x = _diagonal_last2(x.permute(rest + [a, b]))
        letters = [letters[i] for i in rest] + [dup]
    return x, letters


def _diagonal_last2(x: Tensor) -> Tensor:
    """(..., n, n) -> (..., n): the entries (i, i), read as every (n + 1)-th element of the flattened pair."""
    n = x.shape[-1]
    lead = x.shape[:-2]
    if n == 0:
        return x.reshape(lead + (0,))
    flat = x.reshape(lead + (n * n,)).pad(tuple((0, 0) for _ in lead) + ((0, n),))
    return flat.reshape(lead + (n, n + 1)).shrink(tuple((0, s) for s in lead) + ((0, n), (0, 1))).reshape(lead + (n,))
