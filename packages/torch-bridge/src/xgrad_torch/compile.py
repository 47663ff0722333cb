"""`torch.compile(model, backend="xgrad")`: dynamo captures the program, aot_autograd splits it into a forward and a
backward aten graph, and each graph runs as one TinyJit'd xgrad function.

In: an FX graph of aten ops over tensors on `xgrad` (dynamo + aot_autograd, torch's documented route for custom
backends). Out: a callable that, from the third call on, replays the captured xgrad kernels on the new inputs'
buffers with no Python per op: no torch dispatch, no graph building, no scheduling.

The first call of a graph runs it through the bridge's aten kernels (the same ones eager mode uses) on xgrad
Tensors that wrap the inputs, the second captures the kernels it realizes, later calls replay them. As with torch's
CUDA graphs (`mode="reduce-overhead"`), the outputs of a replay live in the captured buffers: a graph's outputs are
valid until the same graph runs again (a training step reads its loss and uses the forward's saved tensors before
the next step's forward). Clone an output to keep it longer. Shapes are static: a new input shape is a new graph
(dynamo recompiles), so the backend asks for `dynamic=False` graphs and refuses symbolic sizes with a BridgeError.

Importing this module registers the backend name (the package also declares it as a `torch_dynamo_backends` entry
point, so an installed xgrad_torch needs no import beyond `import xgrad_torch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd

from xgrad import Tensor, TinyJit

from . import storage
from .registration import BridgeError
from .storage import read, wrap


class CompiledGraph:
    """One aten graph as a TinyJit'd xgrad function over the graph's tensor inputs."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.kinds: list[str] = []  # per output: "tensor", "alias" (a view of an input) or "value" (a constant)
        self.values: list[Any] = []
        self.aliases: list[tuple[int, list[int], list[int], int]] = []  # (input, size, stride, offset)
        self.dtypes: list[torch.dtype] = []
        for x in example_inputs:
            if isinstance(x, torch.SymInt) or (
                isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)
            ):
                raise BridgeError("the xgrad backend compiles static shapes; call torch.compile(..., dynamic=False)")
        self.jit: TinyJit[list[Tensor]] = TinyJit(self._run)

    def _run(self, *unique: Tensor) -> list[Tensor]:
        xs = [unique[i] for i in self.positions]
        args = [wrap(x, dtype) for x, dtype in zip(xs, self.input_dtypes)]
        holders = {id(storage.holder_of(a)): i for i, a in enumerate(args)}
        outs = self.gm(*args)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        self.kinds, self.values, self.dtypes, self.aliases = [], [], [], []
        tensors: list[Tensor] = []
        for o in outs:
            if isinstance(o, torch.Tensor) and o.device.type == "xgrad" and id(storage.holder_of(o)) in holders:
                # an input (or a view of one) saved for backward: rebuilt from the call's own input, outside the
                # capture, so a replay never returns the buffer the capture saw
                self.kinds.append("alias")
                self.aliases.append(
                    (holders[id(storage.holder_of(o))], list(o.shape), list(o.stride()), int(o.storage_offset()))
                )
            elif isinstance(o, torch.Tensor):
                if o.device.type != "xgrad":
                    raise BridgeError(f"a compiled graph returned a tensor on {o.device}; move its inputs to xgrad")
                self.kinds.append("tensor")
                self.dtypes.append(o.dtype)
                tensors.append(read(o))
            else:
                self.kinds.append("value")
                self.values.append(o)
        return tensors

    def __call__(self, *args: Any) -> list[Any]:
        self.input_dtypes = [a.dtype for a in args]
        xs = []
        for a in args:
            if not isinstance(a, torch.Tensor) or a.device.type not in ("xgrad", "cpu"):
                raise BridgeError(f"the xgrad backend got an input on {getattr(a, 'device', type(a).__name__)}; "
                                  "move the model and its inputs to 'xgrad' before calling it")  # fmt: skip
            # a CPU input (an optimizer's step count) is copied in; the graph then runs it on xgrad
            xs.append(read(a) if a.device.type == "xgrad" else storage.from_cpu(a).realize())
        storage.flush()  # pending writes to inputs (an optimizer's step) first: the replay reads their buffers
        # one xgrad Tensor per storage read whole: a tensor passed twice (or two sharing a storage) goes in once
        first: dict[int, int] = {}
        unique: list[Tensor] = []
        for x in xs:
            if id(x) not in first:
                first[id(x)] = len(unique)
                unique.append(x)
        positions = [first[id(x)] for x in xs]
        if positions != getattr(self, "positions", positions):
            self.jit.reset()  # a different aliasing of the inputs: capture again
        self.positions = positions
        tensors = iter(self.jit(*unique))
        values, dtypes, aliases = iter(self.values), iter(self.dtypes), iter(self.aliases)
        out: list[Any] = []
        for kind in self.kinds:
            if kind == "tensor":
                out.append(wrap(next(tensors), next(dtypes)))
            elif kind == "alias":
                i, size, stride, offset = next(aliases)
                out.append(torch.ops.aten.as_strided.default(args[i], size, stride, offset))
            else:
                out.append(next(values))
        return out


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """aot_autograd's compiler for the forward and the backward graph: a CompiledGraph (boxed-call convention)."""
    compiled = CompiledGraph(gm, example_inputs)

    def run(args: list[Any]) -> list[Any]:
        inputs = list(args)
        args.clear()  # the boxed convention: free the inputs as early as torch allows
        return compiled(*inputs)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


xgrad_backend = aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph)
xgrad_backend.__doc__ = "torch.compile backend 'xgrad': aot_autograd graphs run as TinyJit'd xgrad functions."
register_backend(xgrad_backend, name="xgrad")
