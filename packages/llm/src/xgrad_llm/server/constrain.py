"""Constrained decoding for JSON: a JSON schema (or "any object") in, a token filter out that lets through only the
tokens that keep the output a prefix of a JSON text matching the schema.

The filter is a byte-level pushdown recognizer whose state is an immutable tuple (a stack of frames), so a candidate
token is checked by feeding its bytes to a copy of the state. Frames: `X` an exact literal (the prefix and suffix
around the JSON, e.g. `<tool_call>\\n` ... `\\n</tool_call>`), `V` a value to start, `L` literals (true, false, null,
enum members), `S` a string's inside (`U` a multi-byte UTF-8 character in it), `K` an object key, `N` a number,
`O` an object, `A` an array.

What a schema can say here: `type` (one or a list), `properties`, `required`, `additionalProperties: false`, `items`,
`enum`, `const`, and `anyOf`/`oneOf` of such schemas (their types merged). Other keywords (`minimum`, `pattern`,
`$ref`, ...) are not checked: a value of the right type passes. Whitespace between tokens is allowed, at most
`MAX_WS` bytes in a row, so a model cannot pad forever.

So that the output closes within its token budget, `forced(budget)` computes the shortest text that completes the
JSON from the current state (close the string, write the missing required keys with minimal values, close the
brackets); once the budget is down to its length, the constraint names the token to emit, longest match first.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from dataclasses import dataclass, field
from typing import Any

from xgrad_llm.server.protocol import APIError
from xgrad_llm.tokenizer import Tokenizer

MAX_WS = 12
MAX_DIGITS = 24
WS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
KINDS = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})

Frame = tuple[Any, ...]
Stack = tuple[Frame, ...]


@dataclass(eq=False)
class Node:
    """A compiled schema: which kinds of value it accepts and what their parts must be."""

    kinds: frozenset[str] = KINDS
    props: dict[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    additional: bool = True
    items: Node | None = None
    enum: tuple[bytes, ...] | None = None
    ordered: bool = False  # keys come in the order of `props` (a tool call names its function first)

    def child(self, key: str) -> Node:
        return self.props.get(key) or ANY

    def item(self) -> Node:
        return self.items or ANY


ANY = Node()


def compile_schema(schema: Any, path: str = "schema") -> Node:
    """The Node of a JSON schema (a dict; True or {} accept anything)."""
    if schema is True or schema is None or schema == {}:
        return ANY
    if not isinstance(schema, dict):
        raise APIError(f"{path} must be a JSON schema object", param="response_format")
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise APIError(f"{path}.enum must be a non-empty array", param="response_format")
        return Node(enum=tuple(json.dumps(v, ensure_ascii=False).encode() for v in values))
    alts = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alts, list) and alts:
        parts = [compile_schema(a, f"{path}.anyOf[{i}]") for i, a in enumerate(alts)]
        merged = Node(kinds=frozenset().union(*(p.kinds for p in parts)))
        for p in parts:
            merged.props.update(p.props)
            merged.items = merged.items or p.items
        merged.required = tuple(sorted(set.intersection(*(set(p.required) for p in parts))))
        merged.additional = any(p.additional for p in parts)
        return merged
    kind = schema.get("type")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind is None:
        kinds = KINDS
    else:
        names = [kind] if isinstance(kind, str) else kind
        if not isinstance(names, list) or not all(isinstance(k, str) and k in KINDS for k in names):
            raise APIError(f"{path}.type {kind!r} is not a JSON schema type", param="response_format")
        kinds = frozenset(names)
    props_raw = schema.get("properties", {})
    if not isinstance(props_raw, dict):
        raise APIError(f"{path}.properties must be an object", param="response_format")
    props = {k: compile_schema(v, f"{path}.properties.{k}") for k, v in props_raw.items()}
    required = schema.get("required") or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise APIError(f"{path}.required must be an array of key names", param="response_format")
    items = compile_schema(schema["items"], f"{path}.items") if isinstance(schema.get("items"), dict) else None
    return Node(
        kinds=kinds,
        props=props,
        required=tuple(required),
        additional=schema.get("additionalProperties", True) is not False,
        items=items,
    )


def tool_call_schema(params: dict[str, Any]) -> dict[str, Any]:
    """The schema of a Hermes tool call {"name": ..., "arguments": {...}} for functions {name: parameters}."""
    args: Any = next(iter(params.values())) if len(params) == 1 else {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"enum": list(params)}, "arguments": args or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# ---- the recognizer ----
def _done(rest: Stack) -> Stack:
    """The value on top finished: tell its parent."""
    if not rest:
        return rest
    top = rest[-1]
    if top[0] == "O":
        return rest[:-1] + (("O", top[1], ",", top[3], None),)
    if top[0] == "A":
        return rest[:-1] + (("A", top[1], ",", top[3] + 1),)
    return rest  # an X (the suffix) or nothing


def _start(rest: Stack, node: Node, c: int) -> Stack | None:
    if node.enum is not None:
        return _step(rest + (("L", node.enum, 0),), c)
    k = node.kinds
    if c == ord("{") and "object" in k:
        return rest + (("O", node, "{", frozenset(), None),)
    if c == ord("[") and "array" in k:
        return rest + (("A", node, "[", 0),)
    if c == ord('"') and "string" in k:
        return rest + (("S", 0),)
    if (c == ord("-") or c in DIGITS) and ("number" in k or "integer" in k):
        return _step(rest + (("N", "number" not in k, "start", 0),), c)
    if c in b"tf" and "boolean" in k:
        return _step(rest + (("L", (b"true", b"false"), 0),), c)
    if c == ord("n") and "null" in k:
        return _step(rest + (("L", (b"null",), 0),), c)
    return None


# a UTF-8 lead byte -> (continuation bytes needed, the range of the first one): no overlong forms, no surrogates
_UTF8_LEADS: dict[int, tuple[int, int, int]] = {
    **{b: (1, 0x80, 0xBF) for b in range(0xC2, 0xE0)},
    0xE0: (2, 0xA0, 0xBF),
    **{b: (2, 0x80, 0xBF) for b in (*range(0xE1, 0xED), 0xEE, 0xEF)},
    0xED: (2, 0x80, 0x9F),
    0xF0: (3, 0x90, 0xBF),
    **{b: (3, 0x80, 0xBF) for b in range(0xF1, 0xF4)},
    0xF4: (3, 0x80, 0x8F),
}

_NUM: dict[str, dict[str, str]] = {  # phase -> {character class -> next phase}
    "start": {"-": "-", "0": "0", "1": "i"},
    "-": {"0": "0", "1": "i"},
    "0": {".": ".", "e": "e"},
    "i": {"0": "i", "1": "i", ".": ".", "e": "e"},
    ".": {"0": "f", "1": "f"},
    "f": {"0": "f", "1": "f", "e": "e"},
    "e": {"+": "s", "0": "x", "1": "x"},
    "s": {"0": "x", "1": "x"},
    "x": {"0": "x", "1": "x"},
}
_NUM_DONE = frozenset("0ifx")


def _num_class(c: int) -> str:
    if c == ord("0"):
        return "0"
    if c in DIGITS:
        return "1"
    return {ord("-"): "-", ord("."): ".", ord("e"): "e", ord("E"): "e", ord("+"): "+"}.get(c, "?")


def _step(stack: Stack, c: int) -> Stack | None:
    """The stack after byte `c`, or None if `c` cannot come next."""
    while stack:
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind == "X":
            lit, i = top[1], top[2]
            if lit[i] != c:
                return None
            return rest + (("X", lit, i + 1),) if i + 1 < len(lit) else rest
        if kind == "V":
            if c in WS:
                return stack if rest and rest[-1][0] != "X" else None  # no whitespace before the whole value
            return _start(rest, top[1], c)
        if kind == "L":
            cands, pos = top[1], top[2]
            nxt = tuple(x for x in cands if len(x) > pos and x[pos] == c)
            if nxt:
                if all(len(x) == pos + 1 for x in nxt):
                    return _done(rest)
                return rest + (("L", nxt, pos + 1),)
            if any(len(x) == pos for x in cands):
                stack = _done(rest)
                continue
            return None
        if kind == "S":
            esc = top[1]
            if esc == -1:
                if c == ord("u"):
                    return rest + (("S", 4),)
                return rest + (("S", 0),) if c in b'"\\/bfnrt' else None
            if esc > 0:
                return rest + (("S", esc - 1),) if c in HEX else None
            if c == ord('"'):
                return _done(rest)
            if c == ord("\\"):
                return rest + (("S", -1),)
            if c >= 0x80:  # the lead byte of a multi-byte character: its continuation bytes must follow
                lead = _UTF8_LEADS.get(c)
                return None if lead is None else stack + (("U", *lead),)
            return None if c < 0x20 else stack
        if kind == "U":
            need, lo, hi = top[1], top[2], top[3]
            if not lo <= c <= hi:
                return None
            return rest if need == 1 else rest + (("U", need - 1, 0x80, 0xBF),)
        if kind == "K":
            allowed, partial = top[1], top[2]
            if c == ord('"'):
                key = partial.decode("utf-8", errors="replace")
                if allowed is not None and key not in allowed:
                    return None
                obj = rest[-1]
                return rest[:-1] + (("O", obj[1], ":", obj[3] | {key}, key),)
            if c == ord("\\") or c < 0x20 or c >= 0x80:  # keys the schema does not name: plain ASCII
                return None
            grown = partial + bytes((c,))
            if allowed is not None and not any(k.encode().startswith(grown) for k in allowed):
                return None
            return rest + (("K", allowed, grown),)
        if kind == "N":
            integer, phase, n = top[1], top[2], top[3]
            cls = _num_class(c)
            nxt_phase = _NUM[phase].get(cls)
            if nxt_phase is not None and integer and cls in ".e" and phase != "e":
                nxt_phase = None
            if nxt_phase is not None and (n < MAX_DIGITS or phase not in _NUM_DONE):
                return rest + (("N", integer, nxt_phase, n + 1),)
            if phase in _NUM_DONE:
                stack = _done(rest)
                continue
            return None
        if kind == "O":
            node, phase, seen = top[1], top[2], top[3]
            if c in WS and phase != "v":
                return stack
            missing = [k for k in node.required if k not in seen]
            if c == ord("}") and phase in "{," and not missing:
                return _done(rest)
            if c == ord('"') and phase in "{k":
                allowed = None if node.additional else tuple(k for k in node.props if k not in seen)
                if node.ordered and allowed:
                    allowed = allowed[:1]
                if allowed == ():
                    return None
                return stack + (("K", allowed, b""),)
            if c == ord(",") and phase == ",":
                if not node.additional and all(k in seen for k in node.props):
                    return None
                return rest + (("O", node, "k", seen, None),)
            if c == ord(":") and phase == ":":
                return rest + (("O", node, "v", seen, top[4]), ("V", node.child(top[4])))
            return None
        if kind == "A":
            node, phase, count = top[1], top[2], top[3]
            if c in WS:
                return stack
            if c == ord("]") and phase in "[,":
                return _done(rest)
            if c == ord(",") and phase == ",":
                return rest + (("A", node, "n", count),)
            if phase in "[n":
                return _start(rest + (("A", node, "v", count),), node.item(), c)
            return None
        raise AssertionError(f"unknown frame {kind}")
    return None


def _feed(state: tuple[Stack, int], data: bytes) -> tuple[Stack, int] | None:
    stack, ws = state
    for c in data:
        in_string = bool(stack) and stack[-1][0] in "SKU"
        ws = ws + 1 if c in WS and not in_string else 0
        if ws > MAX_WS:
            return None
        nxt = _step(stack, c)
        if nxt is None:
            return None
        stack = nxt
    return stack, ws


def _minimal(node: Node) -> bytes:
    if node.enum is not None:
        return min(node.enum, key=len)
    for kind, text in (("null", b"null"), ("number", b"0"), ("integer", b"0"), ("string", b'""'), ("boolean", b"true")):
        if kind in node.kinds:
            return text
    return b"{" if "object" in node.kinds else b"["


def _next_closing(stack: Stack) -> bytes:
    """A short text that moves the top frame towards its end (fed in a loop by `closing`)."""
    top = stack[-1]
    kind = top[0]
    if kind == "X":
        return bytes(top[1][top[2] :])
    if kind == "V":
        return _minimal(top[1])
    if kind == "L":
        rest: bytes = min((x[top[2] :] for x in top[1]), key=len)
        return rest or b" "
    if kind == "U":
        need: int = top[1]
        return bytes([top[2]]) + b"\x80" * (need - 1)
    if kind == "S":
        esc: int = top[1]
        return b'n"' if esc == -1 else b"0" * esc + b'"'
    if kind == "K":
        allowed, partial = top[1], top[2]
        obj = stack[-2]
        missing = [k.encode() for k in obj[1].required if k not in obj[3] and k.encode().startswith(partial)]
        keys = [k.encode() for k in (allowed or ()) if k.encode().startswith(partial)]
        if not missing and allowed is None:
            return b'"'
        best: bytes = min(missing or keys, key=len)
        return best[len(partial) :] + b'"'
    if kind == "N":
        return b"0" if top[2] not in _NUM_DONE else b" "
    if kind == "O":
        node, phase, seen = top[1], top[2], top[3]
        missing = [k for k in node.required if k not in seen]
        if phase == ":":
            return b":"
        if phase == "k":
            return b'"'
        if phase == "{":
            return b'"' if missing else b"}"
        return b"," if missing else b"}"
    phase = top[2]  # A
    return b"]" if phase in "[," else _minimal(top[1].item())


def closing(stack: Stack) -> bytes:
    """The short text that completes the JSON (and the suffix) from `stack`."""
    out = b""
    for _ in range(10_000):
        if not stack:
            return out
        piece = _next_closing(stack)
        if piece == b" ":  # a finished number or literal at the end: only a following byte ends it
            top = stack[-1]
            stack = _done(stack[:-1]) if top[0] in "LN" else stack
            continue
        fed = _feed((stack, 0), piece)
        assert fed is not None, (stack[-1], piece)
        stack = fed[0]
        out += piece
    raise AssertionError("the closing text does not end")


_TOKEN_TABLES: weakref.WeakKeyDictionary[Tokenizer, tuple[list[bytes], dict[bytes, int]]] = weakref.WeakKeyDictionary()


def token_table(tokenizer: Tokenizer) -> tuple[list[bytes], dict[bytes, int]]:
    """(bytes of each token id, bytes -> a token id) of a tokenizer, built once. Control tokens have no bytes."""
    if tokenizer not in _TOKEN_TABLES:
        raw = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        lookup: dict[bytes, int] = {}
        for i, b in enumerate(raw):
            if b and b not in lookup:
                lookup[b] = i
        _TOKEN_TABLES[tokenizer] = (raw, lookup)
    return _TOKEN_TABLES[tokenizer]


class JSONConstraint:
    """The output must be `prefix` + JSON matching `schema` (any JSON value when None; any object with
    `root_object`) + `suffix`; with `ordered`, the top object's keys come in the schema's order. Implements the
    engine's `Constraint`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        schema: Any = None,
        root_object: bool = False,
        prefix: str = "",
        suffix: str = "",
        ordered: bool = False,
    ) -> None:
        node = compile_schema(schema)
        if root_object:
            node = Node(kinds=frozenset({"object"}))
        if ordered:
            node = dataclasses.replace(node, ordered=True)
        stack: Stack = ()
        if suffix:
            stack += (("X", suffix.encode(), 0),)
        stack += (("V", node),)
        if prefix:
            stack += (("X", prefix.encode(), 0),)
        self.state: tuple[Stack, int] = (stack, 0)
        self.budget: int | None = None  # tokens left, as last told by `forced`
        self.raw, self.lookup = token_table(tokenizer)
        self.max_len = max((len(b) for b in self.lookup), default=1)

    def allows(self, tok: int) -> bool:
        """Whether token `tok` may come next."""
        data = self.raw[tok] if 0 <= tok < len(self.raw) else b""
        fed = _feed(self.state, data) if data else None
        if fed is None:
            return False
        if self.budget is not None and self.budget - 1 < len(closing(fed[0])):
            return False  # the rest could no longer close in the tokens left
        return True

    def advance(self, tok: int) -> None:
        """Take token `tok` (it must be allowed)."""
        fed = _feed(self.state, self.raw[tok])
        assert fed is not None, f"token {tok} is not allowed here"
        self.state = fed

    @property
    def complete(self) -> bool:
        """The JSON (and the suffix) is whole."""
        return not self.state[0]

    def closing(self) -> bytes:
        """The shortest text found that completes the output from here."""
        return closing(self.state[0])

    def forced(self, budget: int) -> int | None:
        """With `budget` tokens left and no more room than the closing text needs, its next token."""
        self.budget = budget
        text = self.closing()
        if budget > len(text) + 1 or not text:
            return None
        for n in range(min(len(text), self.max_len), 0, -1):
            if (tok := self.lookup.get(text[:n])) is not None and _feed(self.state, text[:n]) is not None:
                return tok
        return None
