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

In-place writes to inputs (an optimizer's step, BatchNorm's running statistics) stay in the graph (aot_autograd's
keep_inference_input_mutations), each moved to just after its value is computed (`_assign_early`): an input that
is a whole buffer of its own is assigned there, inside the capture, and later ops read it, so a replay updates
parameters and states where they lie with no copy back and each new value is computed once; a small CPU input
(Adam's step count) keeps an xgrad buffer between calls and only its new value is copied back to the host. TinyJit
gets whole buffers where it can: a view input (a transposed weight saved for backward) goes in as its storage and
the view is taken inside the capture; outputs over one storage are realized once and handed back as views of it.

Importing this module registers the backend name (the package also declares it as a `torch_dynamo_backends` entry
point, so an installed xgrad_torch needs no import beyond `import xgrad_torch`).
"""

from __future__ import annotations

import operator
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd

from xgrad import Tensor, TinyJit, UOp

from . import storage
from .registration import BridgeError
from .storage import read, to_torch_dtype, wrap

_uop_of = operator.attrgetter("uop")
KEEP_CPU_INPUT = 16  # a CPU input of up to this many elements keeps its buffer between calls
_CONSTANT_OPS = {"CONST", "DEVICE", "RESHAPE", "EXPAND", "CAST"}  # the nodes of a lazy constant (ones_like, zeros)


InputRead = tuple[Tensor, tuple[list[int], list[int], int] | None, bool]  # what `CompiledGraph._input` returns


class CompiledGraph:
    """One aten graph as a TinyJit'd xgrad function over the graph's tensor inputs."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.kinds: list[str] = []  # per output: "tensor", "view" (of a captured tensor), "alias" (a view of an input)
        # or "value" (a constant)
        self.values: list[Any] = []
        self.aliases: list[tuple[int, list[int], list[int], int, bool]] = []  # (input, size, stride, offset, whether
        # that is the input's own layout)
        self.dtypes: list[torch.dtype] = []
        self.views: list[tuple[int, list[int], list[int], int, bool]] = []  # (captured tensor, size, stride, offset,
        # whether that is all of the tensor in its own shape)
        self.slots: list[int] = []  # per "tensor" output: its position among the captured tensors
        self.mutated: list[tuple[int, int]] = []  # (input, captured tensor): inputs written in place whose new values
        # come back as extra outputs
        self.assigned: list[int] = []  # inputs written in place by an assign inside the capture
        self.cpu_inputs: dict[int, tuple[weakref.ref[torch.Tensor], bytes, Tensor]] = {}  # k -> its values, buffer
        self.host_inputs: set[int] = set()  # the inputs that are CPU tensors
        self.seen: dict[int, tuple[weakref.ref[torch.Tensor], storage.Holder, Tensor, InputRead]] = {}  # k -> the
        # last call's input k (its holder and the holder's Tensor then) as read
        self.host_reads: list[tuple[int, list[int]]] = []  # (captured tensor, the CPU inputs whose new values it holds)
        self.constants: dict[int, tuple[UOp, Tensor]] = {}  # k -> a lazy constant input's node and its buffer
        for x in example_inputs:
            if isinstance(x, torch.SymInt) or (
                isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape)
            ):
                raise BridgeError("the xgrad backend compiles static shapes; call torch.compile(..., dynamic=False)")
        self.jit: TinyJit[list[Tensor]] = TinyJit(self._run)
        self.positions: list[int] = []  # per input: its position among the Tensors passed to the TinyJit
        self.assignable: list[bool] = []  # per input: written by an assign into its own buffer
        self.input_views: list[tuple[list[int], list[int], int] | None] = []  # per input: the view taken inside
        self.input_dtypes: list[torch.dtype | None] = []
        self.early: list[Tensor] = []  # assigns made while the graph runs (`assign_input`), realized at its end
        self.assigned_early: set[int] = set()
        self.running: tuple[list[torch.Tensor], list[Tensor], dict[int, int]] = ([], [], {})
        _assign_early(gm)
        self.written = _written_inputs(gm)

    def _run(self, *unique: Tensor) -> list[Tensor]:
        xs = [unique[i] for i in self.positions]
        args = [
            wrap(x, dtype) if view is None else torch.ops.aten.as_strided.default(wrap(x, dtype), *view)
            for x, dtype, view in zip(xs, self.input_dtypes, self.input_views)
        ]
        holders = {id(storage.holder_of(a)): i for i, a in enumerate(args)}
        self.running, self.early, self.assigned_early = (args, xs, holders), [], set()
        _RUNNING.append(self)
        try:
            outs = self.gm(*args)
        finally:
            _RUNNING.pop()
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        self.kinds, self.values, self.dtypes, self.aliases, self.views, self.slots = [], [], [], [], [], []
        tensors: list[Tensor] = []
        shared: dict[int, int] = {}  # outputs per storage (not counting inputs')
        for o in outs:
            if isinstance(o, torch.Tensor) and o.device.type == "xgrad":
                h = storage.holder_of(o)
                if id(h) not in holders:
                    shared[id(h)] = shared.get(id(h), 0) + 1
        wholes: dict[int, int] = {}  # storage -> its position among the captured tensors
        for o in outs:
            if isinstance(o, torch.Tensor) and o.device.type == "xgrad" and id(storage.holder_of(o)) in holders:
                # an input (or a view of one) saved for backward: rebuilt from the call's own input, outside the
                # capture, so a replay never returns the buffer the capture saw
                self.kinds.append("alias")
                i, layout = (
                    holders[id(storage.holder_of(o))],
                    (list(o.shape), list(o.stride()), int(o.storage_offset())),
                )
                same = layout == (list(args[i].shape), list(args[i].stride()), args[i].storage_offset())
                self.aliases.append((i, *layout, same))
            elif isinstance(o, torch.Tensor):
                if o.device.type != "xgrad":
                    raise BridgeError(f"a compiled graph returned a tensor on {o.device}; move its inputs to xgrad")
                h = storage.holder_of(o)
                if shared.get(id(h), 0) > 1 and o.dtype == to_torch_dtype(h.whole.dtype):
                    # several outputs over one storage (relu and its flattened view, both saved for backward): the
                    # storage is realized once and each output is rebuilt as a view of it, outside the capture,
                    # instead of xgrad giving each its own copy
                    if id(h) not in wholes:
                        wholes[id(h)] = len(tensors)
                        tensors.append(h.whole)
                    self.kinds.append("view")
                    size, stride, offset = list(o.shape), list(o.stride()), int(o.storage_offset())
                    same = (size, offset) == (list(h.whole.shape), 0) and tuple(stride) == storage._contiguous(o.shape)
                    self.views.append((wholes[id(h)], size, stride, offset, same))
                    continue
                self.kinds.append("tensor")
                self.dtypes.append(o.dtype)
                self.slots.append(len(tensors))
                tensors.append(read(o))
            else:
                self.kinds.append("value")
                self.values.append(o)
        # inputs the graph wrote in place (aot_autograd keeps an inference graph's input mutations as copy_ ops): an
        # input that is a whole buffer of its own is assigned inside the capture, so a replay updates it where it
        # lies with no copy back; any other comes back as an extra output, written into the input after the call
        self.mutated, self.assigned, assigns = [], sorted(self.assigned_early), list(self.early)
        for i, (a, x) in enumerate(zip(args, xs)):
            if storage.holder_of(a).whole is x:
                continue
            new = read(a)
            if self.assignable[i]:
                self.assigned.append(i)
                assigns.append(x.assign(new if new.dtype == x.dtype else new.cast(x.dtype)))
            else:
                self.mutated.append((i, len(tensors)))
                tensors.append(new)
        # CPU inputs assigned in the capture (Adam's step counts) go back to the host after each call: their new
        # values are gathered into one tensor per dtype, read with one copy to the host instead of one per input
        groups: dict[Any, list[int]] = {}
        for i in self.assigned:
            if i in self.host_inputs:
                groups.setdefault(xs[i].dtype, []).append(i)
        self.host_reads = []
        for idx in groups.values():
            self.host_reads.append((len(tensors), idx))
            tensors.append(Tensor.cat(*(xs[i].reshape(-1) for i in idx)) if len(idx) > 1 else xs[idx[0]].reshape(-1))
        if assigns:
            Tensor.realize(*tensors, *assigns)
        return tensors

    def assign(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """`dst.copy_(src)` for an input `dst` of the running graph: an assign into the input's own buffer when it
        has one, and later reads of `dst` read the assign (as native xgrad's optimizers read their states)."""
        args, xs, holders = self.running
        i = holders.get(id(storage.holder_of(dst)))
        if i is None or args[i] is not dst or not self.assignable[i] or src.shape != dst.shape:
            return dst.copy_(src)
        x, new = xs[i], read(src)
        self.early.append(x.assign(new if new.dtype == x.dtype else new.cast(x.dtype)))
        storage.holder_of(dst).set(x)
        self.assigned_early.add(i)
        return dst

    def _input(self, k: int, a: Any) -> InputRead:
        """Input `k` as an xgrad Tensor, the view of it the graph takes (None: all of it), and whether the input is
        the whole of a buffer of its own (an in-place write to it can be an assign into that buffer).

        A view of a storage (a transposed weight saved for backward) goes in as the storage's whole buffer and is
        taken inside the capture, where it folds into the kernels and leaves TinyJit a plain buffer to swap. A small
        CPU tensor (an optimizer's step count) is copied into a buffer kept for the next call, which passes that
        buffer again, with no copy, while the tensor still holds the values the buffer holds (the ones the last
        call wrote back); only this graph writes that buffer. An input that is the same torch tensor as in the last
        call, over the same storage holding the same xgrad Tensor (a parameter, an optimizer's state), is read as it
        was then, with no look at its layout (dynamo guards the layouts of its inputs; a graph's other inputs are
        the tensors aot_autograd saved, which nothing reshapes in place)."""
        seen = self.seen.get(k)
        if seen is not None and seen[2] is seen[1].whole and (last := seen[0]()) is a:
            if getattr(last.untyped_storage(), "_xgrad", None) is seen[1]:
                return seen[3]  # the tensor of the last call (a parameter, a state), holding the same xgrad Tensor
        cpu = isinstance(a, torch.Tensor) and a.is_cpu
        h = None if cpu else getattr(a.untyped_storage(), "_xgrad", None) if isinstance(a, torch.Tensor) else None
        if not isinstance(h, storage.Holder) and not cpu:
            raise BridgeError(f"the xgrad backend got an input on {getattr(a, 'device', type(a).__name__)}; "
                              "move the model and its inputs to 'xgrad' before calling it")  # fmt: skip
        if h is not None:  # (tested through the storage's holder: a torch.device object per input costs more)
            read_in = self._xgrad_input(k, a, h)
            if read_in[0] is h.whole:  # (not a converted copy, which would go stale when the buffer is written)
                self.seen[k] = (weakref.ref(a), h, h.whole, read_in)
            return read_in
        self.host_inputs.add(k)
        if a.numel() > KEEP_CPU_INPUT or a.dtype == torch.bfloat16:
            return storage.from_cpu(a).realize(), None, False
        kept = self.cpu_inputs.get(k)
        values = a.detach().numpy().tobytes()
        if kept is not None and kept[0]() is a and values == kept[1]:
            return kept[2], None, True
        x = storage.from_cpu(a).realize()
        self.cpu_inputs[k] = (weakref.ref(a), values, x)
        return x, None, True

    def _xgrad_input(self, k: int, a: torch.Tensor, h: storage.Holder) -> InputRead:
        """`_input` for a tensor on `xgrad`, whose storage's holder is `h`."""
        whole, shape = h.whole, tuple(a.shape)
        constant = self._constant(k, h)
        if constant is not None:
            whole = constant
        if a.dtype != to_torch_dtype(whole.dtype):
            return read(a), None, False
        if a.storage_offset() == 0 and a.is_contiguous():
            if whole.shape == shape:  # (a constant's buffer, reused each call, is never written by an assign)
                return whole, None, constant is None and id(whole) not in _CONSTANT_BUFFERS
            if a.numel() == h.numel:  # (reshaped inside the capture: TinyJit's replay takes the buffer as it is)
                return whole, (list(shape), list(a.stride()), 0), False
        return whole, (list(shape), list(a.stride()), int(a.storage_offset())), False

    def _constant(self, k: int, h: storage.Holder) -> Tensor | None:
        """The realized buffer standing for input `k` when the input is a lazy constant (the backward's incoming
        gradient, `ones_like(loss)`, every step), else None. UOps are hash-consed, so the same constant is the same
        node each call: its buffer is made once and reused, where realizing it each call cost a schedule and a
        kernel and sent TinyJit down its slow path. The buffer is only read (an input written in place is never
        given one)."""
        if k in self.written:
            return None
        kept = self.constants.get(k)
        uop = h.whole.uop
        if kept is not None and kept[0] is uop:
            x = kept[1]
        elif uop.plain_buffer or not all(u.op.name in _CONSTANT_OPS for u in uop.walk()):
            return None
        else:
            x = h.whole.contiguous().realize()
            self.constants[k] = (uop, x)
            _CONSTANT_BUFFERS.add(id(x))
        h.set(x)  # the torch tensor reads the buffer too: nothing left to realize for it
        storage.discard_pending(h)
        return x

    def __call__(self, *args: Any) -> list[Any]:
        self.host_inputs = set()
        read_in = [self._input(k, a) for k, a in enumerate(args)]
        xs, views, owns = (list(column) for column in zip(*read_in)) if read_in else ([], [], [])
        storage.flush()  # pending writes to inputs (an optimizer's step) first: the replay reads their buffers
        # one xgrad Tensor per graph node: a tensor passed twice, two sharing a storage, or two storages holding the
        # same lazy value (optimizer states made by zeros_like, which realize to one buffer) go in once, and none
        # of them is written by an assign. (Every call of every graph does this over all its inputs: built from
        # dict and map calls, which run no Python bytecode per input.)
        ids = list(map(id, map(_uop_of, xs)))
        unique_ids = list(dict.fromkeys(ids))  # in the order of their first input
        first_tensor = dict(zip(reversed(ids), reversed(xs)))  # (a node's first input is written last, so it stays)
        unique: list[Tensor] = list(map(first_tensor.__getitem__, unique_ids))
        positions = list(map(dict(zip(unique_ids, range(len(unique_ids)))).__getitem__, ids))
        if len(unique_ids) == len(ids):  # (the common case: no input shares a node with another)
            assignable = owns
        else:
            uses = Counter(positions)
            assignable = [own and uses[p] == 1 for own, p in zip(owns, positions)]
        if (positions, assignable, views) != (self.positions, self.assignable, self.input_views):
            self.jit.reset()  # a different aliasing or view of the inputs: capture again
        self.positions, self.assignable, self.input_views = positions, assignable, views
        if self.jit.cnt < 2:  # the graph runs (eager, or captured): its inputs are wrapped in their dtypes
            self.input_dtypes = [a.dtype if isinstance(a, torch.Tensor) else None for a in args]
        results = self.jit(*unique)
        values, dtypes, aliases, out_views = iter(self.values), iter(self.dtypes), iter(self.aliases), iter(self.views)
        slots = iter(self.slots)
        bases: dict[int, torch.Tensor] = {}
        out: list[Any] = []
        for kind in self.kinds:
            if kind == "tensor":
                out.append(wrap(results[next(slots)], next(dtypes)))
            elif kind == "view":  # (whether a view is all of its storage, or an alias all of its input, was
                j, size, stride, offset, same = next(out_views)  # decided at the capture: layouts are static)
                if j not in bases:
                    bases[j] = wrap(results[j])
                base = bases[j]
                out.append(base if same else torch.ops.aten.as_strided.default(base, size, stride, offset))
            elif kind == "alias":
                i, size, stride, offset, same = next(aliases)
                a = args[i]  # the input itself (a primal saved for backward) needs no view op
                out.append(a if same else torch.ops.aten.as_strided.default(a, size, stride, offset))
            else:
                out.append(next(values))
        for i, slot in self.mutated:
            self._write_back(args[i], results[slot])
        for slot, idx in self.host_reads:  # CPU inputs assigned in the capture: their new values go to the host
            new, start = results[slot].numpy(), 0
            for k in idx:
                host = args[k].detach().numpy()  # (aot_autograd's copy_ would bump the version counter; a step
                host[...] = new[start : start + host.size].reshape(host.shape)  # count's readers never look)
                start += host.size
                self.cpu_inputs[k] = (self.cpu_inputs[k][0], host.tobytes(), self.cpu_inputs[k][2])
        return out

    @staticmethod
    def _write_back(a: torch.Tensor, new: Tensor) -> None:
        """Input `a` takes the value `new` (what aot_autograd's copy_ back into a mutated input would do)."""
        if a.device.type == "xgrad":
            storage.write(a, new)
            return
        if a.dtype != torch.bfloat16 and a.is_contiguous():
            a.detach().numpy()[...] = new.numpy().reshape(a.shape)  # (aot_autograd bumps the version counter)
            return
        with torch.no_grad():
            a.copy_(storage.to_cpu_tensor(wrap(new, a.dtype)))


_RUNNING: list[CompiledGraph] = []  # the graph whose aten ops are running (innermost last)
# ids of the buffers made for lazy constant inputs (`_constant`): a torch tensor holding one may be passed to another
# graph, which must not assign into it (an id reused after its graph is gone only costs that assign)
_CONSTANT_BUFFERS: set[int] = set()


def assign_input(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """What `_assign_early` puts in place of `copy_(input, value)`: the running graph's assign into the input."""
    if not _RUNNING:
        return dst.copy_(src)
    return _RUNNING[-1].assign(dst, src)


def _assign_early(gm: torch.fx.GraphModule) -> None:
    """Move each `copy_(input, value)` that aot_autograd leaves at the end of an inference graph to just after the
    input's last read and the value's computation, and let the ops after it read the input instead of the value.
    Run as an assign (`assign_input`), the new value is then computed once, into the input's buffer, and read from
    there (Adam's update reads the new moments), where a copy_ at the end made xgrad keep the value in a buffer of
    its own and copy it into the input."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default or node.users:
            continue
        dst, src = node.args[0], node.args[1]
        if len(node.args) != 2 or node.kwargs or not isinstance(dst, torch.fx.Node) or dst.op != "placeholder":
            continue
        if not isinstance(src, torch.fx.Node) or src.op == "placeholder" or not _same_layout(src, dst):
            continue  # (ops reading the input instead of the value must see the same dtype, shape and strides)
        order = {n: k for k, n in enumerate(graph.nodes)}
        last = max([order[src], *(order[u] for u in dst.users if u is not node)])
        after = next(n for n, k in order.items() if k == last)
        with graph.inserting_after(after):
            moved = graph.call_function(assign_input, (dst, src))
        for user in list(src.users):
            if user is not node and user is not moved and order.get(user, -1) > last:
                user.replace_input_with(src, dst)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()


def _written_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The positions of the graph's inputs that it writes in place (a functionalized graph writes an input only
    through a `copy_` into it, or the `assign_input` that `_assign_early` made of one)."""
    placeholders = {n: k for k, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    return {
        placeholders[n.args[0]]
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target in (torch.ops.aten.copy_.default, assign_input)
        and n.args
        and n.args[0] in placeholders
    }


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Whether two graph values have the same dtype, shape and strides (from the fake tensors aot_autograd traced)."""
    x, y = a.meta.get("val"), b.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    return x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """aot_autograd's compiler for the forward and the backward graph: a CompiledGraph (boxed-call convention)."""
    compiled = CompiledGraph(gm, example_inputs)

    def run(args: list[Any]) -> list[Any]:
        inputs = list(args)
        args.clear()  # the boxed convention: free the inputs as early as torch allows
        return compiled(*inputs)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


# keep_inference_input_mutations: an inference graph (an optimizer's step) keeps its writes to inputs as copy_
# ops, which run as assigns inside the capture, instead of returning new values for torch to copy back one by one
xgrad_backend = aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph, keep_inference_input_mutations=True)
xgrad_backend.__doc__ = "torch.compile backend 'xgrad': aot_autograd graphs run as TinyJit'd xgrad functions."
register_backend(xgrad_backend, name="xgrad")
