"""The codegen pipeline: one function that lists every pass from kernel AST to linear program, in order.

IR in: a kernel AST from the scheduler. IR out: a linear program for a renderer (see xgrad.uop.ops, stage 3).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from xgrad.dtype import DType
from xgrad.helpers import DEBUG, SPEC, TRANSCENDENTAL
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.passes import add_pass_hook, run_pass
from xgrad.uop.pattern import PatternMatcher, graph_rewrite
from xgrad.uop.spec import check_linear
from xgrad.uop.symbolic import simplify
from xgrad_codegen.decompose import decompositions_for as _decompositions
from xgrad_codegen.fold import fold_indexes
from xgrad_codegen.gates import hoist_gates
from xgrad_codegen.gpu import lower_gpu
from xgrad_codegen.gpu_opt import optimize_for
from xgrad_codegen.limits import check_index_bounds
from xgrad_codegen.linearize import linearize
from xgrad_codegen.opt import Opt, expand_lanes
from xgrad_codegen.renderer import Renderer
from xgrad_codegen.vectorize import vectorize

# every pass runs through core's `run_pass`, as the scheduler's do: one hook (`add_pass_hook`) sees both pipelines
__all__ = ["add_pass_hook", "before_optimize", "decompositions_for", "full_rewrite"]


# the passes before `optimize`, which chooses its actions on the kernel as they leave it (so does search.heuristic):
# index math past int32 is refused, movement-op index math collapses, sliding-window remainders (conv, pool) become
# sums
BEFORE_OPTIMIZE: tuple[tuple[str, Callable[[UOp], UOp]], ...] = (
    ("check index bounds", check_index_bounds),  # an index past int32 would wrap: refuse it (ShapeError)
    ("simplify indexes", simplify),
    ("fold remainders", fold_indexes),
)


def before_optimize(ast: UOp) -> UOp:
    """`ast` as `optimize` sees it in `full_rewrite`: the actions BEAM and the heuristic choose index its ranges."""
    for _, fn in BEFORE_OPTIMIZE:
        ast = fn(ast)
    return ast


def full_rewrite(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> list[UOp]:
    """Kernel AST -> linear program for `renderer`."""
    for name, fn in BEFORE_OPTIMIZE:
        ast = run_pass(name, fn, ast)
    # split and re-kind ranges (parallel, upcast, unroll, pack; on a GPU workgroups: local, group)
    ast = run_pass("optimize", lambda a: optimize_for(a, renderer, opts), ast)
    ast = run_pass("expand lanes", expand_lanes, ast)  # UPCAST/UNROLL ranges become straight-line lanes
    ast = run_pass("simplify lanes", simplify, ast)  # each lane's constant index folds
    ast = run_pass("hoist gates", hoist_gates, ast)  # a sum of gated loads skips its loop when their gate is off
    # GPU: group reductions meet in shared memory; workgroup ranges become SPECIAL ids (nothing on a CPU)
    ast = run_pass("lower gpu", lambda a: lower_gpu(a, renderer), ast)
    for name, pm in decompositions_for(renderer):  # ops and dtypes the target lacks
        ast = run_pass(name, functools.partial(_rewrite, pm=pm, name=name), ast)
    masked = renderer.masked_stores
    width = renderer.max_vector_width
    # neighbouring lanes: vector loads/ALU/stores
    ast = run_pass("vectorize", lambda a: vectorize(a, width, masked), ast)
    uops = linearize(ast)  # loops, accumulators, order
    if SPEC:
        check_linear(uops)  # the contract with renderers and the PYTHON executor
    if DEBUG >= 5:
        print("\n".join(f"{i:4d} {u.op.name:12s} {u.dtype.name:10s} {u.arg!r}" for i, u in enumerate(uops)))
    assert uops[-1].op is Ops.SINK
    return uops


def _rewrite(ast: UOp, pm: PatternMatcher, name: str) -> UOp:
    return graph_rewrite(ast, pm, name=name)


# what TRANSCENDENTAL=2 approximates in software even where the target has the op (to test the approximations)
TRANSCENDENTAL_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})


@dataclass(frozen=True)
class _Declared:
    """The two attributes `decompositions_for` reads from a renderer, for a renderer seen without some ops."""

    supported_ops: frozenset[Ops]
    native_dtypes: frozenset[DType]


def decompositions_for(renderer: Renderer) -> list[tuple[str, PatternMatcher]]:
    """The decomposition passes for what `renderer` lacks (with TRANSCENDENTAL>=2 also exp2, log2 and sin)."""
    if TRANSCENDENTAL.value >= 2:
        return _decompositions(_Declared(renderer.supported_ops - TRANSCENDENTAL_OPS, renderer.native_dtypes))
    return _decompositions(renderer)
