"""A pytest plugin for a child run of the core op suite on the emulated gfx1100 (`-p amd_arch_check`, this folder on
PYTHONPATH): every kernel the AMD device builds is also lowered and rendered for gfx90a, gfx942, gfx1151, gfx1200 and
gfx1201 and compiled by clang-19 into code objects, so the suite's kernels are shown to build for every listed arch
while the emulator runs their gfx1100 form. The summary reports, per arch (gfx1100: the device's own code objects),
the kernels' VGPR/SGPR counts and spills from the code objects' metadata (`xgrad_amd.elf`) and the matrix
instructions llvm-objdump-19 finds in them; a kernel whose source calls a matrix builtin must show one.

Lowering (`full_rewrite`) reads only the renderer's attributes (wave size, workgroup limits, tensor cores, ...), so
archs whose renderers differ in nothing else (gfx1100 and gfx1151; gfx90a and gfx942; gfx1200 and gfx1201) share one
lowering per kernel. It runs when the kernel is built, so an error there fails the test that made the kernel; each
arch's renderer then prints its own source (launch bounds, matrix builtins). Clang runs at the end of the session:
one clang process per kernel costs ~0.45 s on a loaded 2-core host, so each arch's distinct sources are compiled
`MODULE_KERNELS` to a module (each kernel in a namespace of its own, its name made unique), ~0.01 s a kernel. A module
clang refuses is compiled kernel by kernel to name the kernel, its test and clang's message. Any failure fails the
session.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEVICE_ARCH = "gfx1100"  # the emulated device's
ARCHS = ("gfx90a", "gfx942", "gfx1151", "gfx1200", "gfx1201")
MODULE_KERNELS = 48
MATRIX_BUILTIN = re.compile(r"__builtin_amdgcn_(?:wmma|mfma)_")
LABEL = re.compile(r"^[0-9a-f]+ <([\w.]+)>:$")
MATRIX_MNEMONIC = re.compile(r"^\s+(v_(?:wmma|mfma)_\w+)")


@dataclass
class Kernel:
    """One kernel the device built: its name, the test that built it and its source for each arch."""

    name: str
    test: str
    sources: dict[str, str] = field(default_factory=dict)


@dataclass
class Built:
    """A kernel compiled for one arch: the code object's metadata and the matrix instructions in its code."""

    kernel: Kernel
    vgprs: int
    sgprs: int
    spills: tuple[int, int]
    matrix: set[str]


@dataclass
class Results:
    """What the session built, by arch, and what failed."""

    built: dict[str, list[Built]] = field(default_factory=lambda: {DEVICE_ARCH: []})
    failures: list[str] = field(default_factory=list)
    lowering_s: float = 0.0
    clang_s: float = 0.0


kernels: list[Kernel] = []
kernel_of: dict[tuple[str, str], Kernel] = {}  # (arch, symbol in a code object) -> kernel
results = Results()
current_test = "(outside a test)"


def lowering_key(renderer: Any) -> tuple[tuple[str, str], ...]:
    """What lowering reads of a HIP renderer: its attributes but the arch's name and table entry."""
    return tuple(sorted((k, repr(v)) for k, v in vars(renderer).items() if k not in ("arch", "target")))


def matrix_instructions(blob: bytes) -> dict[str, set[str]]:
    """kernel symbol -> the v_wmma_*/v_mfma_* mnemonics llvm-objdump-19 finds in its code."""
    objdump = shutil.which("llvm-objdump-19")
    assert objdump is not None, "llvm-objdump-19 is needed (apt-get install llvm-19)"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.hsaco"
        path.write_bytes(blob)
        text = subprocess.run([objdump, "-d", str(path)], check=True, capture_output=True, text=True).stdout
    found: dict[str, set[str]] = {}
    current: set[str] = set()
    for line in text.splitlines():
        if (m := LABEL.match(line)) is not None:
            current = found.setdefault(m.group(1), set())
        elif (m := MATRIX_MNEMONIC.match(line)) is not None:
            current.add(m.group(1))
    return found


