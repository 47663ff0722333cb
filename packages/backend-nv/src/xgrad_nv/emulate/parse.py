"""PTX text -> a module of kernels, each a list of parsed statements (the PTX ISA's grammar, the parts NVVM and the
PTX renderer emit).

In: a whole PTX module (`.version`/`.target`/`.address_size`, module-level `.global`/`.const`/`.shared` variables,
`.entry` and `.func` bodies). Out: `ParsedModule` with variables, and per entry its parameters, register
declarations, state-space variables, labels and instructions with their operands split into `Operand`s. Nothing is
executed here; `decode.py` turns instructions into numpy closures.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field, replace

from xgrad_nv.emulate.errors import EmulatorError

_TOKEN = re.compile(
    r"""
    "(?:[^"\\]|\\.)*"                                      # a string
  | 0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}|0[xX][0-9a-fA-F]+U?  # float bits, hex
  | \d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+U?           # decimal numbers
  | [A-Za-z_$%.][\w$.]*                                        # names, directives, registers, opcodes
  | [{}()\[\],;:@!|+\-<>=*]                                   # punctuation
  | \S                                                        # anything else (the parser rejects it)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Operand:
    """One instruction operand. kind: reg (a register or special register, `neg` for `!%p`), imm (int or float
    `value`; `text` keeps float literals' spelling), sym (a variable or label name), addr (`[base+offset]`, base a
    register, a symbol or None), vec (`{a, b, ...}` of operands), pair (`%p|%q` of setp), sink (`_`)."""

    kind: str
    name: str = ""
    value: int | float = 0
    text: str = ""
    neg: bool = False
    items: tuple[Operand, ...] = ()


@dataclass
class Instruction:
    """An instruction: its opcode split at dots (`ld.global.f32` -> ['ld', 'global', 'f32']), an optional guard
    predicate register and its negation, the operands, and the PTX line it came from (for error messages)."""

    op: list[str]
    operands: list[Operand]
    guard: str | None
    guard_neg: bool
    line: int
    text: str


@dataclass
class Variable:
    """A state-space variable (.global/.const/.shared/.local/.param): element type, alignment, total bytes and its
    initial bytes (module-level .global/.const only). `extern` marks dynamic shared memory (`.extern .shared x[]`)."""

    space: str
    name: str
    dtype: str
    align: int
    nbytes: int
    init: bytes | None = None
    extern: bool = False


