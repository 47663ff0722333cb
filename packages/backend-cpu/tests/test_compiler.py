import multiprocessing
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from xgrad.errors import CompileError, XgradError
from xgrad.helpers import Context
from xgrad_cpu.compiler import CCompiler, CompilerNotFoundError
from xgrad_cpu.plugin import COMPILER_CANDIDATES

SRC = "void k(void** restrict bufs, const int* restrict vars, int start, int end) { ((int*)bufs[0])[0] = 42; }\n"


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path: Path) -> Iterator[Path]:
    with Context(XGRAD_CACHE_DIR=str(tmp_path)):
        yield tmp_path


def cached_files(root: Path) -> list[Path]:
    folder = root / "cpu"
    return sorted(folder.glob("*.so")) if folder.exists() else []


def test_compile_returns_elf_shared_object_default_compiler() -> None:
    lib = CCompiler().compile(SRC)
    assert lib[:4] == b"\x7fELF"


def test_compiler_picks_first_candidate_on_path_when_cc_unset() -> None:
    with Context(CC=""):
        expected = next(path for name in COMPILER_CANDIDATES if (path := shutil.which(name)) is not None)
        assert CCompiler().cmd == [expected]


def test_compiler_uses_cc_knob_when_set() -> None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no gcc/cc on PATH")
    with Context(CC=gcc):
        assert CCompiler().cmd == [gcc]


def test_name_has_family_and_major_version_any_compiler() -> None:
    c = CCompiler()
    assert re.fullmatch(r"(gcc|clang)-\d+", c.name), c.name


def test_compile_hits_disk_cache_second_time() -> None:
    c = CCompiler()
    first = c.compile(SRC)
    second = c.compile(SRC)
    assert c.compiles == 1
    assert first == second
    fresh = CCompiler()  # a new instance (as in a new process) must find it on disk
    assert fresh.compile(SRC) == first
    assert fresh.compiles == 0


def test_compile_stores_binary_under_cache_dir_cpu(cache_in_tmp: Path) -> None:
    c = CCompiler()
    lib = c.compile(SRC)
    path = cache_in_tmp / "cpu" / f"{c.cache_key(SRC)}.so"
    assert path.read_bytes() == lib


def test_compile_bypasses_disk_cache_when_cachelevel_0(cache_in_tmp: Path) -> None:
    c = CCompiler()
    with Context(CACHELEVEL=0):
        c.compile(SRC)
        c.compile(SRC)
    assert c.compiles == 2
    assert cached_files(cache_in_tmp) == []


def test_cache_key_changes_with_source_flags_and_codegen_knobs() -> None:
    c = CCompiler()
    key = c.cache_key(SRC)
    assert key == CCompiler().cache_key(SRC)
    assert key != c.cache_key(SRC + "\n")
    assert key != CCompiler(extra_flags=("-DX=1",)).cache_key(SRC)
    with Context(NOOPT=1):
        assert key != c.cache_key(SRC)


def test_compile_raises_compile_error_with_source_and_log_on_syntax_error() -> None:
    bad = "void k(void** bufs, const int* vars, int start, int end) { int x = ; }\n"
    c = CCompiler()
    with pytest.raises(CompileError) as info:
        c.compile(bad)
    err = info.value
    assert err.source == bad
    assert "error" in err.log
    assert "kernel.c" in err.log  # the compiler's message names the file and line
    assert bad in str(err) and err.log in str(err)


def test_compile_error_is_not_cached() -> None:
    bad = "this is not C\n"
    c = CCompiler()
    for _ in range(2):
        with pytest.raises(CompileError):
            c.compile(bad)
    assert c.compiles == 2


def test_missing_compiler_raises_install_hint_when_cc_not_found() -> None:
    with Context(CC="/nonexistent/xgrad-cc"), pytest.raises(CompilerNotFoundError) as info:
        CCompiler()
    assert isinstance(info.value, XgradError)
    assert "CC" in str(info.value)


def test_missing_compiler_raises_install_hint_when_none_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with Context(CC=""), pytest.raises(CompilerNotFoundError) as info:
        CCompiler()
    msg = str(info.value)
    assert "gcc" in msg and "clang" in msg and "CC" in msg


def _compile_in_child(cache: str) -> bytes:
    with Context(XGRAD_CACHE_DIR=cache):
        return CCompiler().compile(SRC + "/* parallel */\n")


def test_compile_cache_consistent_when_processes_race(cache_in_tmp: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        libs = pool.map(_compile_in_child, [str(cache_in_tmp)] * 8)
    assert all(lib == libs[0] for lib in libs)
    assert len(cached_files(cache_in_tmp)) == 1
    assert list((cache_in_tmp / "cpu").glob("*.tmp")) == []
