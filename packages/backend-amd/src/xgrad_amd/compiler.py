"""HIP source -> HSA code object (an ELF for the amdgcn target) with clang-19 and lld-19, cached on disk.

    clang-19 -x hip --cuda-device-only -nogpulib -nogpuinc --no-gpu-bundle-output --offload-arch=<arch> -O3
             -fuse-ld=lld --ld-path=<ld.lld-19> kernel.hip -o kernel.hsaco

No ROCm installation is involved: `-nogpuinc`/`-nogpulib` keep clang from looking for HIP headers and device
libraries (the renderer prints only clang builtins), and lld links the device code into the code object that
`hipModuleLoadData` (or `xgrad_amd.elf`) loads. The cache key hashes the source, the arch, the flags, clang's and
lld's `--version` text and every knob declared to change how a source is compiled; entries are written atomically.
A compile error raises `HIPCompileError` with clang's message and the source with line numbers.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile

from xgrad.errors import CompileError, DeviceError
from xgrad.helpers import DEBUG, Effect, disk_cached, knobs_key
from xgrad_amd.renderer import arch_info

CLANG_CANDIDATES = ("clang-19", "clang-20", "clang-21", "clang")
LLD_CANDIDATES = ("ld.lld-19", "ld.lld-20", "ld.lld-21", "ld.lld")
MIN_CLANG = 19  # the gfx12 WMMA builtins and gfx1151/gfx1200/gfx1201 targets
FLAGS: tuple[str, ...] = (
    "-x",
    "hip",
    "--cuda-device-only",
    "-nogpulib",  # no ROCm device libraries (ocml/ockl): the kernels call clang builtins only
    "-nogpuinc",  # no HIP headers
    "--no-gpu-bundle-output",  # a plain code object, not an offload bundle
    "-O3",
    "-fuse-ld=lld",
)
INSTALL_HINT = "install clang-19 and lld-19 (Debian/Ubuntu: apt-get install clang-19 lld-19)"


class HIPToolchainError(DeviceError):
    """clang (>= 19) or ld.lld, needed to build AMD code objects, is missing or does not run."""


class HIPCompileError(CompileError):
    """clang rejected a generated HIP kernel: carries clang's message and the source with line numbers."""


def numbered(src: str) -> str:
    """`src` with a line number before each line (clang's messages cite `kernel.hip:<line>:<column>`)."""
    lines = src.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))


@functools.cache
def tool_version(path: str) -> str:
    """The `--version` text of a tool (part of the cache key: an upgraded compiler must not reuse old binaries)."""
    try:
        out = subprocess.run([path, "--version"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HIPToolchainError(f"cannot run {path!r}: {e}; {INSTALL_HINT}") from None
    if out.returncode != 0:
        raise HIPToolchainError(f"{path} --version failed (exit {out.returncode}); {INSTALL_HINT}")
    return out.stdout


def clang_major(version: str) -> int:
    """The major version in `clang --version` output (0 when it does not say)."""
    m = re.search(r"clang version (\d+)", version)
    return int(m.group(1)) if m else 0


def find_clang() -> str:
    """The first clang of CLANG_CANDIDATES on PATH whose version is at least MIN_CLANG."""
    for name in CLANG_CANDIDATES:
        if (path := shutil.which(name)) is not None and clang_major(tool_version(path)) >= MIN_CLANG:
            return path
    raise HIPToolchainError(f"no clang >= {MIN_CLANG} on PATH to build AMD code objects; {INSTALL_HINT}")


def find_lld() -> str:
    """The first ld.lld of LLD_CANDIDATES on PATH."""
    for name in LLD_CANDIDATES:
        if (path := shutil.which(name)) is not None:
            return path
    raise HIPToolchainError(f"no ld.lld on PATH to link AMD code objects; {INSTALL_HINT}")


def toolchain_problem() -> str | None:
    """Why code objects cannot be built here (for `xgrad info` and test skips), or None when they can."""
    try:
        find_clang()
        find_lld()
    except HIPToolchainError as e:
        return str(e)
    return None


class HIPCompiler:
    """Compiles HIP source for one AMD target (`arch`, a key of AMD_ARCHS, optionally with features such as
    `gfx90a:xnack-`) to code-object bytes. `compiles` counts clang runs (cache misses)."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.info = arch_info(arch)  # DeviceError for a target clang-19 cannot build
        self.clang = find_clang()
        self.lld = find_lld()
        self.flags: tuple[str, ...] = (*FLAGS, f"--offload-arch={arch}", f"--ld-path={self.lld}")
        self.compiles = 0

    def __repr__(self) -> str:
        return f"HIPCompiler({self.arch}, {self.clang})"

    def cache_key(self, src: str) -> str:
        parts = (
            src,
            self.arch,
            " ".join(self.flags),
            tool_version(self.clang),
            tool_version(self.lld),
            knobs_key(Effect.COMPILE),
        )
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def compile(self, src: str) -> bytes:
        """The code object for `src`, from the disk cache when possible. Raises `HIPCompileError` on failure."""
        return disk_cached("amd", f"{self.cache_key(src)}.hsaco", lambda: self._compile(src))

    def _compile(self, src: str) -> bytes:
        self.compiles += 1
        with tempfile.TemporaryDirectory(prefix="xgrad-hip-") as tmp:
            src_path = os.path.join(tmp, "kernel.hip")
            out_path = os.path.join(tmp, "kernel.hsaco")
            with open(src_path, "w") as f:
                f.write(src)
            cmd = [self.clang, *self.flags, src_path, "-o", out_path]
            if DEBUG >= 5:
                print(" ".join(shlex.quote(c) for c in cmd))
            try:
                out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise HIPToolchainError(f"cannot run {self.clang!r}: {e}; {INSTALL_HINT}") from None
            if out.returncode != 0:
                log = (out.stderr + out.stdout).replace(src_path, "kernel.hip").replace(tmp + "/", "")
                raise HIPCompileError(
                    f"clang failed to compile a kernel for {self.arch} (exit {out.returncode})",
                    source=numbered(src),
                    log=log.strip(),
                )
            with open(out_path, "rb") as f:
                return f.read()


__all__ = ["HIPCompiler", "HIPCompileError", "HIPToolchainError", "find_clang", "find_lld", "toolchain_problem"]