def record(arch: str, blob: bytes, symbols: list[str]) -> None:
    """Add the kernel `symbols` of the code object `blob` (their `arch` build) to the results, checking that a matrix
    builtin in their source became a matrix instruction."""
    from xgrad_amd.elf import load_code_object

    co = load_code_object(blob)
    wants_matrix = [s for s in symbols if MATRIX_BUILTIN.search(kernel_of[arch, s].sources[arch])]
    found = matrix_instructions(blob) if wants_matrix else {}
    for symbol in symbols:
        meta, kernel = co.kernels[symbol], kernel_of[arch, symbol]
        matrix = found.get(symbol, set())
        results.built[arch].append(Built(kernel, meta.vgpr_count, meta.sgpr_count, meta.spills, matrix))
        if symbol in wants_matrix and not matrix:
            results.failures.append(f"{arch}: {kernel.name} (built by {kernel.test}) calls a matrix builtin, but "
                                    "its code has no v_wmma_*/v_mfma_* instruction")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    from xgrad.uop.ops import UOp
    from xgrad_amd.device import AMDDevice, AMDProgram
    from xgrad_amd.renderer import HIPRenderer
    from xgrad_codegen.device import CompiledProgram
    from xgrad_codegen.pipeline import full_rewrite

    renderers = {arch: HIPRenderer(arch) for arch in ARCHS}
    builds: list[tuple[list[UOp], str, AMDProgram]] = []  # what the device's compile just built
    original_build, original_compile = AMDDevice.build, AMDDevice.compile

    def build(self: AMDDevice, name: str, uops: list[UOp], src: str) -> AMDProgram:
        program = original_build(self, name, uops, src)
        builds.append((uops, src, program))
        return program

    def compile(self: AMDDevice, ast: UOp) -> CompiledProgram:
        builds.clear()
        compiled = original_compile(self, ast)
        if not builds:  # a program the device had built already
            return compiled
        assert self.arch == DEVICE_ARCH, f"amd_arch_check expects the emulated {DEVICE_ARCH}, not {self.arch}"
        uops, src, program = builds[0]
        kernel = Kernel(program.name, current_test, {DEVICE_ARCH: src})
        kernel_of[DEVICE_ARCH, program.name] = kernel
        record(DEVICE_ARCH, program.image, [program.name])
        start = time.perf_counter()
        lowered = {lowering_key(self.renderer): uops}
        for arch, renderer in renderers.items():
            key = lowering_key(renderer)
            if key not in lowered:
                lowered[key] = full_rewrite(ast, renderer)
            kernel.sources[arch] = renderer.render(program.name, lowered[key])
        results.lowering_s += time.perf_counter() - start
        kernels.append(kernel)
        return compiled

    AMDDevice.build = build  # type: ignore[method-assign]
    AMDDevice.compile = compile  # type: ignore[method-assign,assignment]


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    global current_test
    current_test = nodeid


def module_source(members: list[tuple[str, str]]) -> str:
    """One clang module of (unique name, source) kernels, each in a namespace of its own (their helpers and
    typedefs repeat)."""
    return "\n".join(f"namespace {unique} {{\n{src}\n}}  // namespace {unique}" for unique, src in members)


def compile_arch(arch: str) -> None:
    """Every distinct `arch` source, compiled in modules and recorded; a kernel clang refuses is a failure saying
    why."""
    from xgrad.errors import CompileError
    from xgrad_amd.compiler import HIPCompiler

    compiler = HIPCompiler(arch)
    sources: dict[str, str] = {}  # unique symbol -> the source with it
    for kernel in kernels:
        src = kernel.sources[arch]
        unique = f"k{hashlib.sha256(src.encode()).hexdigest()[:12]}_{kernel.name}"
        head = f"void {kernel.name}("
        assert head in src, f"{kernel.name}: no '{head}' in its source"
        if unique not in sources:
            sources[unique] = src.replace(head, f"void {unique}(", 1)
            kernel_of[arch, unique] = kernel
    # a module's members chosen by digest, not build order: a new kernel leaves most modules (and their disk cache
    # entries) as they were
    n_modules = max(1, -(-len(sources) // MODULE_KERNELS))
    modules: list[list[str]] = [[] for _ in range(n_modules)]
    for unique in sorted(sources):
        modules[int(unique[1:13], 16) % n_modules].append(unique)
    results.built[arch] = []
    for members in filter(None, modules):
        try:
            record(arch, compiler.compile(module_source([(u, sources[u]) for u in members])), members)
            continue
        except CompileError:
            pass
        for unique in members:  # kernel by kernel, to name the one(s) clang refuses
            try:
                record(arch, compiler.compile(module_source([(unique, sources[unique])])), [unique])
            except CompileError as e:
                kernel = kernel_of[arch, unique]
                results.failures.append(f"{arch}: {kernel.name} (built by {kernel.test}) does not compile:\n{e}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not kernels:
        return
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:  # clang runs as a process; CI has 2 cores
        list(pool.map(compile_arch, ARCHS))
    results.clang_s = time.perf_counter() - start
    if results.failures:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not kernels:
        return
    write = terminalreporter.write_line
    distinct = ", ".join(f"{arch} {len(results.built[arch])}" for arch in ARCHS)
    write(f"amd_arch_check: {len(kernels)} kernels compiled for {', '.join(ARCHS)} (distinct sources: {distinct}; "
          f"lowering {results.lowering_s:.1f} s, clang and metadata {results.clang_s:.1f} s)")  # fmt: skip
    for arch in (DEVICE_ARCH, *ARCHS):
        built = results.built[arch]
        if not built:
            continue
        top = max(built, key=lambda b: b.vgprs)
        matrix: dict[str, int] = {}
        for b in built:
            for m in b.matrix:
                matrix[m] = matrix.get(m, 0) + 1
        vspill = [b for b in built if b.spills[0]]
        sspill = [b for b in built if b.spills[1]]
        write(
            f"  {arch}: VGPRs median {statistics.median(b.vgprs for b in built):.0f}, max {top.vgprs} "
            f"({top.kernel.name}); SGPRs max {max(b.sgprs for b in built)}; VGPR spills in {len(vspill)} kernels"
            f"{_spilled(vspill)}, SGPR spills in {len(sspill)}{_spilled(sspill)}; matrix instructions: "
            + (", ".join(f"{m} x{n}" for m, n in sorted(matrix.items())) or "none")
        )
    for failure in results.failures:
        write(f"amd_arch_check FAILED {failure}", red=True)


def _spilled(built: list[Built]) -> str:
    shown = ", ".join(f"{b.kernel.name} {b.spills[0]}/{b.spills[1]}" for b in built[:4])
    return f" ({shown})" if built else ""
