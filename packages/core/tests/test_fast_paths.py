"""The engine's fast paths give the same answers as the general ones: TinyJit's plain-buffer replay, the schedule cache
key, the realize's reuse of a repeated graph's scan, the shared simplify memo and the hash-consing cache of UOps."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

import xgrad.engine.realize as realize
import xgrad.uop.ops as ops
from xgrad import TinyJit
from xgrad.buffer import HostVisible, host_visible
from xgrad.device import Device
from xgrad.dtype import dtypes
from xgrad.engine.schedule_cache import GraphScan, scan_graph
from xgrad.errors import JitError
from xgrad.helpers import Context
from xgrad.nn.optim import SGD
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import graph_rewrite
from xgrad.uop.symbolic import pm_simplify, simplify

rng = np.random.default_rng(11)


def data(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_jit_replay_reads_reshaped_inputs_fast_path(xgrad_device):
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * b + 1).realize()

    for _ in range(4):
        x, y = data(2, 6), data(2, 6)
        a = Tensor(x.reshape(12), device=xgrad_device).realize().reshape(2, 6)
        out = f(a, Tensor(y, device=xgrad_device).realize())
        np.testing.assert_allclose(out.numpy(), x * y + 1, rtol=1e-5, atol=1e-6)


def test_jit_replay_falls_back_to_checks_when_input_is_a_view(xgrad_device):
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a + 1).realize()

    for _ in range(3):
        f(Tensor(data(4), device=xgrad_device).realize())
    view = Tensor(data(8), device=xgrad_device).realize().shrink(((0, 4),))
    with pytest.raises(JitError, match="input 0 changed view"):
        f(view)
    with pytest.raises(JitError, match="input 0 changed shape"):
        f(Tensor(data(5), device=xgrad_device).realize())


def test_jit_replay_with_the_last_calls_inputs_reads_their_current_contents(xgrad_device):
    # the same input tensors call after call (parameters, optimizer states) take the replay's shortest path, which
    # reuses the last call's buffer handles: values written into those buffers in between must be read
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * b + 1).realize()

    x, y = data(8), data(8)
    a, b = Tensor(x, device=xgrad_device).realize(), Tensor(y, device=xgrad_device).realize()
    for step in range(5):
        np.testing.assert_allclose(f(a, b).numpy(), x * y + 1, rtol=1e-5, atol=1e-6)
        x = x + step + 1
        a.assign(Tensor(x, device=xgrad_device)).realize()  # written in place: the same buffer, new contents
    assert f._last is not None  # the handles were reused (the path under test was taken)
    other = data(8)  # a new tensor in a's place is checked and read, not the last call's buffer
    np.testing.assert_allclose(f(Tensor(other, device=xgrad_device).realize(), b).numpy(), other * y + 1, rtol=1e-5)


def test_jit_replay_never_reuses_the_handles_of_a_dropped_input(xgrad_device):
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a * 2).realize()

    for _ in range(3):
        a = Tensor(data(16), device=xgrad_device).realize()
        f(a)
        f(a)
    assert f._last is not None  # the same input twice: its handle kept for the next replay
    del a
    gc.collect()  # a's buffer is freed; a new tensor may get its memory or its UOp's id, never its stale handle
    assert f._last is None  # and the kept handle went with it (it would hold the freed input's memory)
    for _ in range(3):
        x = data(16)
        np.testing.assert_allclose(f(Tensor(x, device=xgrad_device).realize()).numpy(), x * 2, rtol=1e-6)


def test_jit_output_passed_back_in_is_copied_even_after_a_same_input_replay(xgrad_device):
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a + 1).realize()

    a = Tensor(np.zeros(4, np.float32), device=xgrad_device).realize()
    for _ in range(3):
        f(a)
    out = f(a)  # the replay's output buffer
    for k in range(2, 5):  # fed back: each replay reads its input before overwriting the buffer it came from
        out = f(out)
        np.testing.assert_array_equal(out.numpy(), np.full(4, k, np.float32))


def test_schedule_cache_key_keeps_negative_zero_and_int_constants_apart():
    x = Tensor(np.ones(4, np.float32)).realize()
    keys = [scan_graph(UOp(Ops.SINK, dtypes.void, (t.uop,)))[0] for t in (x * 0.0, x * -0.0, x * 1.0, x * 2.0)]
    assert len(set(keys)) == 4
    k = Tensor(np.ones(4, np.int32)).realize()
    assert (
        scan_graph(UOp(Ops.SINK, dtypes.void, ((k + 1).uop,)))[0]
        != scan_graph(UOp(Ops.SINK, dtypes.void, ((k + True).uop,)))[0]
        or (k + 1).uop is (k + True).uop
    )


def test_schedule_cache_key_ignores_which_buffers_are_read():
    a, b = Tensor(data(3, 5)).realize(), Tensor(data(3, 5)).realize()
    key_a, inputs_a = scan_graph(UOp(Ops.SINK, dtypes.void, ((a * 2).uop,)))[:2]
    key_b, inputs_b = scan_graph(UOp(Ops.SINK, dtypes.void, ((b * 2).uop,)))[:2]
    assert key_a == key_b and inputs_a != inputs_b


def test_schedule_cache_hit_binds_the_new_buffers(xgrad_device):
    for _ in range(3):  # same structure each time: the later calls reuse the first schedule
        x, y = data(3, 5), data(5, 2)
        out = Tensor(x, device=xgrad_device) @ Tensor(y, device=xgrad_device)
        np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-5, atol=1e-6)


def test_simplify_with_shared_memo_matches_a_fresh_rewrite():
    r = UOp.range(16, 0)
    v = UOp.range(8, 1)
    exprs = [(r * 4 + 3) // 4, (r * 4 + 3) % 4, (r + v * 16) // 16, ((r + 1) * 2 - r * 2), (v * 3 + r).lt(200)]
    for e in exprs:
        once = simplify(e)
        assert simplify(e) is once
        assert graph_rewrite(e, pm_simplify, name="fresh symbolic") is once


def test_uop_cache_returns_the_live_node_and_forgets_dead_ones():
    a = UOp(Ops.CONST, dtypes.int32, (), 123457)
    assert UOp(Ops.CONST, dtypes.int32, (), 123457) is a
    assert UOp(Ops.CONST, dtypes.float32, (), 123457.0) is not a
    neg, pos = UOp(Ops.CONST, dtypes.float32, (), -0.0), UOp(Ops.CONST, dtypes.float32, (), 0.0)
    assert neg is not pos
    key_count = len(type(a).__class__._cache) if hasattr(type(a).__class__, "_cache") else None
    del a
    gc.collect()
    b = UOp(Ops.CONST, dtypes.int32, (), 123457)
    assert b.arg == 123457 and b.dtype == dtypes.int32
    assert key_count is None or len(type(b).__class__._cache) <= key_count


def test_a_pickled_dtype_is_the_interned_dtype_in_another_process():
    """DTypes are interned and hash by identity: a pickle made in one process must load as that process's own dtype
    object (a copy would miss every dict keyed by dtypes, and compare unequal)."""
    import pickle
    import subprocess
    import sys

    blob = pickle.dumps([dtypes.float32, dtypes.int8.vec(4)])
    code = (
        "import pickle, sys\n"
        "from xgrad.dtype import dtypes\n"
        "f32, v = pickle.loads(sys.stdin.buffer.read())\n"
        "print({dtypes.float32: 'ok'}.get(f32), {dtypes.int8.vec(4): 'ok'}.get(v), f32 is dtypes.float32)\n"
    )
    env_seed = {"PYTHONHASHSEED": "12345"}
    import os

    out = subprocess.run(
        [sys.executable, "-c", code], input=blob, capture_output=True, env={**os.environ, **env_seed}, check=True
    )
    assert out.stdout.decode().split() == ["ok", "ok", "True"]


def test_dtype_equality_and_promotion_fast_paths_agree_with_the_lattice():
    from xgrad.dtype import least_upper_dtype
    from xgrad.helpers import Context

    assert least_upper_dtype(dtypes.float16, dtypes.float16) is dtypes.float16
    assert least_upper_dtype(dtypes.weakint, dtypes.weakint) == dtypes.weakint
    assert least_upper_dtype(dtypes.int8, dtypes.uint8) == dtypes.int16
    # the cached lattice join must not cache the knob-dependent default dtypes
    with Context(DEFAULT_FLOAT="float16"):
        assert least_upper_dtype(dtypes.int32, dtypes.weakfloat) == dtypes.float16
    assert least_upper_dtype(dtypes.int32, dtypes.weakfloat) == dtypes.float32
    assert dtypes.float32.vec(4) == dtypes.float32.vec(4) and dtypes.float32 != dtypes.int32


def test_shapes_are_plain_ints_whatever_the_caller_passed():
    t = Tensor.zeros(6).reshape(np.int64(2), np.int32(3)).pad(((np.int64(1), 0), (0, 0)))
    assert t.shape == (3, 3) and all(type(s) is int for s in t.shape)


@pytest.mark.parametrize("calls", [1, 3])  # the first call schedules, later ones hit the schedule cache
def test_a_dropped_result_frees_its_buffer_without_the_cyclic_gc(calls):
    """Reference counting alone must free a realized result's buffer, so the allocator reuses it on the next call;
    a reference cycle (e.g. a recursive closure in the schedule cache) held it until the GC ran, and every call then
    mapped fresh memory."""
    import weakref

    from xgrad.engine.schedule import buffer_of

    a, b = Tensor(np.ones((8, 8), np.float32)).realize(), Tensor(np.ones((8, 8), np.float32) * 3).realize()
    gc.collect()
    gc.disable()
    try:
        for _ in range(calls):
            out = (a @ b + 7).realize()
            assert out.numpy()[0, 0] == 31
            ref = weakref.ref(buffer_of(out.uop))
            del out
            assert ref() is None
    finally:
        gc.enable()


def _without_schedule_cache(fn):
    with Context(SCACHE=0):  # every realize runs the scheduler itself
        return fn()


def _input_freed_after(step) -> bool:
    """Whether a dropped input's buffer is freed (by reference counting alone) once `step(x)` has run on it and one
    more realize has happened (the engine keeps the latest realize's graph until the next one)."""
    import weakref

    from xgrad.engine.schedule import buffer_of

    x = Tensor(np.arange(64, dtype=np.float32))
    ref = weakref.ref(buffer_of(x.uop))
    step(x)
    del x
    Tensor(np.ones(3, np.float32)).add(1).realize()  # some other realize
    return ref() is None


@pytest.mark.parametrize(
    "step",
    [
        lambda x: (x * 2).sum().realize(),  # a cached realize: the realize's walk held the graph in a cycle
        lambda x: [(x * 3).realize(), (x + 1).realize()],
        lambda x: ((x * 2).sum(), (x + 5).realize()),  # a lazy tensor of x walked by the other realize
        lambda x: ((x * 2).sum() * Tensor(np.ones(64, np.float32)).is_param_()).sum().backward(),  # compute_gradient
        lambda x: Tensor(np.zeros(64, np.float32)).realize().__setitem__(slice(None), x * 2),  # a write's checks
        lambda x: (x.shard(("CPU", "CPU:1"), 0) * 2).realize(),  # the per-device graph's schedule-cache walk
        # the scheduler's own walks (a schedule-cache miss each time)
        lambda x: _without_schedule_cache(lambda: x.reshape(8, 8).softmax(1).argmax(0).realize()),
    ],
    ids=["sum", "twice", "lazy-other", "backward", "setitem", "multi-device", "scheduler"],
)
def test_a_dropped_input_buffer_is_freed_without_the_cyclic_gc(step):
    """The cached `toposort` of a node holds the node itself: a walk cached on a graph the engine drops (the realize's
    SINK, a loss that backward walked, another lazy tensor a realize looked through) kept that graph and every
    buffer it reads until the cyclic GC ran; a loop over 16 MB inputs grew the process by over 400 MB."""
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):  # the second time hits the schedule cache
            assert _input_freed_after(step)
    finally:
        gc.enable()


MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
]


@pytest.mark.parametrize("xs,ws", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_matmul_builds_the_graph_of_its_tensor_definition(xs, ws, dtype):
    """`a @ b` of same-dtype operands builds its nodes directly (`reduce._matmul_uop`); the graph must be the very
    node the Tensor definition (reshape, transpose, broadcast multiply, sum) gives, and match numpy."""
    rng = np.random.default_rng(0)
    x, w = (rng.integers(-3, 4, s).astype(dtype) for s in (xs, ws))
    a, b = Tensor(x), Tensor(w)
    k = -min(len(ws), 2)
    defined = (
        a.reshape(xs[:-1] + (1,) * min(len(ws) - 1, 1) + xs[-1:])
        * b.reshape(ws[:-2] + (1,) * min(len(xs) - 1, 1) + ws[k:]).transpose(-1, k)
    ).sum(-1)
    got = a @ b
    assert got.dtype == defined.cast(a.dtype).dtype
    assert got.uop is defined.cast(a.dtype).uop
    np.testing.assert_array_equal(got.numpy(), np.matmul(x, w))


def test_a_realize_walks_only_the_tensors_that_may_still_be_lazy():
    """Realized tensors (parameters, data) leave `lazy_tensors`, so a realize does not walk them; a tensor whose node
    is set to a lazy graph later (as `load_state_dict` or `assign` do) joins again and still gets the buffers of the
    nodes a later realize computes."""
    from xgrad.engine.realize import lazy_tensors

    params = [Tensor(np.full((4,), i, np.float32)).realize() for i in range(3)]
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    d = x + 1
    assert d in lazy_tensors and not any(p in lazy_tensors for p in params)
    c = Tensor(np.zeros(4, np.float32)).realize()
    (x * 3).realize()  # a realize in between: settled tensors are gone from the set
    assert c not in lazy_tensors
    c.uop = (d * 2).uop  # lazy again, set directly
    assert c in lazy_tensors
    d.realize()
    assert d not in lazy_tensors
    assert d.uop.base.op is Ops.BUFFER and d.uop.base in c.uop.toposort  # c reads d's buffer, does not recompute it
    np.testing.assert_array_equal(c.numpy(), (np.arange(4) + 1) * 2)


def test_a_buffer_is_freed_by_the_allocator_that_allocated_it(monkeypatch):
    """A buffer remembers its allocator: freeing it looks up no device (the registry may have been rebuilt, or the
    device be gone, by then) and the memory goes back to the pool it came from."""
    from xgrad.buffer import Buffer

    buf = Buffer("CPU", 1 << 12, dtypes.float32).ensure_allocated()
    alloc = buf.allocator
    before = alloc.cached_bytes
    monkeypatch.setattr(Buffer, "_runtime", lambda self: pytest.fail("freeing a buffer looked its device up"))
    del buf
    assert alloc.cached_bytes == before + (1 << 14)


def test_graph_scan_finds_assigns_symbolic_shapes_and_multi_device_nodes():
    def facts(*ts: Tensor) -> tuple[bool, bool, bool]:
        scan = scan_graph(UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in ts)))
        return scan.assigns, scan.symbolic, scan.multi

    x = Tensor(np.ones((4, 4), np.float32)).realize()
    assert facts(x @ x + 1) == (False, False, False)
    assert facts(x.assign(x + 1)) == (True, False, False)
    n = UOp.variable("n", 1, 4).bind(3)
    assert facts(Tensor.ones(4).shrink(((0, n),)) * 2) == (False, True, False)
    assert facts(Tensor.ones(4, 4).shard(("CPU", "CPU:1"), axis=0) + 1) == (False, False, True)


