"""Compilers of the NV backend: CUDA C source or PTX text in, a binary the CUDA driver loads (cubin, or PTX) out.

- CUDA C: NVRTC through ctypes, from the PyPI wheel `nvidia-cuda-nvrtc` (13.0 series) or a CUDA toolkit; its
  `libnvrtc-builtins` is loaded first (NVRTC dlopens it by name, which finds nothing outside the toolkit's library
  path). Headers (`cuda_fp16.h`, `cuda_bf16.h`) come from a CUDA toolkit (`/usr/local/cuda*/include`, next to `nvcc`)
  or from a wheel that ships them (`nvidia/*/include`): the nvrtc wheel has only `nvrtc.h`. Where NVRTC is missing,
  `nvcc` compiles instead.
- PTX: `ptxas` (a CUDA toolkit's, or the one triton ships) assembles it for one `sm_XX`; without ptxas the PTX text
  itself is the binary: the driver JIT-compiles it when it loads the module (`cuModuleLoadData`).

Binaries are cached on disk (`<cache dir>/nv/`) under a key of the source, the tool and its version, the arch, the
output kind and the flags. A compile error raises `CompileError` with the source (numbered lines) and the tool's log.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from xgrad.errors import CompileError, DeviceError
from xgrad.helpers import DEBUG, Effect, disk_cached, knobs_key

NVRTC_WHEEL = "nvidia-cuda-nvrtc==13.0.*"
INSTALL_HINT = f"pip install '{NVRTC_WHEEL}' (and a CUDA toolkit for the headers, e.g. /usr/local/cuda/include)"


class CUDAToolkitError(DeviceError):
    """A tool the NV backend needs to build kernels (NVRTC, nvcc, ptxas, the CUDA headers) is missing."""


def numbered(src: str) -> str:
    """`src` with 1-based line numbers, as compiler logs cite them."""
    return "\n".join(f"{i:4d} | {line}" for i, line in enumerate(src.splitlines(), 1))


# ---- where the tools are ----
def nvidia_wheel_dirs() -> list[pathlib.Path]:
    """The folders of the `nvidia` namespace package (the pip wheels of the CUDA components), if installed."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [pathlib.Path(p) for p in spec.submodule_search_locations]


