"""tinygrad's TinyJit surface on xgrad: `prune=`, `.captured`, the errors for non-Tensor outputs and for a function
that runs no kernel, outputs fed back as inputs, several outputs of one intermediate, keyword arguments in any order.
Every value is checked against numpy computing the same steps."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, TinyJit, dtypes
from xgrad.engine.jit import CapturedJit
from xgrad.errors import JitError

rng = np.random.default_rng(21)


def data(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_prune_replays_only_the_kernels_that_depend_on_inputs() -> None:
    w_np = data(16)
    weights = Tensor(w_np).realize()

    def w2(x: Tensor) -> Tensor:
        return ((weights * 2).contiguous() + x).realize()

    plain, pruned = TinyJit(w2), TinyJit(w2, prune=True)
    for f in (plain, pruned):
        for _ in range(4):
            a = data(16)
            np.testing.assert_allclose(f(Tensor(a).realize()).numpy(), w_np * 2 + a, rtol=1e-6)
    assert plain.captured is not None and pruned.captured is not None
    assert len(plain.captured.linear.src) == 2 and len(pruned.captured.linear.src) == 1


def test_prune_as_a_decorator_with_a_chain_of_input_free_kernels() -> None:
    w_np = data(8)
    weights = Tensor(w_np).realize()

    @TinyJit(prune=True)
    def f(x: Tensor) -> Tensor:
        c = (weights.exp() + 1).contiguous().realize()  # input-free: computed once, at the capture
        d = (c * 3).contiguous().realize()  # input-free too
        return (d - x).sum().realize()

    for _ in range(4):
        a = data(8)
        np.testing.assert_allclose(f(Tensor(a).realize()).item(), ((np.exp(w_np) + 1) * 3 - a).sum(), rtol=1e-5)
    assert f.captured is not None and len(f.captured.linear.src) == 1


def test_captured_is_none_before_the_capture_and_holds_it_after() -> None:
    f = TinyJit(lambda a, b: (a * b + 1).realize())
    assert f.captured is None
    for i in range(3):
        out = f(Tensor([1.0, 2.0]).realize(), b=Tensor([float(i), 1.0]).realize())
        assert (f.captured is None) == (i < 1)
    cap = f.captured
    assert isinstance(cap, CapturedJit)
    assert cap.ret is out and cap.expected_names == (0, "b") and len(cap.expected_input_info) == 2
    assert out.tolist() == [3.0, 3.0]


def test_a_non_tensor_output_raises_at_the_capture() -> None:
    @TinyJit
    def f(x: Tensor, mult: int) -> tuple[Tensor, int]:
        return (x * 2).realize(), mult * 10

    f(Tensor([1.0]).realize(), 1)  # the first call only runs
    with pytest.raises(JitError, match="int") as info:
        f(Tensor([2.0]).realize(), 2)
    assert isinstance(info.value, RuntimeError)


def test_nested_containers_and_none_are_valid_outputs_and_are_realized() -> None:
    @TinyJit
    def f(x: Tensor) -> dict[str, object]:
        return {"out": [x + 1, (x * 3,)], "nothing": None}

    for i in range(4):
        got = f(Tensor([float(i)]).realize())
        assert got["nothing"] is None
        out = got["out"]
        assert isinstance(out, list)
        assert out[0].tolist() == [i + 1.0] and out[1][0].tolist() == [3.0 * i]


def test_a_function_that_runs_no_kernel_raises() -> None:
    f = TinyJit(lambda x: x)
    f(Tensor([1.0]).realize())
    with pytest.raises(JitError, match="didn't JIT anything"):
        f(Tensor([2.0]).realize())


def test_outputs_fed_back_as_inputs() -> None:
    # the LLM generate pattern: each output is the next input, then a new input starts another run
    @TinyJit
    def step(x: Tensor) -> Tensor:
        y = (x + 1).realize()
        return (y * 2).realize()

    for start in (10, 100):
        x, want = Tensor([start]).contiguous().realize(), start
        for _ in range(5):
            x, want = step(x), (want + 1) * 2
            assert x.item() == want


def test_multiple_outputs_of_one_intermediate_fed_back() -> None:
    @TinyJit
    def f(buf: Tensor, frame: Tensor) -> tuple[Tensor, Tensor]:
        new_buf = buf[1:].cat(frame, dim=0)
        return new_buf.contiguous(), new_buf[:1].contiguous()

    buf_np = np.array([[0], [1], [2]], np.int32)
    buf = Tensor(buf_np).contiguous().realize()
    for i in range(6):
        frame_np = np.array([[10 + i]], np.int32)
        want = np.concatenate([buf_np[1:], frame_np])
        buf, first = f(buf, Tensor(frame_np).contiguous().realize())
        np.testing.assert_array_equal(buf.numpy(), want)
        np.testing.assert_array_equal(first.numpy(), want[:1])
        buf_np = want


def test_keyword_arguments_in_any_order() -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * 2 - b).realize()

    for i in range(6):
        x, y = data(4), data(4)
        xs, ys = Tensor(x).realize(), Tensor(y).realize()
        out = f(a=xs, b=ys) if i % 2 else f(b=ys, a=xs)
        np.testing.assert_allclose(out.numpy(), x * 2 - y, rtol=1e-6)
    with pytest.raises(JitError, match="same way"):  # captured by keyword, now positional
        f(Tensor(data(4)).realize(), Tensor(data(4)).realize())


def test_lazy_inputs_and_tensors_in_lists_are_inputs() -> None:
    @TinyJit
    def f(a: Tensor, arr: list[Tensor]) -> Tensor:
        return (a + arr[0]).realize()

    for i in range(4):
        b = data(3)
        out = f(Tensor([1.0, 1.0, 1.0]) * i, [Tensor(b).realize()])  # a lazy input is realized first
        np.testing.assert_allclose(out.numpy(), i + b, rtol=1e-6)


def test_decorator_form_refuses_anything_but_a_function() -> None:
    with pytest.raises(JitError, match="decorator"):
        TinyJit(prune=True)(Tensor([1.0]), Tensor([2.0]))


def test_a_returned_input_is_the_new_input_on_replay() -> None:
    # tinygrad's `return b.assign(a + 1)`: each call gets back the b it passed, holding a + 1
    f = TinyJit(lambda a, b: b.assign(a + 1))
    for i in range(5):
        a, b = Tensor([i]), Tensor.empty(1, dtype=dtypes.int32)
        c = f(a, b)
        assert c is b and c.item() == i + 1


def test_ported_tinygrad_jit_behaviours() -> None:
    # the warm-up call returns its own buffer, the captured and replayed calls share one (tinygrad's documented
    # output-buffer reuse); a view with another offset than at the capture raises; a nested TinyJit raises the second
    # time (the first run is not a capture)
    foo = TinyJit(lambda x: x.sum().realize())
    results = [foo(Tensor([v, v])) for v in (1, 2, 3)]
    assert [r.item() for r in results] == [2, 6, 6]
    add = TinyJit(lambda a: (a + 1).realize())
    base = Tensor(data(10, 10)).realize()
    with pytest.raises(JitError):
        for i in range(1, 5):
            add(base[:, i : i + 2])
    inner = TinyJit(lambda t: t + 1)
    outer = TinyJit(lambda t: inner(t) * 3)
    assert outer(Tensor([1])).realize().item() == 6
    with pytest.raises(RuntimeError, match="nested"):
        outer(Tensor([2])).realize()