def test_a_scan_extended_from_its_first_sources_scan_is_the_whole_walks_scan():
    # a realize that assigns scans its roots, then those with the lazy tensors reading the assigned buffers, from the
    # first scan: rows, inputs and facts must be what a whole walk gives (they are the schedule cache's key)
    x = Tensor(np.ones(8, np.float32)).realize()
    y, z = Tensor(data(8)).realize(), Tensor(data(8)).realize()
    update = x.assign(x * 0.5 + y)
    reader = (x * 2.5 + z).sum() + (y * -0.0).max()  # reads x, and a buffer (z) the update does not
    small = UOp(Ops.SINK, dtypes.void, (update.uop,))
    big = UOp(Ops.SINK, dtypes.void, (update.uop, reader.uop))
    whole = scan_graph(big)
    assert list(big.toposort) == list(big.toposort_into({}))
    extended = scan_graph(big, (small, scan_graph(small)))
    assert extended.rows == whole.rows and len(extended.rows) > len(scan_graph(small).rows)
    assert extended.inputs == whole.inputs and z.uop.base in extended.inputs
    assert (extended.assigns, extended.symbolic, extended.multi) == (True, False, False)
    with pytest.raises(AssertionError, match="smaller SINK"):
        scan_graph(UOp(Ops.SINK, dtypes.void, (reader.uop, update.uop)), (small, scan_graph(small)))


