"""Running a pipeline of named passes: one hook around every pass, for timing and dumps.

In: a pass (a name and a function from graph to graph) and the graph. Out: the pass's result, after every registered
hook has seen it. The scheduler (`xgrad.engine.schedule.create_schedule`) runs its passes through `run_pass`; with
`DEBUG>=6` each pass's result is printed after it runs, as codegen's pipeline does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from xgrad.helpers import DEBUG
from xgrad.uop.ops import UOp

PassHook = Callable[[str, UOp, float], None]
DUMP_LEVEL = 6  # DEBUG at or above this prints the graph after every pass
_hooks: list[PassHook] = []


def add_pass_hook(hook: PassHook) -> None:
    """Call `hook(pass_name, graph_after, seconds)` after every pass run through `run_pass` (timing, dumps)."""
    _hooks.append(hook)


def remove_pass_hook(hook: PassHook) -> None:
    """Stop calling a hook added with `add_pass_hook`."""
    _hooks.remove(hook)


def run_pass(name: str, fn: Callable[[UOp], UOp], graph: UOp, dump: Callable[[UOp], str] | None = None) -> UOp:
    """`fn(graph)`, reported to the hooks as pass `name`. `dump` says what `DEBUG>=6` prints of the result (default:
    the graph itself); a pass whose result lives in its context rather than in the graph says it there."""
    start = time.perf_counter()
    out = fn(graph)
    if _hooks:
        seconds = time.perf_counter() - start
        for hook in _hooks:
            hook(name, out, seconds)
    if DEBUG >= DUMP_LEVEL:
        print(f"--- after {name} ---\n{out if dump is None else dump(out)}")
    return out


__all__ = ["DUMP_LEVEL", "PassHook", "add_pass_hook", "remove_pass_hook", "run_pass"]
