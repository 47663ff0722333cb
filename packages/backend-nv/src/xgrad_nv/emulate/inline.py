"""Calls to `.func`s, inlined before decoding (NVVM calls libdevice's slow paths, e.g. the float64 sin/cos argument
reduction, instead of inlining them).

In: an `.entry` and the module's functions. Out: one `Function` whose body has every `call` replaced by a copy of the
callee's body: the callee's registers, variables and parameters renamed with `@<callee>`, its labels with
`@<call site>`, each `ret` a branch to the end of the copy. Call arguments and results live in per-thread `.param`
slots (declared `callparam`, kept in local memory): the copy starts with `xg.copy` steps from the caller's argument
slots to the callee's parameters and ends with copies of the callee's return slots to the caller's. Recursion is not
supported (it is refused past a depth of 16).
"""

from __future__ import annotations

from dataclasses import replace

from xgrad_nv.emulate.errors import EmulatorError
from xgrad_nv.emulate.parse import Function, Instruction, Operand, Variable, rename_operand

MAX_DEPTH = 16


def _copy(dst: str, src: str, nbytes: int, line: int) -> Instruction:
    ops = [Operand("sym", dst), Operand("sym", src), Operand("imm", value=nbytes)]
    return Instruction(["xg", "copy"], ops, None, False, line, f"(call argument copy {src} -> {dst})")


class _Inliner:
    def __init__(self, functions: dict[str, Function], kernel: Function) -> None:
        self.functions = functions
        self.out = Function(kernel.name, True, params=kernel.params, regs=dict(kernel.regs))
        self.sites = 0
        self.added: set[str] = set()

    def add_function_state(self, fn: Function, names: dict[str, str]) -> None:
        if fn.name in self.added:
            return
        self.added.add(fn.name)
        for reg, t in fn.regs.items():
            self.out.regs[names[reg]] = t
        for v in [*fn.variables, *fn.params, *fn.rets]:
            space = "callparam" if v in fn.params or v in fn.rets else v.space
            self.out.variables.append(replace(v, name=names[v.name], space=space))

    def emit(self, fn: Function, names: dict[str, str], site: str, depth: int) -> None:
        """Append `fn`'s body, renamed by `names`, labels suffixed with `site`."""
        label_at = {pos: [k for k, p in fn.labels.items() if p == pos] for pos in set(fn.labels.values())}
        end = f"$ret{site}"
        for pos, ins in enumerate(fn.body):
            for label in label_at.get(pos, []):
                self.out.labels[label + site] = len(self.out.body)
            if ins.op[0] == "call":
                self.call(ins, names, depth)
                continue
            if site and ins.op[0] == "ret":
                self.out.body.append(
                    Instruction(["bra"], [Operand("sym", end)], names.get(ins.guard or "", ins.guard),
                                ins.guard_neg, ins.line, ins.text)
                )  # fmt: skip
                continue
            ops = [rename_operand(o, names) for o in ins.operands]
            if ins.op[0] == "bra":
                ops = [replace(ops[0], name=ops[0].name + site)]
            guard = names.get(ins.guard, ins.guard) if ins.guard else None
            self.out.body.append(Instruction(ins.op, ops, guard, ins.guard_neg, ins.line, ins.text))
        for label in label_at.get(len(fn.body), []):
            self.out.labels[label + site] = len(self.out.body)
        if site:
            self.out.labels[end] = len(self.out.body)

    def call(self, ins: Instruction, names: dict[str, str], depth: int) -> None:
        ops = list(ins.operands)
        rets: tuple[Operand, ...] = ()
        if ops and ops[0].kind == "vec":
            rets = ops.pop(0).items
        if not ops or ops[0].kind != "sym":
            raise EmulatorError(f"PTX line {ins.line}: unsupported call form (indirect calls are not supported)")
        callee_name = ops.pop(0).name
        args = ops[0].items if ops and ops[0].kind == "vec" else ()
        callee = self.functions.get(callee_name)
        if callee is None:
            raise EmulatorError(f"PTX line {ins.line}: call of {callee_name}, which this module does not define")
        if depth >= MAX_DEPTH:
            raise EmulatorError(f"PTX line {ins.line}: calls nest deeper than {MAX_DEPTH} (recursion is not supported)")
        if len(args) != len(callee.params) or len(rets) != len(callee.rets):
            raise EmulatorError(f"PTX line {ins.line}: call of {callee_name} with the wrong number of arguments")
        self.sites += 1
        site = f"@{self.sites}"
        tag = f"@{callee_name}"
        inner = {n: n + tag for n in callee.regs}
        inner.update({v.name: v.name + tag for v in [*callee.variables, *callee.params, *callee.rets]})
        self.add_function_state(callee, inner)
        for arg, param in zip(args, callee.params, strict=True):
            if arg.kind != "sym":
                raise EmulatorError(f"PTX line {ins.line}: call arguments must be .param variables, got {arg}")
            self.out.body.append(_copy(inner[param.name], names.get(arg.name, arg.name), param.nbytes, ins.line))
        self.emit(callee, inner, site, depth + 1)
        for ret, rparam in zip(rets, callee.rets, strict=True):
            self.out.body.append(_copy(names.get(ret.name, ret.name), inner[rparam.name], rparam.nbytes, ins.line))


def inline_calls(kernel: Function, functions: dict[str, Function]) -> Function:
    """`kernel` with every call inlined (the kernel itself when it makes none)."""
    if not any(ins.op[0] == "call" for ins in kernel.body):
        return kernel
    inl = _Inliner(functions, kernel)
    inl.out.variables = list(kernel.variables)
    inl.emit(kernel, {}, "", 0)
    return inl.out


__all__ = ["inline_calls", "Variable"]