def toolkit_roots() -> list[pathlib.Path]:
    """CUDA toolkit folders: the one `nvcc` on PATH belongs to, then /usr/local/cuda, then /usr/local/cuda-X.Y (newest
    first)."""
    roots: list[pathlib.Path] = []
    if (nvcc := shutil.which("nvcc")) is not None:
        roots.append(pathlib.Path(nvcc).resolve().parent.parent)
    roots.append(pathlib.Path("/usr/local/cuda"))
    roots += [pathlib.Path(p) for p in sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    return [r.resolve() for r in dict.fromkeys(roots) if r.exists()]


@functools.cache
def find_nvrtc() -> pathlib.Path | None:
    """libnvrtc: from the pip wheels first (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), then a toolkit's lib64."""
    candidates: list[str] = []
    for d in nvidia_wheel_dirs():
        candidates += sorted(glob.glob(str(d / "*" / "lib" / "libnvrtc.so.*")))
    for root in toolkit_roots():
        candidates += sorted(glob.glob(str(root / "lib64" / "libnvrtc.so.*")))
        candidates += sorted(glob.glob(str(root / "targets" / "*" / "lib" / "libnvrtc.so.*")))
    for c in candidates:
        if re.search(r"libnvrtc\.so\.\d+$", c):  # not libnvrtc.alt.so, not a versioned builtins library
            return pathlib.Path(c)
    return None


_include_override: list[pathlib.Path] = []


def use_cuda_include(path: pathlib.Path) -> None:
    """Take the CUDA headers from `path` (a folder with cuda_fp16.h and cuda_bf16.h) before any other place; for a
    machine without a toolkit (bench/nv_check.py --cuda-include). Affects compilers made afterwards."""
    if not ((path / "cuda_fp16.h").exists() and (path / "cuda_bf16.h").exists()):
        raise CUDAToolkitError(f"{path} has no cuda_fp16.h and cuda_bf16.h")
    _include_override[:] = [path]
    find_cuda_include.cache_clear()
    build_tool.cache_clear()


@functools.cache
def find_cuda_include() -> pathlib.Path | None:
    """A folder holding cuda_fp16.h and cuda_bf16.h (for NVRTC's -I)."""
    dirs = [*_include_override, *(root / "include" for root in toolkit_roots())]
    dirs += [pathlib.Path(p) for root in toolkit_roots() for p in glob.glob(str(root / "targets" / "*" / "include"))]
    dirs += [pathlib.Path(p) for d in nvidia_wheel_dirs() for p in sorted(glob.glob(str(d / "*" / "include")))]
    dirs.append(pathlib.Path("/usr/include"))
    return next((d for d in dirs if (d / "cuda_fp16.h").exists() and (d / "cuda_bf16.h").exists()), None)


@functools.cache
def find_tool(name: str) -> pathlib.Path | None:
    """`ptxas`, `nvcc`, `nvdisasm`, `cuobjdump`: on PATH, in a toolkit's bin, in the pip wheels (nvidia/*/bin), or
    (ptxas) the one triton ships."""
    if (found := shutil.which(name)) is not None:
        return pathlib.Path(found)
    dirs = [root / "bin" for root in toolkit_roots()]
    dirs += [pathlib.Path(p) for d in nvidia_wheel_dirs() for p in sorted(glob.glob(str(d / "*" / "bin")))]
    if (triton := importlib.util.find_spec("triton")) is not None and triton.submodule_search_locations:
        dirs += [pathlib.Path(p) / "backends" / "nvidia" / "bin" for p in triton.submodule_search_locations]
    return next((d / name for d in dirs if (d / name).is_file()), None)


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin as `nvdisasm` prints it (to check a kernel's instructions: HMMA, shared-memory traffic);
    CUDAToolkitError when nvdisasm is not installed (`pip install nvidia-cuda-nvdisasm`)."""
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm is None:
        raise CUDAToolkitError("nvdisasm is not installed: pip install nvidia-cuda-nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(nvdisasm), str(path)], capture_output=True, text=True, check=True).stdout


# ---- NVRTC ----
class NVRTC:
    """The few NVRTC functions the backend calls, bound through ctypes."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        for builtins in sorted(path.parent.glob("libnvrtc-builtins.so.*")):
            if ".alt." not in builtins.name:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)  # NVRTC dlopens it by name
                break
        lib = ctypes.CDLL(str(path))
        self.lib = lib
        vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
        protos: dict[str, list[object]] = {
            "nvrtcVersion": [ctypes.POINTER(i), ctypes.POINTER(i)],
            "nvrtcCreateProgram": [ctypes.POINTER(vp), cp, cp, i, ctypes.POINTER(cp), ctypes.POINTER(cp)],
            "nvrtcCompileProgram": [vp, i, ctypes.POINTER(cp)],
            "nvrtcGetProgramLogSize": [vp, ctypes.POINTER(sz)],
            "nvrtcGetProgramLog": [vp, cp],
            "nvrtcGetCUBINSize": [vp, ctypes.POINTER(sz)],
            "nvrtcGetCUBIN": [vp, cp],
            "nvrtcGetPTXSize": [vp, ctypes.POINTER(sz)],
            "nvrtcGetPTX": [vp, cp],
            "nvrtcDestroyProgram": [ctypes.POINTER(vp)],
        }
        for name, args in protos.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            name = self.lib.nvrtcGetErrorString(status).decode()
            raise CompileError(f"NVRTC {call} failed: {name} ({status})")

    def compile(self, src: str, options: list[str], ptx: bool) -> tuple[bytes, str]:
        """(cubin or PTX, log) of `src`; CompileError with the numbered source and the log when it does not compile."""
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None), "create"
        )
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, buf), "log")
            log = buf.value.decode(errors="replace")
            if status != 0:
                name = self.lib.nvrtcGetErrorString(status).decode()
                raise CompileError(f"NVRTC {self.version_text} failed to compile a kernel ({name})", numbered(src), log)
            get_size, get = ("nvrtcGetPTXSize", "nvrtcGetPTX") if ptx else ("nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            self._check(getattr(self.lib, get_size)(prog, ctypes.byref(size)), get_size)
            out = ctypes.create_string_buffer(size.value)
            self._check(getattr(self.lib, get)(prog, out), get)
            return out.raw[: size.value].rstrip(b"\0") if ptx else out.raw[: size.value], log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


@functools.cache
def load_nvrtc() -> NVRTC | None:
    """NVRTC if it can be found and loaded, else None (`nvrtc_status` says why)."""
    path = find_nvrtc()
    if path is None:
        return None
    try:
        return NVRTC(path)
    except (OSError, AttributeError, CompileError):
        return None


def nvrtc_status() -> tuple[bool, str]:
    """(True, "NVRTC 13.0 at <path>") or (False, why not and what to install)."""
    path = find_nvrtc()
    if path is None:
        return False, f"NVRTC (libnvrtc.so) not found; {INSTALL_HINT}"
    try:
        nvrtc = NVRTC(path)
    except (OSError, AttributeError, CompileError) as e:
        return False, f"NVRTC at {path} does not load ({e}); reinstall it: {INSTALL_HINT}"
    return True, f"NVRTC {nvrtc.version_text} at {path}"


def tool_version(tool: pathlib.Path) -> str:
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    lines = out.strip().splitlines()
    return next((line for line in lines if "release" in line), lines[-1] if lines else "unknown")


@dataclass
class BuildTool:
    """How CUDA C is compiled here: NVRTC or nvcc, with its version and the header folder."""

    kind: str  # "nvrtc" or "nvcc"
    version: str
    include: pathlib.Path | None
    nvrtc: NVRTC | None = None
    nvcc: pathlib.Path | None = None


@functools.cache
def build_tool() -> BuildTool:
    """NVRTC where it loads, else nvcc; CUDAToolkitError naming what to install when there is neither."""
    include = find_cuda_include()
    if (nvrtc := load_nvrtc()) is not None:
        return BuildTool("nvrtc", nvrtc.version_text, include, nvrtc=nvrtc)
    if (nvcc := find_tool("nvcc")) is not None:
        return BuildTool("nvcc", tool_version(nvcc), include, nvcc=nvcc)
    raise CUDAToolkitError(f"cannot compile CUDA C: neither NVRTC nor nvcc was found; {INSTALL_HINT}")


def _cached(kind: str, key_parts: tuple[str, ...], build: Callable[[], bytes]) -> bytes:
    key = hashlib.sha256("\0".join((*key_parts, knobs_key(Effect.COMPILE))).encode()).hexdigest()
    return disk_cached("nv", f"{key}.{kind}", build)


class CUDACompiler:
    """CUDA C -> cubin for `arch` ("sm_90"), or PTX text (`ptx=True`: what the mock device runs). `compiles` counts
    the tool's runs (cache misses)."""

    def __init__(self, arch: str, ptx: bool = False) -> None:
        self.arch, self.ptx = arch, ptx
        self.tool = build_tool()
        self.compiles = 0

    def __repr__(self) -> str:
        return f"CUDACompiler({self.tool.kind} {self.tool.version}, {self.arch}, {'ptx' if self.ptx else 'cubin'})"

    def options(self) -> list[str]:
        opts = [f"--gpu-architecture={self.arch}", "--std=c++17"]
        if self.tool.include is not None:
            opts.append(f"-I{self.tool.include}")
        return opts

    def cache_key(self, src: str) -> str:
        parts = (src, self.tool.kind, self.tool.version, self.arch, "ptx" if self.ptx else "cubin", *self.options())
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def compile(self, src: str) -> bytes:
        """The cubin (or PTX) of `src`, from the disk cache when possible; CompileError when it does not compile."""
        kind = "ptx" if self.ptx else "cubin"
        return _cached(kind, (self.cache_key(src),), lambda: self._compile(src))

    def _compile(self, src: str) -> bytes:
        self.compiles += 1
        if self.tool.nvrtc is not None:
            out, log = self.tool.nvrtc.compile(src, self.options(), self.ptx)
            if DEBUG >= 5 and log:
                print(log)
            return out
        assert self.tool.nvcc is not None
        return run_tool(
            [str(self.tool.nvcc), "-ptx" if self.ptx else "-cubin", f"-arch={self.arch}", *self.options()[1:]],
            src,
            "kernel.cu",
            f"nvcc {self.tool.version}",
        )


def run_tool(cmd: list[str], src: str, src_name: str, label: str, extra: list[str] | None = None) -> bytes:
    """Run `cmd` on `src` written to `src_name` in a temporary folder with `-o out` (after `extra`), returning the
    output file; CompileError with the numbered source and the tool's log when it fails."""
    with tempfile.TemporaryDirectory(prefix="xgrad-nv-") as tmp:
        src_path, out_path = os.path.join(tmp, src_name), os.path.join(tmp, "out")
        with open(src_path, "w") as f:
            f.write(src)
        full = [*cmd, *(extra or []), src_path, "-o", out_path]
        try:
            res = subprocess.run(full, capture_output=True, text=True, check=False)
        except OSError as e:
            raise CUDAToolkitError(f"cannot run {cmd[0]}: {e}") from None
        if res.returncode != 0:
            log = (res.stderr + res.stdout).replace(src_path, src_name)
            raise CompileError(f"{label} failed (exit {res.returncode})", numbered(src), log)
        with open(out_path, "rb") as f:
            return f.read()


class PTXCompiler:
    """PTX text -> cubin for `arch` with ptxas; where ptxas is missing (or `jit=True`), the PTX itself (with a
    terminating NUL), which the driver JIT-compiles when it loads it."""

    def __init__(self, arch: str, jit: bool = False) -> None:
        self.arch = arch
        self.ptxas = None if jit else find_tool("ptxas")
        self.version = tool_version(self.ptxas) if self.ptxas is not None else "driver-jit"
        self.compiles = 0

    def __repr__(self) -> str:
        return f"PTXCompiler({self.ptxas or 'driver JIT'}, {self.arch})"

    def cache_key(self, src: str) -> str:
        return hashlib.sha256("\0".join((src, str(self.ptxas), self.version, self.arch)).encode()).hexdigest()

    def compile(self, src: str) -> bytes:
        if self.ptxas is None or not ptxas_reads(self.version, src):
            return src.encode() + b"\0"  # the driver JIT-compiles it (a ptxas older than the PTX, e.g. triton's)
        return _cached("cubin", (self.cache_key(src),), lambda: self._compile(src))

    def _compile(self, src: str) -> bytes:
        assert self.ptxas is not None
        self.compiles += 1
        return run_tool([str(self.ptxas), f"-arch={self.arch}"], src, "kernel.ptx", f"ptxas {self.version}")


def ptxas_reads(version: str, ptx: str) -> bool:
    """Whether a ptxas whose `--version` ends in `version` ("... release 12.8, V12.8.93") knows the PTX ISA `ptx`
    declares: ISA 9.x came with CUDA 13, 8.x with CUDA 12 (unknown versions: assume it does)."""
    release = re.search(r"release (\d+)\.(\d+)", version)
    isa = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.MULTILINE)
    if release is None or isa is None:
        return True
    need = 13 if int(isa.group(1)) >= 9 else 12 if int(isa.group(1)) == 8 else 0
    return int(release.group(1)) >= need