@pytest.fixture
def scans(monkeypatch) -> list[UOp]:
    """The SINKs the engine scans from now on (realize's `scan_graph`, counted)."""
    seen: list[UOp] = []

    def counting_scan(sink: UOp, smaller: tuple[UOp, GraphScan] | None = None) -> GraphScan:
        seen.append(sink)
        return scan_graph(sink, smaller)

    monkeypatch.setattr(realize, "scan_graph", counting_scan)
    return seen


def test_the_same_graph_realized_again_reuses_its_scan_and_reads_the_new_contents(xgrad_device, scans):
    x, y = data(8, 8), data(8, 8)
    a, b = Tensor(x, device=xgrad_device).realize(), Tensor(y, device=xgrad_device).realize()
    for _ in range(3):
        np.testing.assert_allclose((a @ b).realize().numpy(), x @ y, rtol=1e-4, atol=1e-5)
    assert len(scans) == 1  # the later realizes of the same (hash-consed) SINK reuse the first one's scan
    x = x + 1
    a.assign(Tensor(x, device=xgrad_device)).realize()  # the same buffer with new contents
    np.testing.assert_allclose((a @ b).realize().numpy(), x @ y, rtol=1e-4, atol=1e-5)
    assert len(scans) == 3  # the assign, then the matmul again: another graph was realized in between


