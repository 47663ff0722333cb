"""The WEBGPU device: kernels rendered as WGSL, compiled by the WebGPU implementation (wgpu-native through the `wgpu`
Python package) into compute pipelines, dispatched on the adapter's queue.

Memory: every buffer is a storage buffer (STORAGE | COPY_SRC | COPY_DST) rounded up to whole 4-byte words (WGSL
storage holds words; packed bool/int8/int16 buffers need the tail word). Copies go through `queue.write_buffer` and
`queue.read_buffer`, which waits for the work submitted before it. Offset views bind the base buffer at an offset,
which WebGPU allows only at multiples of the adapter's `min-storage-buffer-offset-alignment`: other offsets are
refused with a `DeviceError`.

Kernels: each kernel AST gets one flat parallel range over its outputs first (`xgrad_webgpu.parallel`), then goes
through codegen. A kernel binds at most `max_kernel_buffers` storage buffers: the adapter's
`max-storage-buffers-per-shader-stage` less the one the variables may need; the scheduler reads that attribute and
splits kernels that would bind more (`MAX_KERNEL_BUFFERS` overrides it).

Launching: dispatches are recorded into one open command encoder (a compute pass each) and submitted together, at
the latest after `MAX_PENDING_DISPATCHES`, and before anything that acts on the queue at the time of the call: a copy
in or out (`write_buffer`/`read_buffer`), `synchronize`, or a timed launch (`DEBUG=2`). A TinyJit replay of the
training demo is then one submit instead of one per kernel. Freeing a buffer never submits (a free can come from the
garbage collector in the middle of recording a dispatch): the buffer is destroyed at once when nothing is recorded,
else right after the next submission, since a recorded dispatch may still use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad.errors import CompileError, DeviceError
from xgrad.uop.ops import Ops, UOp
from xgrad_codegen.device import CompiledDevice, eval_size, launch_args
from xgrad_webgpu.parallel import merge_output_ranges
from xgrad_webgpu.renderer import F16_FEATURE, CpuAdapter, WGSLRenderer

# submit the recorded dispatches at least this often, so the adapter starts on long kernel lists
MAX_PENDING_DISPATCHES = 64
# optional features the renderer can use when the adapter has them
WANTED_FEATURES = (F16_FEATURE, "timestamp-query")


@dataclass
class WebGPUBuffer:
    """An allocator handle: `nbytes` bytes at byte `offset` of a wgpu buffer (offset 0 unless it is a view)."""

    buffer: Any
    offset: int
    nbytes: int

    @property
    def binding_size(self) -> int:
        return max(4, _words(self.nbytes))


def _nothing() -> None:
    pass


def _destroy(buffer: Any) -> None:
    buffer.destroy()


def _words(nbytes: int) -> int:
    return (nbytes + 3) // 4 * 4


def load_wgpu() -> Any:
    """The wgpu module, imported on first use (importing the plugin must stay cheap)."""
    import wgpu  # type: ignore[import-untyped]  # wgpu ships no type information

    return wgpu


_lock = threading.Lock()
_adapter: Any = None


def get_adapter() -> Any:
    """The adapter WebGPU picks (high-performance preference), requested once per process; None if there is none."""
    global _adapter
    with _lock:
        if _adapter is None:
            wgpu = load_wgpu()
            with without_driver_noise():
                _adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance") or False
        return _adapter or None


# lines Vulkan drivers print on stderr while the adapter is found that are no error for an xgrad user: Mesa's window
# system code (loaded by lavapipe too) asks for a Wayland socket on a headless machine without XDG_RUNTIME_DIR
DRIVER_NOISE = frozenset({"error: XDG_RUNTIME_DIR is invalid or not set in the environment."})


@contextlib.contextmanager
def without_driver_noise() -> Iterator[None]:
    """Run the body with file descriptor 2 sent to a temporary file, then pass on to the real stderr every line
    but the DRIVER_NOISE ones. The drivers write to fd 2 from C, which no Python-level redirect sees; the user's
    environment (XDG_RUNTIME_DIR) is left alone."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if line.strip() not in DRIVER_NOISE)
            if kept:
                os.write(2, kept.encode())


