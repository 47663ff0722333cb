"""Random numbers from a counter-based Threefry-2x32 generator computed in kernels, and the init helpers.

The generator (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11; the Random123 library, also used by
JAX) is a keyed bijection of 64-bit blocks: 20 rounds of add / rotate / xor on two uint32 words, with the key injected
every 4 rounds. Random word `w` of a draw is word `w % 2` of the block encrypted from counter `base + w // 2`, so every
element is computed independently, in parallel, inside the kernel that uses it: there is no generator state on the
host, only one key and one 64-bit block counter (two uint32 words, low first) per device, held in small device
tensors. Each draw reserves its blocks by advancing the counter with `assign` (so a TinyJit replay draws new numbers)
and reads a snapshot of the old value that later draws cannot change: the draw itself runs these two tiny kernels at
once (the random values stay lazy), because a lazy read of the counter would see later advances.

Floats: the top `p` bits of a word (`p` = mantissa bits + 1: 24 for float32, 11 for float16, 8 for bfloat16) as an
integer `k` give `k * 2**-p`, exact in the dtype and evenly spaced in [0, 1); float64 takes 53 bits from the two
words of one block. `randn` (Box-Muller) takes its two float32 uniforms from the two words of one block too.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from xgrad.device import Device
from xgrad.dtype import DType, dtypes, to_dtype
from xgrad.errors import ArgumentError, DTypeError, ShapeError, XgradError
from xgrad.helpers import TRAINING, argfix, ceildiv, prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import canonical_device, with_requires_grad
from xgrad.mixin.creation import _shape_arg, _size
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symshape import sint_max

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

# Threefry-2x32 constants (Random123): rotation distances per round (mod 8) and the key-schedule parity word
THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
THREEFRY_PARITY = 0x1BD11BDA
THREEFRY_ROUNDS = 20
U32_MASK = 0xFFFFFFFF


def _rotl32(x: Tensor, r: int) -> Tensor:
    return (x << r) | (x >> (32 - r))


def threefry2x32(c0: Tensor, c1: Tensor, k0: Tensor, k1: Tensor) -> tuple[Tensor, Tensor]:
    """Encrypt counter words (c0, c1) with key words (k0, k1): Threefry-2x32 with 20 rounds, on uint32 tensors
    (broadcast together). Returns the two output words."""
    ks = (k0, k1, k0 ^ k1 ^ THREEFRY_PARITY)
    x0, x1 = c0 + ks[0], c1 + ks[1]
    for r in range(THREEFRY_ROUNDS):
        x0 = x0 + x1
        x1 = _rotl32(x1, THREEFRY_ROTATIONS[r % 8]) ^ x0
        if r % 4 == 3:  # key injection s after every 4 rounds
            s = (r + 1) // 4
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + s
    return x0, x1


def _word(t: Tensor, i: int) -> Tensor:
    """Element `i` of the last axis of `t`, with that axis removed."""
    return t.shrink(tuple((0, s) for s in t.shape[:-1]) + ((i, i + 1),)).reshape(t.shape[:-1])


def _pair(lo: Tensor, hi: Tensor) -> Tensor:
    """Stack two same-shaped tensors along a new last axis of size 2."""
    sh = lo.shape + (1,)
    pads = ((0, 0),) * lo.ndim
    return lo.reshape(sh).pad(pads + ((0, 1),)) + hi.reshape(sh).pad(pads + ((1, 0),))


def _add_u64(a: Tensor, b: Tensor) -> Tensor:
    """a + b for 64-bit numbers held as uint32 words (low, high) in tensors of shape (2,)."""
    a_lo, b_lo = _word(a, 0), _word(b, 0)
    lo = a_lo + b_lo
    carry = (lo < a_lo).cast(dtypes.uint32)
    return _pair(lo, _word(a, 1) + _word(b, 1) + carry)


def _blocks(key: Tensor, counter: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """The two words of the Threefry-2x32 blocks of counters `counter + index` (64-bit, uint32 words) under `key`."""
    base_lo, base_hi = _word(counter, 0).reshape(1), _word(counter, 1).reshape(1)
    lo = base_lo + index
    hi = base_hi + (lo < base_lo).cast(dtypes.uint32)
    return threefry2x32(lo, hi, _word(key, 0).reshape(1), _word(key, 1).reshape(1))


# the graphs of recent draws, built over placeholder key and counter buffers: (kind, device, size) -> (key slot,
# counter slot, a SINK of the outputs). See `_drawn`
_DRAW_GRAPHS: dict[tuple[str, str, int], tuple[UOp, UOp, UOp]] = {}
DRAW_GRAPHS_KEPT = 64


def _drawn(
    kind: str, key: Tensor, counter: Tensor, num: int, build: Callable[[Tensor, Tensor], tuple[Tensor, ...]]
) -> tuple[Tensor, ...]:
    """`build(key, counter)` for a draw of `num` values. Every draw reads a new counter snapshot, so none of the ~250
    nodes of its Threefry graph is in the UOp cache, and building them through Tensor ops (broadcasting, constants,
    sizing each node) took ~4 ms a draw. For a realized key and counter the graph is built once per (kind, device,
    num) over placeholder buffers, then copied onto the real ones node for node, with the shapes and devices the
    template knows: the same graph, the same numbers."""
    if not all(t.dtype == dtypes.uint32 and t.uop.shape == (2,) and t.uop.plain_buffer for t in (key, counter)):
        return build(key, counter)
    tc = key._tensor_cls()
    entry = _DRAW_GRAPHS.pop((kind, key.device, num), None)  # popped and put back: the dict keeps recent use order
    if entry is None:
        k_slot, c_slot = (UOp.buffer(key.device, 2, dtypes.uint32, -1 - i) for i in range(2))  # never allocated
        entry = (k_slot, c_slot, UOp(Ops.SINK, dtypes.void, tuple(out.uop for out in build(tc(k_slot), tc(c_slot)))))
        if len(_DRAW_GRAPHS) >= DRAW_GRAPHS_KEPT:  # the least recently used goes, with its cached walk
            _DRAW_GRAPHS.pop(next(iter(_DRAW_GRAPHS)))[2].drop_walk()
    _DRAW_GRAPHS[(kind, key.device, num)] = entry
    k_slot, c_slot, outs = entry
    drawn = substitute(outs, {k_slot: key.uop, c_slot: counter.uop}, same_sizes=True)
    return tuple(tc(u) for u in drawn.src)


def _unit_float(words: Tensor, dtype: DType) -> Tensor:
    """Floats in [0, 1) from uint32 words: the top p = mantissa + 1 bits as k, then k * 2**-p (exact in dtype)."""
    p = dtypes.finfo(dtype)[1] + 1
    return ((words >> (32 - p)).cast(dtypes.float32) * 2.0**-p).cast(dtype)


def _unit_float64(hi: Tensor, lo: Tensor) -> Tensor:
    """float64 in [0, 1) from two uint32 words: 27 bits of `hi` and 26 of `lo` as a 53-bit k, then k * 2**-53."""
    return ((hi >> 5).cast(dtypes.float64) * 2.0**26 + (lo >> 6).cast(dtypes.float64)) * 2.0**-53


class RandomArgumentError(XgradError, ValueError):
    """A random-number argument out of its domain (low >= high, a negative std): a ValueError, as tinygrad's."""


