"""The rendered-program disk cache: a kernel AST that was lowered before, in any process, skips the codegen passes.

A new process otherwise runs every pass again for every kernel (the demo's first training steps: ~4 s of Python
before the C compiler's own cache answers). One file per program under `<cache dir>/programs/`: the rendered source
and its `ProgramInfo`, pickled. The key hashes what the lowering depends on: the AST's printed form, the optimizer
actions (None: the heuristic), the device type and target, every knob declared to change generated code or its
build (`knobs_key(CODEGEN | COMPILE)`), and the sources of `xgrad_codegen`, of `xgrad` (the IR and its simplifier)
and of the device's renderer module. `CACHELEVEL=0` neither reads nor writes it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import pathlib
import pickle
import sys
from typing import Any

import xgrad.helpers as core_helpers  # its folder is the core package's
from xgrad.buffer import ProgramInfo
from xgrad.helpers import Effect, cache_dir, knobs_key, write_atomic
from xgrad.uop.ops import UOp

CACHE_VERSION = 1


@functools.cache
def codegen_sources_hash() -> str:
    """A hash of this package's sources and of xgrad core's (the IR, its simplifier and dtypes live there): a change
    to any pass may change what it renders."""
    h = hashlib.sha256()
    for root in (pathlib.Path(__file__).parent, pathlib.Path(core_helpers.__file__).parent):
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.cache
def module_hash(module: str) -> str:
    path = getattr(sys.modules.get(module), "__file__", None)
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() if path else module


def program_key(ast: UOp, opts: Any, device_type: str, target: str, renderer_module: str) -> str:
    parts = (
        f"program v{CACHE_VERSION}",
        repr(ast),
        repr(opts),
        device_type,
        target,
        knobs_key(Effect.CODEGEN | Effect.COMPILE),
        codegen_sources_hash(),
        module_hash(renderer_module),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _path(key: str) -> pathlib.Path:
    return cache_dir() / "programs" / f"{key}.pkl"


def load_program(key: str) -> tuple[str, ProgramInfo] | None:
    """(source, info) stored under `key`, or None (missing or unreadable: the caller lowers the AST again)."""
    try:
        src, info = pickle.loads(_path(key).read_bytes())
    except Exception:  # a missing, truncated or foreign file is a miss, never an error
        return None
    return (src, info) if isinstance(src, str) and isinstance(info, ProgramInfo) else None


def store_program(key: str, src: str, info: ProgramInfo) -> None:
    with contextlib.suppress(OSError, pickle.PicklingError):  # unwritten, the program is lowered again next time
        write_atomic(_path(key), pickle.dumps((src, info)))


__all__ = ["codegen_sources_hash", "load_program", "module_hash", "program_key", "store_program"]
