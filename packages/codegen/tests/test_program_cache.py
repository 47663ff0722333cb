"""The rendered-program disk cache (`xgrad_codegen.program_cache`): a kernel lowered by an earlier process is built
from its stored source without running the codegen passes, runs correctly, and misses on anything that changes the
generated code; CACHELEVEL=0 and unreadable files fall back to lowering."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
from kernel_helpers import data, kernel_asts

from xgrad import Device, Tensor
from xgrad.helpers import Context
from xgrad.uop.ops import UOp
from xgrad_codegen import device as device_module
from xgrad_codegen.program_cache import program_key


@pytest.fixture
def cache_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with Context(XGRAD_CACHE_DIR=str(tmp_path)):
        yield tmp_path / "programs"


def _ast() -> UOp:
    a, b = data(8, 16), data(16, 4, seed=1)
    return next(iter(kernel_asts(lambda: Tensor(a, device="CPU") @ Tensor(b, device="CPU"))))


def _fresh_compile(ast: UOp) -> object:
    """Compile as a new process would: no program in memory."""
    dev = Device["CPU"]
    saved, dev._programs = dev._programs, {}
    try:
        return dev.compile(ast)
    finally:
        dev._programs = saved


def _no_codegen(*args: object, **kwargs: object) -> object:
    raise AssertionError("the codegen passes ran")


def test_a_program_lowered_before_is_built_from_the_disk(cache_dir: pathlib.Path, monkeypatch) -> None:
    ast = _ast()
    first = _fresh_compile(ast)
    assert len(list(cache_dir.glob("*.pkl"))) == 1
    monkeypatch.setattr(device_module, "full_rewrite", _no_codegen)
    second = _fresh_compile(ast)
    assert second.info.src == first.info.src and second.info.ops == first.info.ops  # type: ignore[attr-defined]
    dev = Device["CPU"]
    saved, dev._programs = dev._programs, {}
    try:  # the matmul runs the program built from the stored source
        a, b = data(8, 16), data(16, 4, seed=1)
        np.testing.assert_allclose(
            (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy(), a @ b, rtol=1e-5, atol=1e-5
        )
    finally:
        dev._programs = saved


def test_cachelevel_0_neither_reads_nor_writes(cache_dir: pathlib.Path) -> None:
    with Context(CACHELEVEL=0):
        _fresh_compile(_ast())
    assert not cache_dir.exists() or not list(cache_dir.glob("*.pkl"))


def test_an_unreadable_file_is_a_miss(cache_dir: pathlib.Path) -> None:
    ast = _ast()
    first = _fresh_compile(ast)
    (path,) = cache_dir.glob("*.pkl")
    path.write_bytes(b"not a pickle")
    again = _fresh_compile(ast)  # lowered again, and stored again
    assert again.info.src == first.info.src  # type: ignore[attr-defined]
    assert path.read_bytes() != b"not a pickle"


def test_the_key_changes_with_code_changing_knobs_and_actions() -> None:
    ast = _ast()
    dev = Device["CPU"]
    base = program_key(ast, None, "CPU", dev.target(), "xgrad_cpu.renderer")
    with Context(NOOPT=1):
        assert program_key(ast, None, "CPU", dev.target(), "xgrad_cpu.renderer") != base
    assert program_key(ast, [("UPCAST", 0, 4)], "CPU", dev.target(), "xgrad_cpu.renderer") != base
    assert program_key(ast, None, "CPU", dev.target(), "xgrad_cpu.renderer") == base