def cpu_adapter(info: Mapping[str, Any]) -> CpuAdapter | None:
    """The threads and SIMD lanes of an adapter that is a CPU driver (`adapter_type` CPU: lavapipe), None for a GPU.
    lavapipe runs one thread per core and names its vector width in bits in the device name (`llvmpipe (LLVM 15.0.6,
    256 bits)`); 256 bits (8 float lanes, what it picks on AVX2 and AVX-512 hosts alike) when the name does not."""
    if str(info.get("adapter_type", "")).upper() != "CPU":
        return None
    bits = re.search(r"(\d+) bits", str(info.get("device", "")))
    lanes = max(1, int(bits.group(1)) // 32) if bits else 8
    return CpuAdapter(threads=os.cpu_count() or 1, lanes=lanes)


def describe_adapter(adapter: Any) -> str:
    info = adapter.info
    return f"{info.get('device', '?')} ({info.get('backend_type', '?')}, {info.get('description', '')})"


class WebGPUAllocator:
    """Storage buffers of one wgpu device."""

    def __init__(self, device: Any, offset_alignment: int) -> None:
        wgpu = load_wgpu()

        self.device = device
        self.offset_alignment = offset_alignment
        self.usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self.before_queue_use: Callable[[], None] = _nothing  # the device submits its recorded dispatches here
        self.release: Callable[[Any], None] = _destroy  # the device defers this while dispatches are recorded

    def alloc(self, nbytes: int) -> WebGPUBuffer:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes: {nbytes}")
        limit = self.device.limits["max-storage-buffer-binding-size"]
        if nbytes > limit:
            raise DeviceError(f"WEBGPU buffer of {nbytes} bytes exceeds the adapter's storage binding limit {limit}")
        return WebGPUBuffer(self.device.create_buffer(size=max(4, _words(nbytes)), usage=self.usage), 0, nbytes)

    def free(self, handle: WebGPUBuffer, nbytes: int) -> None:
        self.release(handle.buffer)  # wgpu keeps a destroyed buffer alive until submitted work that uses it is done

    def copyin(self, dest: WebGPUBuffer, src: memoryview) -> None:
        data = bytes(src.cast("B") if src.format != "B" or src.ndim != 1 else src)
        if len(data) != dest.nbytes:
            raise ValueError(f"copyin of {len(data)} bytes into a buffer of {dest.nbytes} bytes")
        if not data:
            return
        self.before_queue_use()
        if len(data) % 4 or dest.offset % 4:  # write whole words: keep the bytes around ours
            start = dest.offset - dest.offset % 4
            old = bytearray(self._read(dest.buffer, start, _words(dest.offset + len(data)) - start))
            old[dest.offset - start : dest.offset - start + len(data)] = data
            self.device.queue.write_buffer(dest.buffer, start, bytes(old))
        else:
            self.device.queue.write_buffer(dest.buffer, dest.offset, data)

    def copyout(self, dest: memoryview, src: WebGPUBuffer) -> None:
        dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copyout of a buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
        if not src.nbytes:
            return
        start = src.offset - src.offset % 4
        data = self._read(src.buffer, start, _words(src.offset + src.nbytes) - start)
        dest[:] = data[src.offset - start : src.offset - start + src.nbytes]

    def _read(self, buffer: Any, offset: int, size: int) -> memoryview:
        self.before_queue_use()
        return memoryview(self.device.queue.read_buffer(buffer, buffer_offset=offset, size=size)).cast("B")

    def offset(self, handle: WebGPUBuffer, offset: int, nbytes: int) -> WebGPUBuffer:
        if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) is outside a buffer of {handle.nbytes} bytes")
        start = handle.offset + offset
        if start % self.offset_alignment:
            raise DeviceError(
                f"WEBGPU cannot bind a view at byte {start}: WebGPU binds storage buffers at multiples of "
                f"{self.offset_alignment} bytes; copy the data to a new buffer (e.g. .contiguous()) instead"
            )
        return WebGPUBuffer(handle.buffer, start, nbytes)


