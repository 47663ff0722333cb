"""Parsed PTX instructions -> closures over numpy arrays, once per kernel.

In: a parsed `.entry` body. Out: a list of `Decoded` steps in program order: a closure `step(threads, mask)` for
ordinary instructions (it computes every lane and writes the lanes of `mask`), or a control kind (branch with its
target, exit, barrier) that the scheduler in `machine.py` carries out. The opcode table `OPS` maps an opcode's first
part to its decoder; the decoders live by instruction class in `alu.py`, `convert.py`, `memory.py` and `warp.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xgrad_nv.emulate import alu, asynccopy, bits, convert, memory, warp
from xgrad_nv.emulate.errors import EmulatorError
from xgrad_nv.emulate.parse import Function, Instruction
from xgrad_nv.emulate.values import Decoder, Mask, Step

NORMAL, BRANCH, EXIT, BARRIER = 0, 1, 2, 3

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {
    **alu.OPS,
    **asynccopy.OPS,
    **bits.OPS,
    **convert.OPS,
    **memory.OPS,
    **warp.OPS,
}
NOOPS = {"membar", "fence", "bar.warp", "prefetch", "prefetchu", "pmevent", "nanosleep", "trap", "brkpt", "discard"}


@dataclass
class Decoded:
    """One decoded instruction: its kind, closure (NORMAL), branch target, guard register and negation, whether
    the scheduler should re-pick after it (the next instruction is a branch target), and the PTX for messages."""

    kind: int
    step: Step
    target: int
    guard: int | None
    guard_neg: bool
    stop: bool
    text: str


def _noop(st: Any, mask: Mask) -> None:
    return None


def decode_function(fn: Function, symbols: dict[str, str]) -> tuple[list[int], list[Decoded]]:
    """Decode a function body; returns the register widths (bytes, 0 = predicate) and the steps."""
    dec = Decoder(fn, symbols)
    targets = set(fn.labels.values())
    code = []
    for pc, ins in enumerate(fn.body):
        dec.ins = ins
        guard = dec.reg(ins.guard, "pred") if ins.guard else None
        head = ins.op[0]
        kind = NORMAL
        step: Step = _noop
        target = 0
        if head == "bra":
            kind = BRANCH
            label = ins.operands[0].name
            if label not in fn.labels:
                raise dec.error(f"branch to unknown label {label}")
            target = fn.labels[label]
        elif head in ("ret", "exit"):
            kind = EXIT
        elif head in ("bar", "barrier") and ins.op[1:2] != ["warp"]:
            if ins.op[1:2] not in (["sync"], [""], []) and "sync" not in ins.op and "red" not in ins.op:
                raise dec.error(f"unsupported barrier {'.'.join(ins.op)} (only bar.sync / barrier.sync)")
            if "red" in ins.op:
                raise dec.error("bar.red is not supported")
            kind = BARRIER
        elif head in NOOPS or ".".join(ins.op[:2]) in NOOPS:
            step = _noop
        elif head in OPS:
            step = OPS[head](ins, dec)
        else:
            raise EmulatorError(
                f"kernel {fn.name}: unknown PTX instruction {'.'.join(ins.op)!r} at PTX line {ins.line}: {ins.text}"
            )
        code.append(Decoded(kind, step, target, guard, ins.guard_neg, pc + 1 in targets, ins.text))
    return dec.width, code
