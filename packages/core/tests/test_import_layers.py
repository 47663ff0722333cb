"""The layers of the packages, checked on their imports (read with `ast`; only the cycle check imports, in a child).

Layers, lowest first: the UOp IR (`xgrad.uop`) < the engine (`xgrad.engine`: scheduler, realize) < `Tensor`
(`xgrad.tensor`, `xgrad.mixin`) < what is built on Tensor (`xgrad.nn`, TinyJit and `function` in `xgrad.engine.jit`
and `xgrad.engine.function`). Core reaches codegen and backends only through the plugin registry; a backend uses
core and codegen through their public modules (`BACKEND_API`) and never another backend; the LLM package uses only
the public API (`PUBLIC_API`). Lower layers import the modules they need, never the `xgrad` package root (which hands
out `Tensor`). Core imports at the top of its modules: an import inside a function is allowed only for an optional
third-party dependency, listed in `FUNCTION_LEVEL` with the reason (what must load late loads through the package
root, whose public names are imported on first access). Every core module imports first in a fresh interpreter, so a
module-level import never meets a partially initialised module.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

PACKAGES = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ("xgrad_cpu", "xgrad_nv", "xgrad_amd", "xgrad_webgpu")
# what a backend may import from core and codegen
BACKEND_API = frozenset(
    {
        "xgrad.buffer",
        "xgrad.contract",  # the device protocols (xgrad.buffer re-exports them)
        "xgrad.device",
        "xgrad.dtype",
        "xgrad.errors",
        "xgrad.helpers",
        "xgrad.plugin",
        "xgrad.uop.ops",
        "xgrad.uop.pattern",
        "xgrad.uop.symbolic",
        "xgrad_codegen.device",
        "xgrad_codegen.renderer",
        "xgrad_codegen.legalize",  # renderer building blocks: rewrites for what a language lacks
        "xgrad_codegen.decompose",
        "xgrad_codegen.devmem",  # a GPU's global memory for the backends' emulators
        "xgrad_codegen.pydevice",  # the GPU architecture tables (launch limits, tensor-core layouts) PYTHON emulates
    }
)
# what the LLM package and the torch bridge may import from core
PUBLIC_API = frozenset({"xgrad", "xgrad.dtype", "xgrad.errors", "xgrad.helpers", "xgrad.device", "xgrad.nn"})
# the plugin contract: what a backend is built against; it never reaches Tensor
CONTRACT = frozenset(
    {"xgrad.plugin", "xgrad.buffer", "xgrad.contract", "xgrad.device", "xgrad.builtin_plugin", "xgrad.errors"}
)
# the engine's modules that sit above Tensor: they wrap functions of Tensors
ENGINE_ABOVE_TENSOR = frozenset({"xgrad.engine.jit", "xgrad.engine.function"})

# (module, the optional third-party dependency it imports inside a function) -> why it is not at the top
FUNCTION_LEVEL: dict[tuple[str, str], str] = {
    ("xgrad.testing", "hypothesis"): "an optional dependency (the fuzz tests' settings)",
    ("xgrad.distributed.comm", "mpi4py"): "an optional dependency, and importing it starts MPI: on first collective",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module imported (for `from m import name`: m.name when that is a module, else m)
    line: int
    in_function: bool
    root_name: bool  # `import xgrad` or `from xgrad import <a name that is not a module>`


def module_files() -> dict[str, pathlib.Path]:
    files = {}
    for src in sorted(PACKAGES.glob("*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = path
    return files


FILES = module_files()


def _package(name: str, path: pathlib.Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: pathlib.Path) -> Iterator[Import]:
    """Every import of the module, except those under `if TYPE_CHECKING:` (types only)."""
    tree = ast.parse(path.read_text(), str(path))

    def walk(node: ast.AST, in_function: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (i for b in child.orelse for i in walk(b, in_function))
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(name, alias.name, child.lineno, in_function, alias.name == "xgrad")
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the importing module's package
                    pkg = _package(name, path).split(".")
                    base = ".".join(pkg[: len(pkg) - child.level + 1] + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    is_module = sub in FILES
                    yield Import(
                        name, sub if is_module else base, child.lineno, in_function, base == "xgrad" and not is_module
                    )
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from walk(tree, False)


ALL = [i for name, path in FILES.items() for i in imports_of(name, path)]


def _in(target: str, *prefixes: str) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _where(i: Import) -> str:
    return f"{FILES[i.module].relative_to(PACKAGES)}:{i.line} imports {i.target}"


def violations(rule: str) -> list[str]:
    out = []
    for i in ALL:
        m, t = i.module, i.target
        if (
            rule == "uop below engine"
            and _in(m, "xgrad.uop")
            and _in(t, "xgrad.engine", "xgrad.tensor", "xgrad.mixin", "xgrad.nn")
        ):
            out.append(_where(i))
        elif rule == "engine below tensor" and _in(m, "xgrad.engine") and m not in ENGINE_ABOVE_TENSOR:
            if _in(t, "xgrad.tensor", "xgrad.mixin", "xgrad.nn"):
                out.append(_where(i))
        elif rule == "contract and codegen never reach Tensor" and (m in CONTRACT or _in(m, "xgrad_codegen")):
            if i.root_name or _in(t, "xgrad.tensor", "xgrad.mixin", "xgrad.engine", "xgrad.nn"):
                out.append(_where(i) + (" (the package root)" if i.root_name else ""))
        elif rule == "core reaches codegen and backends only through plugins" and _in(m, "xgrad"):
            if _in(t, "xgrad_codegen", "xgrad_llm", "xgrad_torch", *BACKENDS):
                out.append(_where(i))
        elif rule == "codegen never imports a backend" and _in(m, "xgrad_codegen") and _in(t, *BACKENDS):
            out.append(_where(i))
        elif rule == "backends use the public modules only" and _in(m, *BACKENDS):
            own = m.split(".")[0]
            if _in(t, "xgrad", "xgrad_codegen") and t not in BACKEND_API:
                out.append(_where(i) + " (not in BACKEND_API)")
            elif _in(t, *BACKENDS) and not _in(t, own):
                out.append(_where(i) + " (another backend)")
        elif rule == "llm and the torch bridge use the public API" and _in(m, "xgrad_llm", "xgrad_torch"):
            if _in(t, "xgrad") and not (t in PUBLIC_API or _in(t, "xgrad.nn")):
                out.append(_where(i) + " (not in PUBLIC_API)")
    return out


RULES = [
    "uop below engine",
    "engine below tensor",
    "contract and codegen never reach Tensor",
    "core reaches codegen and backends only through plugins",
    "codegen never imports a backend",
    "backends use the public modules only",
    "llm and the torch bridge use the public API",
]
# (module, what it imports) where a rule is broken today, with the plan to fix it: none
KNOWN: set[tuple[str, str]] = set()


@pytest.mark.parametrize("rule", RULES)
def test_layer_rule_holds(rule: str) -> None:
    known = {_where(i) for i in ALL if (i.module, i.target) in KNOWN}
    assert [v for v in violations(rule) if v.split(" (")[0] not in known] == []


def test_known_violations_are_still_there() -> None:
    broken = {v.split(" (")[0] for rule in RULES for v in violations(rule)}
    fixed = sorted(
        f"{m} -> {t}" for m, t in KNOWN if not any(_where(i) in broken for i in ALL if (i.module, i.target) == (m, t))
    )
    assert fixed == [], "no longer breaks a rule: remove it from KNOWN"


def unlisted_function_level(imports: list[Import]) -> list[str]:
    """The imports inside functions of core modules that FUNCTION_LEVEL does not list."""
    return sorted(
        f"{FILES[i.module].relative_to(PACKAGES) if i.module in FILES else i.module}:{i.line} imports {i.target} "
        "inside a function"
        for i in imports
        if i.in_function and _in(i.module, "xgrad") and (i.module, i.target) not in FUNCTION_LEVEL
    )


def test_function_level_imports_in_core_are_the_listed_ones() -> None:
    unlisted = unlisted_function_level(ALL)
    assert unlisted == [], "import at the top of the module, or list it in FUNCTION_LEVEL with the reason"
    found = {(i.module, i.target) for i in ALL if i.in_function}
    fixed = sorted(f"{m} -> {t}" for m, t in FUNCTION_LEVEL if (m, t) not in found)
    assert fixed == [], "no longer imported inside a function: remove it from FUNCTION_LEVEL"


def test_only_optional_third_party_imports_are_function_level() -> None:
    assert [t for _, t in FUNCTION_LEVEL if _in(t, "xgrad", "xgrad_codegen", "pluggy", "numpy", *BACKENDS)] == []


def test_a_new_function_level_import_is_caught(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import xgrad.helpers\n"
        "if TYPE_CHECKING:\n"
        "    from xgrad.tensor import Tensor\n"
        "def f():\n"
        "    from xgrad.uop import symbolic\n"
        "    import hypothesis\n"
        "class C:\n"
        "    def g(self):\n"
        "        from . import plugin\n"
    )
    found = list(imports_of("xgrad.probe", path))
    assert [(i.target, i.in_function) for i in found] == [
        ("typing", False),
        ("xgrad.helpers", False),
        ("xgrad.uop.symbolic", True),
        ("hypothesis", True),
        ("xgrad.plugin", True),
    ]
    assert sorted(u.split(" imports ")[1] for u in unlisted_function_level(found)) == [
        "hypothesis inside a function",  # optional, but listed for xgrad.testing only
        "xgrad.plugin inside a function",
        "xgrad.uop.symbolic inside a function",
    ]


def test_the_checks_see_the_imports_they_judge() -> None:
    # the reader itself: a module importing inside a function, one importing the package root, a relative import
    mods = {i.module for i in ALL}
    assert {"xgrad.engine.schedule", "xgrad_codegen.pipeline", "xgrad_cpu.plugin", "xgrad_llm.model"} <= mods
    assert "xgrad_torch.ops" in mods, "the torch bridge is judged by the public-API rule too: the reader must see it"
    root = [i for i in ALL if i.module == "xgrad_llm.model" and i.root_name]
    assert root, "xgrad_llm.model imports Tensor from the package root: the reader must see it"
    assert any(i.in_function for i in ALL if i.module == "xgrad.testing" and i.target == "hypothesis")
    assert any(not i.in_function for i in ALL if i.module == "xgrad.uop.ops" and i.target == "xgrad.uop.symbolic")
    assert any(i.target == "xgrad.engine.indexing" for i in ALL if i.module == "xgrad.engine.schedule")


# each core module imported first (every xgrad module dropped from sys.modules before the next): an import cycle at
# module level fails here as ImportError ("partially initialized module") or NameError
CYCLE_CHILD = """
import importlib, sys
bad = []
for name in sys.argv[1:]:
    for loaded in [k for k in sys.modules if k == "xgrad" or k.startswith("xgrad.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        bad.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(bad))
"""


def test_every_core_module_imports_first_without_a_cycle() -> None:
    core = sorted(m for m in FILES if _in(m, "xgrad"))
    assert {"xgrad.custom_kernel", "xgrad.mixin.autograd", "xgrad.mixin.base", "xgrad.buffer"} <= set(core)
    # ~20 s of CPU (76 fresh imports); the limit only guards against a hang, on a host shared by parallel workers
    done = subprocess.run(
        [sys.executable, "-c", CYCLE_CHILD, *core], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported first, these fail:\n{done.stdout}"


def test_the_mixins_build_the_registered_tensor_class() -> None:
    from xgrad import Tensor
    from xgrad.mixin.base import TensorBase

    class Marked(Tensor):  # a subclass registers nothing: results stay plain Tensors
        __slots__ = ()

    assert TensorBase._tensor_cls() is Tensor
    m = Marked([1.0, 2.0])
    out = m + 1
    assert type(out) is Tensor and out.tolist() == [2.0, 3.0]