@dataclass
class WebGPUProgram:
    """A compute pipeline with its bind group layout: `nbufs` storage buffers, then the variables (if any)."""

    name: str
    pipeline: Any
    layout: Any
    nbufs: int
    has_vars: bool


class WebGPUDevice(CompiledDevice):
    def __init__(self, name: str) -> None:
        wgpu = load_wgpu()

        adapter = get_adapter()
        if adapter is None:
            raise DeviceError(f"{name}: no WebGPU adapter found; {NO_ADAPTER_FIX}")
        self.adapter = adapter
        features = [f for f in WANTED_FEATURES if f in adapter.features]
        self.device = adapter.request_device_sync(required_features=features, label=f"xgrad {name}")
        self.features = frozenset(features)
        self.timestamps = "timestamp-query" in self.features
        alignment = int(self.device.limits["min-storage-buffer-offset-alignment"])
        self.max_groups = int(self.device.limits["max-compute-workgroups-per-dimension"])
        # read by the scheduler (`xgrad.engine.kernel_buffers`): one storage binding stays free for the variables
        self.max_kernel_buffers = int(self.device.limits["max-storage-buffers-per-shader-stage"]) - 1
        cpu = cpu_adapter(adapter.info)
        renderer = WGSLRenderer(",".join(f for f in features if f == F16_FEATURE), self.device.limits, cpu)
        allocator = WebGPUAllocator(self.device, alignment)
        super().__init__(name, allocator, renderer, _NoCompiler(), _no_factory)
        self._wgpu = wgpu
        self._by_ast: dict[UOp, Any] = {}
        self._encoder: Any = None  # the open command encoder: dispatches not submitted yet
        self._pending = 0
        self._doomed: list[Any] = []  # buffers freed while dispatches were recorded: destroyed after their submission
        allocator.before_queue_use = self.flush
        allocator.release = self._release
        self._sync_buffer = self.device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)

    def compile(self, ast: UOp) -> Any:
        """The kernel with its output ranges merged into one parallel range (see `xgrad_webgpu.parallel`)."""
        if (hit := self._by_ast.get(ast)) is not None:
            return hit
        prg = super().compile(merge_output_ranges(ast))
        self._by_ast[ast] = prg
        return prg

    def build(self, name: str, uops: list[UOp], src: str) -> WebGPUProgram:
        """WGSL -> a compute pipeline. The driver's rejection becomes a CompileError with the source and its log."""
        wgpu = self._wgpu
        params = [u for u in uops if u.op is Ops.PARAM]
        written = {u.src[0].src[0].arg for u in uops if u.op is Ops.STORE}
        nbufs = max((u.arg for u in params), default=-1) + 1
        has_vars = any(u.op is Ops.DEFINE_VAR for u in uops)
        storage, read_only = wgpu.BufferBindingType.storage, wgpu.BufferBindingType.read_only_storage
        entries = [
            {
                "binding": i,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": storage if i in written else read_only},
            }
            for i in range(nbufs + int(has_vars))
        ]
        try:
            module = self.device.create_shader_module(code=src, label=name)
            layout = self.device.create_bind_group_layout(entries=entries)
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": "main"},
                label=name,
            )
        except Exception as e:  # wgpu raises GPUValidationError (and friends) with the driver's message
            raise CompileError(
                f"{self.name} ({describe_adapter(self.adapter)}) rejected kernel {name}", source=src, log=str(e)
            ) from None
        return WebGPUProgram(name, pipeline, layout, nbufs, has_vars)

    def launch(
        self, raw: WebGPUProgram, bufs: list[Any], info: ProgramInfo, vals: dict[str, int], wait: bool
    ) -> float | None:
        _, args = launch_args(info, vals)
        counts, _ = info.extra.get("launch", ((1, 1, 1), (1, 1, 1)))  # workgroups per dimension (see program_info)
        x, y, z = (n if isinstance(n, int) else eval_size(n, vals) for n in counts)
        if x <= 0 or y <= 0 or z <= 0:
            return 0.0 if wait else None
        if max(x, y, z) > self.max_groups:
            raise DeviceError(f"kernel {raw.name}: {x}x{y}x{z} workgroups exceed the WebGPU dispatch limit")
        entries = [_binding(i, b) for i, b in enumerate(bufs[: raw.nbufs])]
        if raw.has_vars:
            data = struct.pack(f"<{len(args)}i", *args)
            usage = self._wgpu.BufferUsage.STORAGE
            var_buffer = self.device.create_buffer_with_data(data=data, usage=usage)
            entries.append({"binding": raw.nbufs, "resource": {"buffer": var_buffer}})
        group = self.device.create_bind_group(layout=raw.layout, entries=entries)
        if not wait:  # recorded into the open command encoder; submitted at the next flush
            encoder = self._encoder or self.device.create_command_encoder()
            self._encoder = encoder
            _record_dispatch(encoder, raw.pipeline, group, (x, y, z), None)
            self._pending += 1
            if self._pending >= MAX_PENDING_DISPATCHES:
                self.flush()
            return None
        self.flush()
        query = self._timestamp_query() if self.timestamps else None
        encoder = self.device.create_command_encoder()
        _record_dispatch(encoder, raw.pipeline, group, (x, y, z), query[0] if query else None)
        if query:
            encoder.resolve_query_set(query[1], 0, 2, query[2], 0)
        start = time.perf_counter()
        self.device.queue.submit([encoder.finish()])
        if query:
            t0, t1 = struct.unpack("<2Q", self.device.queue.read_buffer(query[2]))
            return float(t1 - t0) * 1e-9  # WebGPU timestamps are nanoseconds
        self.synchronize()
        return time.perf_counter() - start

    def flush(self) -> None:
        """Submit the dispatches recorded since the last flush (one command buffer for all of them). Copies in and
        out, frees and waits flush first: `queue.write_buffer` and `read_buffer` act at the time of the call."""
        if self._encoder is not None:
            self.device.queue.submit([self._encoder.finish()])
            self._encoder, self._pending = None, 0
        doomed, self._doomed = self._doomed, []
        for buffer in doomed:
            buffer.destroy()

    def _release(self, buffer: Any) -> None:
        # no flush here: the garbage collector may free a buffer while `launch` records into the open encoder
        if self._encoder is None:
            buffer.destroy()
        else:
            self._doomed.append(buffer)

    def _timestamp_query(self) -> tuple[dict[str, Any], Any, Any]:
        wgpu = self._wgpu
        qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        out = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        writes = {"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        return writes, qs, out

    def synchronize(self) -> None:
        # reading a buffer waits for all submitted work (queue order); wgpu 0.32's on_submitted_work_done_sync is
        # broken (a cffi callback signature mismatch), so this is the portable way to wait
        self.flush()
        self.device.queue.read_buffer(self._sync_buffer)

    def __repr__(self) -> str:
        return f"WebGPUDevice({self.name!r}, {describe_adapter(self.adapter)})"


NO_ADAPTER_FIX = "install a Vulkan driver (for a CPU one: apt-get install mesa-vulkan-drivers)"


def _record_dispatch(
    encoder: Any, pipeline: Any, group: Any, groups: tuple[int, int, int], timestamps: dict[str, Any] | None
) -> None:
    # one compute pass per dispatch: WebGPU orders the passes of an encoder, so a kernel sees its producers' writes
    cpass = encoder.begin_compute_pass(timestamp_writes=timestamps)
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(groups[0], groups[1], groups[2])
    cpass.end()


def _binding(i: int, b: WebGPUBuffer) -> dict[str, Any]:
    return {"binding": i, "resource": {"buffer": b.buffer, "offset": b.offset, "size": b.binding_size}}


class _NoCompiler:
    """WGSL goes to the driver as source; `WebGPUDevice.build` makes the pipeline."""

    def compile(self, src: str) -> bytes:
        return src.encode()


def _no_factory(name: str, lib: bytes) -> Any:
    raise AssertionError("WebGPUDevice.build makes programs")