class RandomDTypeError(DTypeError, ValueError):
    """`rand` asked for a dtype that is not a float: a DTypeError that is also tinygrad's ValueError."""


class MultinomialError(ShapeError, AssertionError):
    """multinomial's weights or sample count do not fit: tinygrad asserts these, so this is an AssertionError too."""


def _symbolic_draw(shape: tuple[Any, ...], draw: Callable[[tuple[int, ...]], Tensor]) -> Tensor | None:
    """For a shape with bound Variables (`Tensor.rand(3, v)`): `draw` at the largest value of every size, then the
    view of the bound sizes; None for a concrete shape. One compiled kernel serves every value of the variables."""
    given = argfix(*shape)
    if not any(isinstance(s, UOp) for s in given):
        return None
    sh: tuple[Any, ...] = _shape_arg(*given)
    full = draw(tuple(sint_max(s) for s in sh))
    return full.shrink(tuple((0, s) for s in sh))


def _shape_of(shape: tuple[Any, ...]) -> tuple[int, ...]:
    given = argfix(*shape)
    sh = tuple(_size(s, given) for s in given)
    if any(s < 0 for s in sh):
        raise ShapeError(f"negative dimension in shape {sh}; every size must be >= 0")
    return sh


def _float_dtype(dtype: DType | str | None, what: str) -> DType:
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt):
        raise RandomDTypeError(f"{what} makes floating-point tensors, not {dt.name}; use randint for integers")
    return dt


