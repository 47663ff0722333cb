"""The package needs nothing from core or codegen that a third-party backend could not use: it imports only the
public plugin, device and renderer API (checked on the source with `ast`, so a new private import fails here)."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "xgrad_webgpu"

# xgrad modules a backend may use, and why each is public API for backends
ALLOWED = {
    "xgrad.plugin": "the hookspecs and the spec dataclasses",
    "xgrad.buffer": "the device protocols (Allocator, Program, ProgramInfo)",
    "xgrad.errors": "the error types a backend raises (CompileError, DeviceError, DTypeError)",
    "xgrad.dtype": "dtypes a renderer maps to types",
    "xgrad.uop.ops": "the IR a renderer reads (UOp, Ops, AxisType)",
    "xgrad.uop.pattern": "PatternMatcher tables: a renderer's legalisation pass",
    "xgrad_codegen.device": "CompiledDevice, the base of compiling devices",
    "xgrad_codegen.renderer": "the renderer bases (CStyleRenderer) and their rule tables",
}


def imported_modules() -> dict[str, set[str]]:
    """Every xgrad/xgrad_codegen module the package's source imports -> the names taken from it."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    found.setdefault(a.name, set())
    return {m: names for m, names in found.items() if m.split(".")[0] in ("xgrad", "xgrad_codegen")}


def test_package_imports_only_the_public_backend_api() -> None:
    modules = imported_modules()
    assert modules, "the scan found no xgrad imports: is SRC right?"
    private = sorted(set(modules) - set(ALLOWED))
    assert not private, f"xgrad_webgpu imports modules outside the backend API: {private}"
    underscored = sorted(f"{m}.{n}" for m, names in modules.items() for n in names if n.startswith("_"))
    assert not underscored, f"xgrad_webgpu imports private names: {underscored}"


def test_package_imports_no_other_backend() -> None:
    tops = set()
    for path in SRC.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                tops.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                tops.update(a.name.split(".")[0] for a in node.names)
    backends = {t for t in tops if t.startswith("xgrad_") and t not in ("xgrad_codegen", "xgrad_webgpu")}
    assert not backends, f"a backend never imports another backend: {sorted(backends)}"