@dataclass
class Function:
    """An `.entry` (kernel) or `.func` body."""

    name: str
    entry: bool
    params: list[Variable] = field(default_factory=list)
    rets: list[Variable] = field(default_factory=list)  # a .func's return parameters
    regs: dict[str, str] = field(default_factory=dict)  # register name -> declared type ('.b32', '.pred', ...)
    variables: list[Variable] = field(default_factory=list)  # .local/.shared declared in the body
    body: list[Instruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> index in body of the instruction after it


@dataclass
class ParsedModule:
    """A parsed PTX module: header, module-level variables, functions by name."""

    version: str = ""
    target: str = ""
    address_size: int = 64
    variables: list[Variable] = field(default_factory=list)
    functions: dict[str, Function] = field(default_factory=dict)


TYPE_BYTES = {
    "pred": 1,
    "b8": 1,
    "u8": 1,
    "s8": 1,
    "b16": 2,
    "u16": 2,
    "s16": 2,
    "f16": 2,
    "bf16": 2,
    "e4m3": 1,
    "e5m2": 1,
    "b32": 4,
    "u32": 4,
    "s32": 4,
    "f32": 4,
    "f16x2": 4,
    "bf16x2": 4,
    "tf32": 4,
    "b64": 8,
    "u64": 8,
    "s64": 8,
    "f64": 8,
    "b128": 16,
}


class _Tokens:
    def __init__(self, text: str) -> None:
        text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        self.texts: list[str] = []
        self.lines: list[int] = []
        for line, row in enumerate(text.split("\n"), 1):
            found = _TOKEN.findall(row)
            self.texts += found
            self.lines += [line] * len(found)
        self.i = 0

    def __len__(self) -> int:
        return len(self.texts)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.texts[j] if j < len(self.texts) else ""

    def line(self) -> int:
        return self.lines[min(self.i, len(self.lines) - 1)] if self.lines else 0

    def next(self) -> str:
        if self.i >= len(self.texts):
            raise EmulatorError("PTX ends in the middle of a statement (a missing ';' or '}')")
        tok = self.texts[self.i]
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise EmulatorError(f"PTX line {self.line()}: expected {tok!r}, found {got!r}")

    def until(self, stop: str) -> list[str]:
        """The tokens up to `stop` (consumed, not returned)."""
        try:
            j = self.texts.index(stop, self.i)
        except ValueError:
            raise EmulatorError(f"PTX ends without a {stop!r} after line {self.line()}") from None
        out = self.texts[self.i : j]
        self.i = j + 1
        return out


def _int(tok: str) -> int:
    tok = tok.rstrip("U")
    if tok[:2] in ("0x", "0X"):
        return int(tok[2:], 16)
    if len(tok) > 1 and tok[0] == "0" and tok.isdigit():
        return int(tok, 8)
    return int(tok)


def _variable(space: str, toks: list[str], extern: bool) -> Variable:
    """`.align 4 .b8 name[24] = {1, 2}` (after the state space) -> Variable."""
    align = 0
    dtype = ""
    i = 0
    while i < len(toks) and toks[i].startswith("."):
        if toks[i] == ".align":
            align = _int(toks[i + 1])
            i += 2
            continue
        if toks[i][1:] in TYPE_BYTES:
            dtype = toks[i][1:]
        i += 1
    if i >= len(toks) or not dtype:
        raise EmulatorError(f"cannot read the {space} variable declaration {' '.join(toks)!r}")
    name = toks[i]
    i += 1
    count = 1
    unsized = False
    while i < len(toks) and toks[i] == "[":
        if toks[i + 1] == "]":
            unsized = True
            i += 2
        else:
            count *= _int(toks[i + 1])
            i += 3
    size = TYPE_BYTES[dtype]
    init = None
    if i < len(toks) and toks[i] == "=":
        vals: list[int | float] = []
        neg = False
        for tok in toks[i + 1 :]:
            if tok == "-":
                neg = True
            elif tok not in "{},":
                v = _imm_value(tok)
                vals.append(-v if neg else v)
                neg = False
        init = b"".join(_encode_scalar(dtype, v) for v in vals)
        if unsized:
            count = max(len(vals), 1)
    nbytes = 0 if (unsized and init is None) else size * count
    return Variable(space, name, dtype, align or size, nbytes, init, extern or unsized)


def _encode_scalar(dtype: str, v: int | float) -> bytes:
    size = TYPE_BYTES[dtype]
    if dtype in ("f32", "f64") and isinstance(v, float):
        return struct.pack("<f" if size == 4 else "<d", v)
    return (int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _imm_value(tok: str) -> int | float:
    if tok[:2] in ("0f", "0F"):
        return float(struct.unpack("<f", int(tok[2:], 16).to_bytes(4, "little"))[0])
    if tok[:2] in ("0d", "0D"):
        return float(struct.unpack("<d", int(tok[2:], 16).to_bytes(8, "little"))[0])
    if re.fullmatch(r"\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+", tok):
        return float(tok)
    return _int(tok)


def _operand(toks: list[str], line: int) -> Operand:
    if not toks:
        raise EmulatorError(f"PTX line {line}: an empty operand")
    if toks[0] == "[":
        inner = toks[1 : toks.index("]")]
        base = None
        off = 0
        sign = 1
        for tok in inner:
            if tok in "+-":
                sign = -sign if tok == "-" else sign
            elif tok[0].isdigit():
                off += sign * _int(tok)
                sign = 1
            else:
                base = tok
        return Operand("addr", base or "", off)
    if toks[0] in "{(":
        items = _split(toks[1:-1])
        return Operand("vec", items=tuple(_operand(t, line) for t in items))
    if "|" in toks:
        k = toks.index("|")
        return Operand("pair", items=(_operand(toks[:k], line), _operand(toks[k + 1 :], line)))
    if toks[0] == "!":
        negated = _operand(toks[1:], line)
        return Operand("reg", negated.name, neg=True)
    if toks[0] == "-" and len(toks) == 2 and (toks[1][0].isdigit()):
        v = _imm_value(toks[1])
        return Operand("imm", value=-v, text="-" + toks[1])
    if toks[0][0].isdigit():
        return Operand("imm", value=_imm_value(toks[0]), text=toks[0])
    if toks[0] == "_":
        return Operand("sink")
    if toks[0].startswith("%"):
        return Operand("reg", toks[0])
    if len(toks) == 3 and toks[1] in "+-":
        return Operand("sym", toks[0], value=_int(toks[2]) * (-1 if toks[1] == "-" else 1))
    return Operand("sym", toks[0])


def _split(toks: list[str]) -> list[list[str]]:
    """Split tokens at depth-0 commas."""
    out: list[list[str]] = [[]]
    depth = 0
    for tok in toks:
        if tok in "{[(":
            depth += 1
        elif tok in "}])":
            depth -= 1
        if tok == "," and depth == 0:
            out.append([])
        else:
            out[-1].append(tok)
    return [t for t in out if t]


def _params(tk: _Tokens) -> list[Variable]:
    tk.expect("(")
    params = []
    while tk.peek() != ")":
        toks = []
        while tk.peek() not in (",", ")"):
            toks.append(tk.next())
        if tk.peek() == ",":
            tk.next()
        if toks and toks[0] == ".param":
            toks = toks[1:]
        params.append(_variable("param", [t for t in toks if t not in (".ptr", ".global", ".shared")], False))
    tk.next()
    return params


def rename_operand(op: Operand, names: dict[str, str]) -> Operand:
    """`op` with register/variable names replaced through `names`."""
    if op.kind in ("reg", "sym", "addr"):
        return replace(op, name=names.get(op.name, op.name))
    if op.kind in ("vec", "pair"):
        return replace(op, items=tuple(rename_operand(i, names) for i in op.items))
    return op


def _body(tk: _Tokens, fn: Function) -> None:
    depth = 1
    scopes: list[dict[str, str]] = [{}]  # registers declared in nested { } blocks shadow outer ones: unique names
    visible: dict[str, str] = {}
    while depth:
        tok = tk.peek()
        line = tk.line()
        if tok == "{":
            tk.next()
            depth += 1
            scopes.append({})
            continue
        if tok == "}":
            tk.next()
            depth -= 1
            scopes.pop()
            visible = {k: v for s in scopes for k, v in s.items()}
            continue
        if tk.peek(1) == ":" and not tok.startswith("."):
            tk.next()
            tk.next()
            fn.labels[tok] = len(fn.body)
            continue
        stmt = tk.until(";")
        if stmt[0] == ".reg":
            declared = _regs(stmt, fn, f"#{line}" if depth > 1 else "")
            if depth > 1:
                scopes[-1].update(declared)
                visible.update(declared)
        elif stmt[0] in (".local", ".shared"):
            fn.variables.append(_variable(stmt[0][1:], stmt[1:], False))
        elif stmt[0] == ".param":  # a call's argument or result slot: per thread, like .local
            fn.variables.append(_variable("callparam", stmt[1:], False))
        elif stmt[0] == ".extern" and stmt[1] == ".shared":
            fn.variables.append(_variable("shared", stmt[2:], True))
        elif stmt[0].startswith("."):
            continue  # .pragma, .loc, ...
        else:
            ins = _instruction(stmt, line)
            if visible:
                ins.operands = [rename_operand(o, visible) for o in ins.operands]
                ins.guard = visible.get(ins.guard, ins.guard) if ins.guard else None
            fn.body.append(ins)


def _regs(stmt: list[str], fn: Function, suffix: str) -> dict[str, str]:
    """Declare the registers of a `.reg` statement (names get `suffix`); returns declared name -> register name."""
    dtype = next(t for t in stmt[1:] if t.startswith(".") and t[1:] in TYPE_BYTES)
    names = [t for t in _split([t for t in stmt[1:] if not t.startswith(".")])]
    declared = {}
    for parts in names:
        if len(parts) == 4 and parts[1] == "<":
            for k in range(_int(parts[2])):
                declared[f"{parts[0]}{k}"] = f"{parts[0]}{k}{suffix}"
        else:
            declared[parts[0]] = parts[0] + suffix
    for reg in declared.values():
        fn.regs[reg] = dtype
    return declared


def _instruction(stmt: list[str], line: int) -> Instruction:
    guard = None
    neg = False
    i = 0
    if stmt[0] == "@":
        i = 1
        if stmt[1] == "!":
            neg = True
            i = 2
        guard = stmt[i]
        i += 1
    op = stmt[i].split(".")
    ops = [_operand(t, line) for t in _split(stmt[i + 1 :])]
    return Instruction(op, ops, guard, neg, line, " ".join(stmt))


def parse_ptx(text: str) -> ParsedModule:
    """Parse a whole PTX module."""
    tk = _Tokens(text)
    mod = ParsedModule()
    while tk.i < len(tk):
        tok = tk.next()
        if tok == ".version":
            mod.version = tk.next()
        elif tok == ".target":
            targets = tk.next()
            while tk.peek() == ",":
                tk.next()
                tk.next()
            mod.target = targets
        elif tok == ".address_size":
            mod.address_size = _int(tk.next())
        elif tok in (".visible", ".weak", ".extern"):
            if tok == ".extern" and tk.peek() == ".shared":
                tk.next()
                mod.variables.append(_variable("shared", tk.until(";"), True))
            continue
        elif tok in (".global", ".const", ".shared"):
            mod.variables.append(_variable(tok[1:], tk.until(";"), False))
        elif tok in (".entry", ".func"):
            _function(tk, mod, tok == ".entry")
        elif tok in (".file", ".section", ".loc"):
            _skip_directive(tk)
        elif tok == ";":
            continue
        else:
            raise EmulatorError(f"PTX line {tk.line()}: unexpected {tok!r} at module level")
    return mod


def _skip_directive(tk: _Tokens) -> None:
    if tk.peek(1) == "{" or tk.peek() == "{":
        while tk.next() != "}":
            pass
        return
    line = tk.line()
    while tk.i < len(tk) and tk.lines[tk.i] == line:
        tk.next()


def _function(tk: _Tokens, mod: ParsedModule, entry: bool) -> None:
    ret: list[Variable] = []
    if tk.peek() == "(":
        ret = _params(tk)
    name = tk.next()
    fn = Function(name, entry, rets=ret)
    fn.params = _params(tk) if tk.peek() == "(" else []
    while tk.peek() not in ("{", ";"):
        tk.next()  # .maxntid 256, 1, 1 / .reqntid / .minnctapersm / .noreturn
    if tk.next() == ";":
        return  # a declaration; the definition follows
    _body(tk, fn)
    mod.functions[name] = fn