def test_a_repeated_training_step_reuses_both_scans_of_its_update(scans):
    # an optimizer step scans the SINK of the update, then (it assigns) a larger one with the lazy loss that reads the
    # parameters; the next step builds the same two SINKs and reuses both scans. The values follow torch's SGD.
    x0, w0 = data(4, 3), data(3, 2)
    x, w = Tensor(x0, requires_grad=False), Tensor(w0).is_param_()
    opt = SGD([w], lr=0.1)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    for step in range(3):
        opt.zero_grad()
        loss = (x @ w).square().mean()
        loss.backward()
        with Context(TRAINING=1):
            opt.step()  # realizes the loss with it: it reads w from before the update
        topt.zero_grad()
        tloss = (torch.tensor(x0) @ tw).square().mean()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
        if step == 0:
            first = len(scans)
    assert first == 2 and len(scans) == 2  # the update, then the update with the loss; none in the later steps


def test_host_visible_agrees_with_the_protocol_isinstance():
    class Mapped:
        def as_memoryview(self, handle: object) -> memoryview:
            return memoryview(b"")

    class Opaque:
        pass

    for alloc in (Device["CPU"].allocator, Mapped(), Opaque(), Mapped(), Opaque()):  # the second time: remembered
        assert host_visible(alloc) == isinstance(alloc, HostVisible)


def test_a_new_buffer_node_knows_the_shape_and_device_its_rules_give(xgrad_device):
    out = (Tensor(data(3, 5), device=xgrad_device) @ Tensor(data(5, 2), device=xgrad_device)).realize()
    buf = out.uop.base
    assert buf.op is Ops.BUFFER
    for name in ("shape", "device"):  # set when the node was made; the cached properties' own rules agree
        assert getattr(buf, name) == vars(UOp)[name].func(buf)


def test_live_set_holds_members_weakly_by_identity():
    from xgrad.engine.realize import LiveSet

    class Member:
        def __eq__(self, other: object) -> bool:  # like Tensor: == is not identity
            raise AssertionError("a LiveSet must not compare members")

        __hash__ = object.__hash__

    live = LiveSet()
    a, b = Member(), Member()
    live.add(a)
    live.add(b)
    live.add(a)
    assert a in live and b in live and len(live.members()) == 2
    live.discard(b)
    assert b not in live and [id(m) for m in live.members()] == [id(a)]
    live.add(b)
    del a  # reference counting alone drops it: no cyclic GC needed
    assert [id(m) for m in live.members()] == [id(b)]
    del b
    assert live.members() == []


def test_remembered_constants_keep_the_sign_of_zero_and_skip_nan():
    # UOp.const remembers its answers by value: -0.0 == 0.0 (one hash) must still give its own constant
    x = np.array([1.0, -2.0, 3.0], np.float32)
    t = Tensor(x)
    for value in (0.0, -0.0, 0.0, math.nan, math.nan, 2, 2.0, True):
        want = x * np.float32(value)
        got = (t * value).numpy()
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want)), value
    assert all(k[2] == k[2] for k in ops._CONSTS)  # no NaN kept


def test_remembered_constants_stay_bounded(monkeypatch):
    monkeypatch.setattr(ops, "_CONSTS_KEPT", 8)
    for i in range(50):
        assert UOp.const(dtypes.float32, float(i), "CPU", (2,)).src[0].src[0].arg == float(i)
    assert len(ops._CONSTS) <= 8


def test_a_scalar_operand_joins_no_live_set(monkeypatch):
    # `x * 2` makes one Tensor the user sees; the broadcast 2 is consumed at once and costs no bookkeeping
    x = Tensor(data(4)).realize()
    added: list[object] = []
    add = realize.LiveSet.add
    monkeypatch.setattr(realize.LiveSet, "add", lambda self, t: (added.append(t), add(self, t))[1])
    y = x * 2
    assert added and all(t is y for t in added)  # only the result joins (all tensors, lazy tensors)
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2)
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2)
