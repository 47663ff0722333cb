"""C source -> shared-object bytes with the system C compiler (clang or gcc), cached on disk.

The cache is content-addressed: the key hashes the source, the compiler (path and `--version` text), the flags (the
`-march` target among them: the CPU_MARCH knob, default native), the machine (`-march=native` output differs per CPU)
and every knob declared to change how a source is compiled (`knobs_key(COMPILE)`). Entries are written atomically
(temp file + `os.replace`) so parallel processes never read a half-written binary.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence

from xgrad.errors import CompileError, DeviceError
from xgrad.helpers import CC, CPU_MARCH, DEBUG, Effect, disk_cached, knobs_key
from xgrad_cpu.plugin import COMPILER_CANDIDATES

BASE_FLAGS: tuple[str, ...] = (
    "-O2",
    "-fPIC",
    "-shared",
    "-fno-math-errno",  # lets sqrt and friends compile to single instructions
    "-ffp-contract=fast",  # a*b+c -> fma where the CPU has it
    "-fno-plt",
    "-fwrapv",  # signed overflow wraps (two's complement), as the PYTHON reference executor defines it
    # the vector helpers are static to the kernel's file, so gcc's note that a 64-byte vector argument has another
    # ABI without AVX-512 concerns no caller: a 16-lane kernel built for an AVX2 target runs its lane loops instead
    "-Wno-psabi",
)
# libm goes after the source so the linker sees the kernel's references to expf/logf/...; it adds a DT_NEEDED entry,
# which keeps kernels loadable even in a host process that did not link libm itself.
LINK_FLAGS: tuple[str, ...] = ("-lm",)


class CompilerNotFoundError(DeviceError):
    """No usable C compiler: neither $CC, clang nor gcc could be found."""


class TargetError(DeviceError):
    """CPU_MARCH names a target the compiler does not know, or one whose instructions this CPU lacks."""


def find_compiler(cc: str = "") -> list[str]:
    """The compiler command line: `cc` (or the CC knob) if set, else the first of COMPILER_CANDIDATES on PATH."""
    override = cc or CC.value
    if override:
        cmd = shlex.split(override)
        path = shutil.which(cmd[0]) if cmd else None
        if path is None:
            raise CompilerNotFoundError(
                f"CC={override!r} is not an executable on PATH; "
                "set CC to an installed C compiler (clang or gcc) or unset it"
            )
        return [path, *cmd[1:]]
    for name in COMPILER_CANDIDATES:
        if (path := shutil.which(name)) is not None:
            return [path]
    raise CompilerNotFoundError(
        "the CPU backend needs a C compiler but neither clang nor gcc is on PATH; "
        "install one (e.g. `apt-get install gcc` or `apt-get install clang`) or set CC=/path/to/cc"
    )


@functools.cache
def compiler_version(cmd: tuple[str, ...]) -> str:
    """The `--version` text of a compiler (part of the cache key: an upgraded compiler must not reuse old binaries)."""
    try:
        out = subprocess.run([*cmd, "--version"], check=False, capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise CompilerNotFoundError(f"cannot run C compiler {cmd[0]!r}: {e}; install gcc or clang or set CC") from None
    if out.returncode != 0:
        raise CompilerNotFoundError(
            f"{cmd[0]!r} --version failed (exit {out.returncode}): {out.stderr.strip()}; "
            "set CC to a working gcc or clang"
        )
    return out.stdout


@functools.cache
def machine_key() -> str:
    """What `-march=native` depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                flags += line + "\n"
            if line.strip() == "":  # the first CPU's block is enough
                break
    except OSError:
        pass
    return f"{platform.machine()}\n{flags}"


@functools.cache
def predefined_macros(cmd: tuple[str, ...], flags: tuple[str, ...]) -> str:
    """What the compiler predefines for these flags (`-dM -E` of empty source): the instruction sets `-march=native`
    enables show as `__AVX2__`, `__AVX512F__`, ... Empty if the compiler cannot say (its errors surface on the first
    compile)."""
    try:
        out = subprocess.run(
            [*cmd, *flags, "-dM", "-E", "-x", "c", "-"],
            input="",
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return ""
    return out.stdout if out.returncode == 0 else ""


# what an instruction set's predefined macro looks like: `#define __AVX512F__ 1`, `#define __ARM_FEATURE_SVE 1`
FEATURE_MACRO = re.compile(r"^#define (__[A-Z][A-Z0-9_]*__|__ARM_FEATURE_[A-Z0-9_]+) 1$", re.M)


def check_target(cmd: tuple[str, ...], march: str) -> None:
    """Raise `TargetError` unless kernels built with `-march=<march>` run here: the compiler must know the target, and
    every instruction set it enables must be one `-march=native` enables too (else a kernel would stop the process
    with an illegal instruction)."""
    target = predefined_macros(cmd, (f"-march={march}",))
    if not target:
        try:
            out = subprocess.run(
                [*cmd, f"-march={march}", "-dM", "-E", "-x", "c", "-"],
                input="",
                capture_output=True,
                text=True,
                timeout=60,
            )
            why = out.stderr.strip().splitlines()[0] if out.stderr.strip() else f"exit {out.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        raise TargetError(
            f"CPU_MARCH={march!r}: {cmd[0]} rejects -march={march} ({why}); "
            "set CPU_MARCH to a target it knows (e.g. x86-64-v3) or unset it"
        )
    native = predefined_macros(cmd, ("-march=native",))
    lacking = sorted(set(FEATURE_MACRO.findall(target)) - set(FEATURE_MACRO.findall(native)))
    if native and lacking:
        names = ", ".join(m.strip("_") for m in lacking)
        raise TargetError(
            f"CPU_MARCH={march!r} enables {names}, which this CPU lacks: its kernels would stop the process with an "
            "illegal instruction; set CPU_MARCH to a target this CPU runs (e.g. x86-64-v3 for AVX2) or unset it"
        )