def _fan_in(shape: tuple[int, ...]) -> int:
    """prod(shape[1:]), at least 1 (an init of a zero-size tensor is an empty tensor, not a division by zero)."""
    return max(1, int(prod(shape[1:])))


class RandomMixin(TensorBase):
    __slots__ = ()

    _seed: ClassVar[int] = int(time.time())
    _device_seeds: ClassVar[dict[str, Tensor]] = {}  # device -> uint32 key words (2,)
    _device_rng_counters: ClassVar[dict[str, Tensor]] = {}  # device -> uint32 block counter words (low, high)

    # ---- generator state ----
    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Seed the generator of every device: the same seed gives the same sequence of random tensors again.

        >>> Tensor.manual_seed(7)
        >>> a = Tensor.rand(3).tolist()
        >>> Tensor.manual_seed(7)
        >>> Tensor.rand(3).tolist() == a
        True
        """
        tc = RandomMixin._tensor_cls()
        tc._seed = int(seed)
        tc._device_seeds.clear()
        tc._device_rng_counters.clear()

    @classmethod
    def _rng_key(cls, device: str) -> Tensor:
        """The key of `device` (made on first use from sha256 of the seed and the device's index, so devices of
        different types with the same index draw the same numbers)."""
        tc = cls._tensor_cls()
        if device not in tc._device_seeds:
            digest = hashlib.sha256(f"{Device.parse(device).index}:{tc._seed}".encode()).digest()
            words = [int.from_bytes(digest[i : i + 4], "little") for i in (0, 4)]
            tc._device_seeds[device] = tc(words, device=device, dtype=dtypes.uint32)
            tc._device_rng_counters[device] = tc([0, 0], device=device, dtype=dtypes.uint32)
        return tc._device_seeds[device]

    @classmethod
    def _reserve_blocks(cls, device: str, blocks: int) -> Tensor:
        """Advance the counter of `device` by `blocks`; returns a realized snapshot of its value before (the first
        block of this draw), which later draws cannot overwrite."""
        cls._rng_key(device)
        tc = cls._tensor_cls()
        counter = tc._device_rng_counters[device]
        base = counter.contiguous()
        # the step comes in a buffer, not as a constant, so one compiled kernel advances the counter for every size
        step = tc([blocks & U32_MASK, (blocks >> 32) & U32_MASK], device=device, dtype=dtypes.uint32)
        counter.assign(_add_u64(base, step))
        return base.realize(counter)

    @staticmethod
    def random_bits(key: Tensor, counter: Tensor, num: int) -> Tensor:
        """`num` random uint32 words: word `w` is word `w % 2` of the Threefry-2x32 block of counter `counter + w // 2`
        under `key`. `key` and `counter` are uint32 tensors of shape (2,) (low word first).

        >>> key = Tensor([0, 0], dtype="uint32")
        >>> [hex(w) for w in Tensor.random_bits(key, Tensor([0, 0], dtype="uint32"), 3).tolist()]
        ['0x6b200159', '0x99ba4efe', '0x508efb2c']
        """
        for name, t in (("key", key), ("counter", counter)):
            if t.dtype != dtypes.uint32 or t.shape != (2,):
                raise DTypeError(
                    f"random_bits needs {name} as a uint32 tensor of shape (2,), got {t.dtype.name} {t.shape}"
                )
        w = RandomMixin._tensor_cls().arange(num, device=key.device, dtype=dtypes.uint32)
        x0, x1 = _blocks(key, counter, w >> 1)
        return ((w & 1) == 0).where(x0, x1)

    def threefry(self, seed: Tensor | int) -> Tensor:
        """Threefry-2x32 (20 rounds) of the blocks in self under key `seed`, elementwise with broadcasting.

        uint64 form (as tinygrad): each value is a block, low 32 bits first word; `seed` is a uint64 tensor or int.
        uint32 form (for devices without 64-bit ints): the last axis of self and of `seed` has the 2 words.

        >>> Tensor([0, 0], dtype="uint32").threefry(Tensor([0, 0], dtype="uint32")).tolist()
        [1797259609, 2579123966]
        """
        tc = self._tensor_cls()
        if self.dtype == dtypes.uint64:
            key = seed if not isinstance(seed, int) else tc(seed & (2**64 - 1), device=self.device, dtype=dtypes.uint64)
            if key.dtype != dtypes.uint64:
                raise DTypeError(f"threefry of uint64 blocks needs a uint64 seed, got {key.dtype.name}")
            c0, c1 = (self._t() & U32_MASK).cast(dtypes.uint32), (self._t() >> 32).cast(dtypes.uint32)
            k0, k1 = (key & U32_MASK).cast(dtypes.uint32), (key >> 32).cast(dtypes.uint32)
            x0, x1 = threefry2x32(c0, c1, k0, k1)
            return (x1.cast(dtypes.uint64) << 32) | x0.cast(dtypes.uint64)
        if self.dtype == dtypes.uint32:
            if isinstance(seed, int):
                seed = tc([seed & U32_MASK, (seed >> 32) & U32_MASK], device=self.device, dtype=dtypes.uint32)
            if seed.dtype != dtypes.uint32 or not self.shape or self.shape[-1] != 2 or seed.shape[-1:] != (2,):
                raise ShapeError(
                    f"threefry of uint32 words needs self and seed with a last axis of 2 words, got {self.shape} and "
                    f"{seed.shape} ({seed.dtype.name}); or pass uint64 blocks"
                )
            x0, x1 = threefry2x32(_word(self._t(), 0), _word(self._t(), 1), _word(seed, 0), _word(seed, 1))
            return _pair(x0, x1)
        raise DTypeError(f"threefry needs uint64 blocks or uint32 word pairs, not {self.dtype.name}")

    @classmethod
    def _random_words(cls, num: int, device: str) -> Tensor:
        """`num` fresh random uint32 words on `device` (advances its counter)."""
        base = cls._reserve_blocks(device, ceildiv(num, 2))
        return _drawn("words", cls._rng_key(device), base, num, lambda k, c: (cls.random_bits(k, c, num),))[0]

    @classmethod
    def _random_blocks(cls, num: int, device: str) -> tuple[Tensor, Tensor]:
        """Both words of `num` fresh blocks: words 2i and 2i+1 of the stream, computed by one chain per element."""
        base = cls._reserve_blocks(device, num)

        def build(key: Tensor, counter: Tensor) -> tuple[Tensor, Tensor]:
            return _blocks(key, counter, cls._tensor_cls().arange(num, device=device, dtype=dtypes.uint32))

        x0, x1 = _drawn("blocks", cls._rng_key(device), base, num, build)
        return x0, x1

    # ---- uniform and normal ----
    @classmethod
    def rand(
        cls,
        *shape: Any,
        device: str | None = None,
        dtype: DType | str | None = None,
        contiguous: bool = True,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """Uniform random floats in [0, 1) of `shape` (default float dtype). `contiguous=False` leaves the result
        lazy, to be computed inside the kernels that use it. Not differentiable: a random tensor is a constant.

        >>> x = Tensor.rand(2, 3)
        >>> x.shape, bool(((x >= 0) & (x < 1)).all().item())
        ((2, 3), True)
        """
        sym = _symbolic_draw(shape, lambda sh: cls.rand(*sh, device=device, dtype=dtype, contiguous=contiguous))
        if sym is not None:
            return with_requires_grad(sym, requires_grad)
        sh = _shape_of(shape)
        dt = _float_dtype(dtype, "rand")
        dev = canonical_device(device)
        tc = cls._tensor_cls()
        n = int(prod(sh))
        if n == 0:
            return tc.full(sh, 0.0, device=dev, dtype=dt, requires_grad=requires_grad)
        out = (
            _unit_float64(*cls._random_blocks(n, dev))
            if dt == dtypes.float64
            else _unit_float(cls._random_words(n, dev), dt)
        )
        out = out.reshape(sh).detach()
        return with_requires_grad(out.contiguous() if contiguous else out, requires_grad)

    def rand_like(self, **kwargs: Any) -> Tensor:
        """Uniform [0, 1) random floats shaped like self (its float dtype and device unless given).

        >>> Tensor([[1.0, 2.0]]).rand_like().shape
        (1, 2)
        """
        kwargs.setdefault("device", self.device)
        if "dtype" not in kwargs and dtypes.is_float(self.dtype):
            kwargs["dtype"] = self.dtype
        return self._tensor_cls().rand(*self.shape, **kwargs)

    @classmethod
    def randn(
        cls,
        *shape: Any,
        device: str | None = None,
        dtype: DType | str | None = None,
        contiguous: bool = False,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """Standard normal random floats (mean 0, variance 1) of `shape`: Box-Muller from two uniforms
        `u1, u2` as `sqrt(-2 log(1 - u1)) * cos(2 pi u2)`.

        >>> Tensor.randn(2, 3).shape
        (2, 3)

        An int `dtype` gives the normal floats cast to it (rounded toward zero), as tinygrad's.
        """
        sym = _symbolic_draw(shape, lambda sh: cls.randn(*sh, device=device, dtype=dtype, contiguous=contiguous))
        if sym is not None:
            return with_requires_grad(sym, requires_grad)
        if dtype is not None and not dtypes.is_float(to_dtype(dtype)):
            normal = cls.randn(*shape, device=device, dtype=dtypes.default_float, contiguous=False)
            out = normal.cast(to_dtype(dtype))
            return out.contiguous() if contiguous else out
        sh, dt, dev = _shape_of(shape), _float_dtype(dtype, "randn"), canonical_device(device)
        n = int(prod(sh))
        if n == 0:
            return cls._tensor_cls().full(sh, 0.0, device=dev, dtype=dt, requires_grad=requires_grad)
        if dt == dtypes.float64:
            u = cls.rand(*sh, 2, device=dev, dtype=dt, contiguous=False)
            u1, u2 = _word(u, 0), _word(u, 1)
        else:  # float32 math; both uniforms from the two words of one block
            x0, x1 = cls._random_blocks(n, dev)
            u1, u2 = (_unit_float(x, dtypes.float32).reshape(sh).detach() for x in (x0, x1))
        z = ((1 - u1).log() * -2).sqrt() * (u2 * (2 * math.pi)).cos()
        out = z.cast(dt)
        return with_requires_grad(out.contiguous() if contiguous else out, requires_grad)

    def randn_like(self, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
        """Standard normal random floats shaped like self (its float dtype and device unless given).

        >>> Tensor.zeros(4).randn_like().shape
        (4,)
        """
        kwargs.setdefault("device", self.device)
        dt = dtype if dtype is not None else self.dtype if dtypes.is_float(self.dtype) else None
        return self._tensor_cls().randn(*self.shape, dtype=dt, **kwargs)

    @classmethod
    def normal(
        cls, *shape: Any, mean: float = 0.0, std: float = 1.0, requires_grad: bool | None = None, **kwargs: Any
    ) -> Tensor:
        """Normal random floats with `mean` and standard deviation `std`.

        >>> Tensor.normal(2, 2, mean=3.0, std=0.0).tolist()
        [[3.0, 3.0], [3.0, 3.0]]
        """
        if isinstance(std, (int, float)) and std < 0:
            raise RandomArgumentError(f"normal needs std >= 0, got std={std}")
        return with_requires_grad(cls.randn(*shape, **kwargs) * std + mean, requires_grad)

    @classmethod
    def uniform(
        cls,
        *shape: Any,
        low: float = 0.0,
        high: float = 1.0,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """Uniform random floats in [low, high). An int `dtype` gives `low` plus the offset rounded down, as tinygrad's
        (ints in [low, high) for int bounds).

        >>> x = Tensor.uniform(100, low=-2.0, high=-1.0)
        >>> bool(((x >= -2.0) & (x < -1.0)).all().item())
        True
        >>> sorted(set(Tensor.uniform(200, low=-2, high=2, dtype=dtypes.int32).tolist()))
        [-2, -1, 0, 1]
        """
        if low >= high:
            raise RandomArgumentError(f"uniform needs low < high, got low={low}, high={high}")
        if dtype is not None and dtypes.is_int(dt := to_dtype(dtype)):
            offset = (cls.rand(*shape, **kwargs) * (high - low)).cast(dt)  # >= 0: the cast rounds it down
            return with_requires_grad(offset + low, requires_grad)
        dt = _float_dtype(dtype, "uniform")
        return with_requires_grad((cls.rand(*shape, dtype=dt, **kwargs) * (high - low) + low).cast(dt), requires_grad)

    @classmethod
    def scaled_uniform(cls, *shape: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        """Uniform in [-1, 1) scaled by `1 / sqrt(numel)`.

        >>> bool((Tensor.scaled_uniform(4, 4).abs() <= 0.25).all().item())
        True
        """
        scale = math.sqrt(max(1, int(prod(_shape_of(shape)))))
        return with_requires_grad(cls.uniform(*shape, low=-1.0, high=1.0, **kwargs) / scale, requires_grad)

    @classmethod
    def glorot_uniform(cls, *shape: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        """Glorot (Xavier) uniform init: uniform in [-b, b) with `b = sqrt(6 / (shape[0] + prod(shape[1:])))`.

        >>> bool((Tensor.glorot_uniform(3, 3).abs() <= 1.0).all().item())
        True
        """
        sh = _shape_of(shape)
        fans = max(1, (sh[0] if sh else 1) + _fan_in(sh))
        return with_requires_grad(cls.uniform(*sh, low=-1.0, high=1.0, **kwargs) * math.sqrt(6 / fans), requires_grad)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """Kaiming (He) uniform init for leaky-relu slope `a`: bound `sqrt(6 / ((1 + a^2) * fan_in))`,
        fan_in = prod(shape[1:]).

        >>> bool((Tensor.kaiming_uniform(2, 6, a=0.0).abs() <= 1.0).all().item())
        True
        """
        sh = _shape_of(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(_fan_in(sh))
        return cls.uniform(*sh, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """Kaiming (He) normal init for leaky-relu slope `a`: std `sqrt(2 / ((1 + a^2) * fan_in))`.

        >>> Tensor.kaiming_normal(3, 4).shape
        (3, 4)
        """
        sh = _shape_of(shape)
        std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(_fan_in(sh))
        return cls.normal(*sh, mean=0.0, std=std, **kwargs)

    # ---- integers ----
    @classmethod
    def randint(
        cls,
        *shape: Any,
        low: int = 0,
        high: int = 10,
        device: str | None = None,
        dtype: DType | str | None = None,
        contiguous: bool = True,
    ) -> Tensor:
        """Uniform random integers in [low, high) (default int dtype): a random word modulo `high - low` (two words
        for ranges past 2**32), so the bias is at most `(high - low) / 2**32`.

        >>> x = Tensor.randint(50, low=3, high=6)
        >>> sorted(set(x.tolist())) == [3, 4, 5]
        True
        """
        if not isinstance(low, int) or not isinstance(high, int) or isinstance(low, bool) or isinstance(high, bool):
            raise DTypeError(f"randint needs int bounds, got low={low!r}, high={high!r}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        if not dtypes.is_int(dt):
            raise DTypeError(f"randint makes integers, not {dt.name}; use rand or uniform for floats")
        if low >= high:
            raise RandomArgumentError(f"randint needs low < high, got low={low}, high={high}")
        if low < dtypes.min(dt) or high - 1 > dtypes.max(dt):
            raise DTypeError(f"randint range [{low}, {high}) does not fit {dt.name}; pick a wider dtype")
        sh = _shape_of(shape)
        dev = canonical_device(device)
        n, span = int(prod(sh)), high - low
        if n == 0:
            return cls._tensor_cls().full(sh, 0, device=dev, dtype=dt)
        # offsets in [0, span) plus low, in unsigned arithmetic that wraps to the right bits, then reinterpreted
        if span > 2**32:  # only 64-bit dtypes get here: 64 bits from the two words of one block
            x0, x1 = cls._random_blocks(n, dev)
            bits = (x1.cast(dtypes.uint64) << 32) | x0.cast(dtypes.uint64)
            offset = bits % span if span < 2**64 else bits
        else:
            words = cls._random_words(n, dev)
            offset = words % span if span < 2**32 else words
        if dt.itemsize == 8:
            out = (offset.cast(dtypes.uint64) + (low % 2**64)).bitcast(dt)
        else:
            narrow = offset + (low % 2**32)
            out = (narrow.bitcast(dtypes.int32) if not dtypes.is_unsigned(dt) else narrow).cast(dt)
        out = out.reshape(sh).detach()
        return out.contiguous() if contiguous else out

    @classmethod
    def randperm(
        cls, n: int, device: str | None = None, dtype: DType | str | None = None, contiguous: bool = True
    ) -> Tensor:
        """A random permutation of 0 .. n-1 (default int dtype): the ranks of `n` random keys (ties broken by
        position). Ranking compares every pair, O(n^2) work fused in one reduction: fine for small `n`.

        >>> sorted(Tensor.randperm(5).tolist())
        [0, 1, 2, 3, 4]
        """
        # TODO: rank with argsort of the keys once Tensor.argsort exists (O(n log^2 n) bitonic network)
        if n < 0:
            raise ShapeError(f"randperm needs n >= 0, got {n}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        dev = canonical_device(device)
        tc = cls._tensor_cls()
        if n == 0:
            return tc.full((0,), 0, device=dev, dtype=dt)
        keys = cls._random_words(n, dev).contiguous()  # a kernel of its own: the n^2 pairs load, not recompute, keys
        idx = tc.arange(n, device=dev, dtype=dtypes.int32)
        ki, kj = keys.reshape(n, 1), keys.reshape(1, n)
        before = (kj < ki) | ((kj == ki) & (idx.reshape(1, n) < idx.reshape(n, 1)))
        out = before.cast(dtypes.int32).sum(1).cast(dt)
        return out.contiguous() if contiguous else out

    # ---- sampling ----
    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw `num_samples` category indices from the weights in self (1-d: one distribution; 2-d: one per row),
        by inverting the cumulative weights with uniforms. Without replacement a drawn category's weight is zeroed
        before the next draw, so `num_samples` may be up to the number of categories with nonzero weight.

        >>> Tensor([0.0, 0.0, 1.0, 0.0]).multinomial(3, replacement=True).tolist()
        [2, 2, 2]
        """
        if not 1 <= self.ndim <= 2:
            raise MultinomialError(f"multinomial needs 1-d or 2-d weights, got shape {self.shape}")
        if num_samples < 1:
            raise MultinomialError(f"multinomial needs num_samples >= 1, got {num_samples}")
        cats = self.shape[-1]
        if not replacement and num_samples > cats:
            raise MultinomialError(
                f"cannot draw {num_samples} samples without replacement from {cats} categories; "
                "pass replacement=True or draw fewer"
            )
        w = (self._t().reshape(1, cats) if self.ndim == 1 else self._t()).cast(
            dtypes.float64 if self.dtype == dtypes.float64 else dtypes.float32
        )
        rows = w.shape[0]
        tc = self._tensor_cls()
        upper = tc.arange(cats, device=self.device).reshape(cats, 1) <= tc.arange(cats, device=self.device)
        cat_ids = tc.arange(cats, device=self.device, dtype=dtypes.int32)
        draws = 1 if replacement else num_samples
        per_draw = num_samples if replacement else 1
        picks = []
        for _ in range(draws):
            # cdf[r, j] = sum of w[r, :j+1] / sum of w[r] (a masked sum: O(cats^2), fused); the last entry is
            # exactly 1 and u < 1, so zero-weight categories (equal cdf steps) are never drawn
            cdf = (w.reshape(rows, cats, 1) * upper.cast(w.dtype)).sum(1)
            cdf = cdf / cdf.shrink(((0, rows), (cats - 1, cats)))
            u = tc.rand(rows, per_draw, 1, device=self.device, dtype=w.dtype)
            pick = (u >= cdf.reshape(rows, 1, cats)).cast(dtypes.int32).sum(2).contiguous()
            picks.append(pick)
            if not replacement:  # realized, so the next draw does not recompute the earlier ones
                w = (cat_ids.reshape(1, cats) == pick).where(0.0, w).contiguous()
        out = picks[0]
        for i, pick in enumerate(picks[1:], start=1):  # stack the draws along axis 1
            out = out.pad(((0, 0), (0, 1))) + pick.pad(((0, 0), (i, 0)))
        return (out.reshape(num_samples) if self.ndim == 1 else out).cast(dtypes.default_int)

    def dropout(self, p: float = 0.5) -> Tensor:
        """In training (`Context(TRAINING=1)`), zero each element with probability `p` and scale the rest by
        `1 / (1 - p)`; the identity otherwise. The gradient flows through the kept elements, scaled the same.

        >>> from xgrad.helpers import Context
        >>> x = Tensor.ones(4)
        >>> x.dropout(0.5).tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> with Context(TRAINING=1):
        ...     sorted(set(x.dropout(0.5).tolist())) in ([0.0, 2.0], [0.0], [2.0])
        True
        """
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout probability must be in [0, 1], got {p}")
        if not TRAINING or p == 0:
            return self._t()
        if p == 1:
            return self._t().zeros_like()
        keep = self._tensor_cls().rand(*self.shape, device=self.device, contiguous=False) >= p
        return keep.where(self._t(), 0) * (1.0 / (1.0 - p))