# ---- resource usage (ptxas -v) ----
@dataclass(frozen=True)
class KernelResources:
    """What `ptxas -v` reports of one kernel."""

    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    shared: int  # bytes of static shared memory
    stack: int  # bytes of stack frame


_RES_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "shared": r"(\d+) bytes smem",
    "stack": r"(\d+) bytes stack frame",
}


def ptxas_resources(ptx: str, arch: str) -> dict[str, KernelResources]:
    """Per kernel of `ptx`: registers, spills and memory as `ptxas -v -arch=<arch>` reports them."""
    ptxas = find_tool("ptxas")
    if ptxas is None:
        raise CUDAToolkitError("ptxas not found: install a CUDA toolkit (or the nvidia-cuda-nvcc wheel)")
    with tempfile.TemporaryDirectory(prefix="xgrad-nv-") as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [str(ptxas), "-v", f"-arch={arch}", path, "-o", os.path.join(tmp, "out.cubin")]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise CompileError(f"ptxas -v failed (exit {res.returncode})", numbered(ptx), res.stderr + res.stdout)
    out: dict[str, KernelResources] = {}
    name = ""
    values: dict[str, int] = {}
    for line in (res.stderr + res.stdout).splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            name, values = m.group(1), {}
        for key, pat in _RES_PATTERNS.items():
            if m := re.search(pat, line):
                values[key] = int(m.group(1))
        if name and "registers" in values:
            out[name] = KernelResources(**{k: values.get(k, 0) for k in _RES_PATTERNS})
    return out


__all__ = [
    "CUDACompiler",
    "PTXCompiler",
    "CUDAToolkitError",
    "KernelResources",
    "build_tool",
    "find_cuda_include",
    "find_nvrtc",
    "find_tool",
    "nvrtc_status",
    "numbered",
    "ptxas_resources",
    "use_cuda_include",
]