def knows_evex512(name: str) -> bool:
    """Whether a compiler named like `clang-19` or `gcc-12` (`_name_from_version`) predefines __EVEX512__ when 512-bit
    vectors are enabled."""
    m = re.fullmatch(r"(clang|gcc)-(\d+)", name)
    return m is not None and int(m.group(2)) >= (18 if m.group(1) == "clang" else 14)


def _name_from_version(path: str, version: str) -> str:
    first = version.splitlines()[0] if version else ""
    if "clang" in version:
        family = "clang"
    elif "gcc" in first or "Free Software Foundation" in version:
        family = "gcc"
    else:
        family = os.path.basename(path)
    major = m.group(1) if (m := re.search(r"(\d+)\.\d+", first)) else ""
    return f"{family}-{major}" if major else family


class CCompiler:
    """Compiles C source to a shared object and returns its bytes.

    `CCompiler()` picks `$CC`, else clang, else gcc, and raises `CompilerNotFoundError` if none exists. It builds for
    `-march=<march>` (default: the CPU_MARCH knob, `native`); a target other than native is checked first
    (`check_target`). `compiles` counts how many times this instance actually ran the compiler (cache misses).
    Each compile is its own process in its own directory, so threads may compile at once (`concurrent`).
    """

    concurrent = True

    def __init__(self, cc: str = "", extra_flags: Sequence[str] = (), march: str = "") -> None:
        self.cmd: list[str] = find_compiler(cc)
        self.version: str = compiler_version(tuple(self.cmd))
        self.march = march or CPU_MARCH.value
        if self.march != "native":
            check_target(tuple(self.cmd), self.march)
        self.flags: tuple[str, ...] = (*BASE_FLAGS, f"-march={self.march}", *extra_flags)
        self.name: str = _name_from_version(self.cmd[0], self.version)
        if self.name.startswith("gcc"):
            # gcc 12's vectorizers miscompile two kinds of generated kernels at -O2: its loop vectorizer sums a
            # scalar reduction whose unrolled terms come in another order than their addresses wrongly (an svd's
            # gradient came out wrong), and its SLP vectorizer, with AVX-512VL, a vector of per-lane selects added
            # into an accumulator (interpolate). codegen vectorizes the kernels itself, so gcc's own vectorizers are
            # left off (clang, preferred when installed, gets the same kernels right with its vectorizers on).
            self.flags += ("-fno-tree-vectorize",)
        self.compiles = 0
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CCompiler({self.name}, {' '.join(self.cmd)})"

    def vector_bytes(self) -> int:
        """The widest vector register the compiled kernels may use, in bytes: 64 where the target has AVX-512, else
        32 (AVX2, or narrower registers that the compiler pairs up: generated code never uses less than 32)."""
        macros = predefined_macros(tuple(self.cmd), self.flags)
        if "__AVX512F__ " not in macros:
            return 32
        # clang >= 18 and gcc >= 14 can enable AVX-512's instructions without its 512-bit registers (-mno-evex512;
        # clang 19's -mno-avx512f on an AVX10 host leaves AVX10/256): they say which by __EVEX512__, and a 64-byte
        # vector argument without it is an error, not a warning
        return 64 if "__EVEX512__ " in macros or not knows_evex512(self.name) else 32

    def cache_key(self, src: str) -> str:
        parts = (
            src,
            " ".join(self.cmd),
            self.version,
            " ".join(self.flags + LINK_FLAGS),
            knobs_key(Effect.COMPILE),
            machine_key(),
        )
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def compile(self, src: str) -> bytes:
        """The shared object's bytes for `src`, from the disk cache when possible. Raises `CompileError` on failure."""
        return disk_cached("cpu", f"{self.cache_key(src)}.so", lambda: self._compile(src))

    def _compile(self, src: str) -> bytes:
        with self._count_lock:
            self.compiles += 1
        with tempfile.TemporaryDirectory(prefix="xgrad-cc-") as tmp:
            src_path = os.path.join(tmp, "kernel.c")
            out_path = os.path.join(tmp, "kernel.so")
            with open(src_path, "w") as f:
                f.write(src)
            cmd = [*self.cmd, *self.flags, src_path, "-o", out_path, *LINK_FLAGS]
            if DEBUG >= 5:
                print(" ".join(shlex.quote(c) for c in cmd))
            try:
                out = subprocess.run(cmd, check=False, capture_output=True, text=True)
            except OSError as e:
                raise CompilerNotFoundError(
                    f"cannot run C compiler {self.cmd[0]!r}: {e}; install gcc or clang or set CC"
                ) from None
            if out.returncode != 0:
                log = (out.stderr + out.stdout).replace(src_path, "kernel.c")
                raise CompileError(
                    f"{self.name} failed to compile a kernel (exit {out.returncode})", source=src, log=log
                )
            with open(out_path, "rb") as f:
                return f.read()
