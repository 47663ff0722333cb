"""Constrained decoding for JSON: a JSON schema (or "any object") in, a token filter out that lets through only the
tokens that keep the output a prefix of a JSON text matching the schema (`schema.py` says which keywords count).

The filter is a byte-level pushdown recognizer whose state is a few immutable stacks of frames (one per live
alternative of an `anyOf`/`oneOf`), so a candidate token is checked by feeding its bytes to a copy of the state.
Frames: `X` an exact literal (the prefix and suffix around the JSON, e.g. `<tool_call>\\n` ... `\\n</tool_call>`),
`V` a value to start, `L` literals (true, false, null, enum members), `S` a string's inside (its length, pattern
state, and a partial escape or UTF-8 character), `K` an object key, `N` a number (its text so far, checked against
the bounds: a prefix passes while some completion of it is in range), `O` an object, `A` an array.
Whitespace between tokens is allowed, at most `MAX_WS` bytes in a row, so a model cannot pad forever. A number with
bounds has no exponent; a string with a length or pattern takes no `\\u` escapes (characters are written as they are).

So that the output closes within its token budget, `forced(budget)` computes a short text that completes the JSON
from the current state (finish the string or number in range, write the missing required keys and items with
minimal values, close the brackets); once the budget is down to its length, the constraint names the token to emit,
longest match first.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import weakref
from typing import Any

from xgrad_llm.server.jsonnum import DIGITS, minimal_number, num_ends, num_next, num_tail
from xgrad_llm.server.schema import Node, StrSpec, compile_schema
from xgrad_llm.tokenizer import Tokenizer

__all__ = ["JSONConstraint", "Node", "closing", "compile_schema", "token_table", "tool_call_node"]

MAX_WS = 12
MAX_STACKS = 64
WS = frozenset(b" \t\n\r")
HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPED = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b", ord("f"): "\f", ord("n"): "\n"}
_ESCAPED |= {ord("r"): "\r", ord("t"): "\t"}

Frame = tuple[Any, ...]
Stack = tuple[Frame, ...]
State = tuple[tuple[Stack, ...], int]  # the live stacks, whitespace bytes in a row


def tool_call_node(params: dict[str, Any]) -> Node:
    """The compiled schema of a Hermes tool call {"name": ..., "arguments": {...}} for functions {name: parameters}:
    one alternative per function (its name first, then arguments of its own parameters schema, whose `$ref`s
    resolve within it). An unsupported keyword in a parameters schema is a 400 naming it (param "tools")."""
    alts = []
    for name, schema in params.items():
        args = compile_schema(schema or {"type": "object"}, f"tools[{name}].parameters", param="tools")
        alts.append(
            Node(
                kinds=frozenset({"object"}),
                props={"name": Node(enum=(json.dumps(name, ensure_ascii=False).encode(),)), "arguments": args},
                required=("name", "arguments"),
                closed=True,
                ordered=True,
            )
        )
    return alts[0] if len(alts) == 1 else Node(alts=tuple(alts))


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


def _start(rest: Stack, node: Node, c: int) -> list[Stack]:
    if node.alts:
        return [s for alt in node.alts for s in _start(rest, alt, c)]
    if node.enum is not None:
        return _step(rest + (("L", node.enum, 0),), c)
    k = node.kinds
    if c == ord("{") and "object" in k:
        return [rest + (("O", node, "{", frozenset(), None),)]
    if c == ord("[") and "array" in k:
        return [rest + (("A", node, "[", 0),)]
    if c == ord('"') and "string" in k:
        plain = node.string == StrSpec()
        sspec = None if plain else node.string
        return [rest + (("S", sspec, 0, b"", 0, None if sspec is None else _str_start(sspec)),)]
    if (c == ord("-") or c in DIGITS) and ("number" in k or "integer" in k):
        nspec = dataclasses.replace(node.num, integer="number" not in k)
        return _step(rest + (("N", nspec, "start", b""),), c)
    if c in b"tf" and "boolean" in k:
        return _step(rest + (("L", (b"true", b"false"), 0),), c)
    if c == ord("n") and "null" in k:
        return _step(rest + (("L", (b"null",), 0),), c)
    return []


def _str_start(spec: StrSpec) -> frozenset[int] | None:
    return spec.pattern.start() if spec.pattern is not None else None


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


def _str_char(top: Frame, rest: Stack, ch: str) -> list[Stack]:
    """A string takes one more character (its length and pattern allowing)."""
    spec: StrSpec | None = top[1]
    if spec is None:
        return [rest + (("S", None, 0, b"", 0, None),)]
    count = top[4] + 1
    if spec.max_len is not None and count > spec.max_len:
        return []
    states = top[5]
    if spec.pattern is not None:
        states = spec.pattern.step(states, ch)
        to_end = spec.pattern.to_end(states)
        if to_end < 0 or (spec.max_len is not None and count + to_end > spec.max_len):
            return []
    return [rest + (("S", spec, 0, b"", count, states),)]


def _str_close_ok(top: Frame) -> bool:
    spec: StrSpec | None = top[1]
    if spec is None:
        return True
    return top[4] >= spec.min_len and (spec.pattern is None or spec.pattern.accept in top[5])


def _cp_span(buf: bytes) -> tuple[int, int]:
    """The code points a partial UTF-8 character (lead byte and some continuation bytes) can still become."""
    need, lo, hi = _UTF8_LEADS[buf[0]]
    low = buf + (bytes((lo,)) if len(buf) == 1 else b"") + b"\x80" * need
    high = buf + (bytes((hi,)) if len(buf) == 1 else b"") + b"\xbf" * need
    return ord(low[: need + 1].decode()), ord(high[: need + 1].decode())


def _cp_possible(top: Frame, span: tuple[int, int]) -> bool:
    """Whether a character in `span` may come next in the string (length and the pattern's next moves)."""
    spec: StrSpec | None = top[1]
    if spec is None:
        return True
    if spec.max_len is not None and top[4] >= spec.max_len:
        return False
    if spec.pattern is None:
        return True
    a, b = span
    for st in top[5]:
        for cs, _ in spec.pattern.moves[st]:
            overlaps = any(lo <= b and a <= hi for lo, hi in cs.ranges)
            covers = any(lo <= a and b <= hi for lo, hi in cs.ranges)
            if (overlaps and not cs.negate) or (cs.negate and not covers):
                return True
    return False


def _step_string(top: Frame, rest: Stack, c: int) -> list[Stack]:
    spec, mode, buf = top[1], top[2], top[3]
    if mode == -1:  # after a backslash (\\u only in strings without a length or pattern)
        if c == ord("u") and spec is None:
            return [rest + (("S", spec, 4, b"", top[4], top[5]),)]
        return _str_char(top, rest, _ESCAPED[c]) if c in _ESCAPED else []
    if mode > 0:  # \\u and `mode` hex digits to go
        if c not in HEX:
            return []
        buf += bytes((c,))
        if mode > 1:
            return [rest + (("S", spec, mode - 1, buf, top[4], top[5]),)]
        return _str_char(top, rest, chr(int(buf, 16)))
    if mode == -2:  # inside a multi-byte UTF-8 character
        need, lo, hi = _UTF8_LEADS[buf[0]]
        if len(buf) > 1:
            lo, hi = 0x80, 0xBF
        if not lo <= c <= hi:
            return []
        buf += bytes((c,))
        if len(buf) <= need:
            return [rest + (("S", spec, -2, buf, top[4], top[5]),)] if _cp_possible(top, _cp_span(buf)) else []
        return _str_char(top, rest, buf.decode())
    if c == ord('"'):
        return [_done(rest)] if _str_close_ok(top) else []
    if c == ord("\\"):
        if spec is not None and not any(_str_char(top, rest, ch) for ch in _ESCAPED.values()):
            return []
        return [rest + (("S", spec, -1, b"", top[4], top[5]),)]
    if c >= 0x80:  # the lead byte of a multi-byte character: its continuation bytes must follow
        if c not in _UTF8_LEADS or not _cp_possible(top, _cp_span(bytes((c,)))):
            return []
        return [rest + (("S", spec, -2, bytes((c,)), top[4], top[5]),)]
    return [] if c < 0x20 else _str_char(top, rest, chr(c))


def _step(stack: Stack, c: int) -> list[Stack]:
    """The stacks after byte `c` (none: `c` cannot come next)."""
    while stack:
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind == "X":
            lit, i = top[1], top[2]
            if lit[i] != c:
                return []
            return [rest + (("X", lit, i + 1),) if i + 1 < len(lit) else rest]
        if kind == "V":
            if c in WS:
                return [stack] if rest and rest[-1][0] != "X" else []  # no whitespace before the whole value
            return _start(rest, top[1], c)
        if kind == "L":
            cands, pos = top[1], top[2]
            nxt = tuple(x for x in cands if len(x) > pos and x[pos] == c)
            if nxt:
                if all(len(x) == pos + 1 for x in nxt):
                    return [_done(rest)]
                return [rest + (("L", nxt, pos + 1),)]
            if any(len(x) == pos for x in cands):
                stack = _done(rest)
                continue
            return []
        if kind == "S":
            return _step_string(top, rest, c)
        if kind == "K":
            allowed, partial = top[1], top[2]
            if c == ord('"'):
                key = partial.decode("utf-8", errors="replace")
                obj = rest[-1]
                if (allowed is not None and key not in allowed) or key in obj[3]:
                    return []
                return [rest[:-1] + (("O", obj[1], ":", obj[3] | {key}, key),)]
            if c == ord("\\") or c < 0x20 or c >= 0x80:  # keys the schema does not name: plain ASCII
                return []
            grown = partial + bytes((c,))
            if allowed is not None and not any(k.encode().startswith(grown) for k in allowed):
                return []
            return [rest + (("K", allowed, grown),)]
        if kind == "N":
            spec, phase, text = top[1], top[2], top[3]
            after = num_next(spec, phase, text, c)
            if after is not None:
                return [rest + (("N", spec, after, text + bytes((c,))),)]
            if num_ends(spec, phase, text):
                stack = _done(rest)
                continue
            return []
        if kind == "O":
            node, phase, seen = top[1], top[2], top[3]
            if c in WS and phase != "v":
                return [stack]
            missing = [k for k in node.required if k not in seen]
            if c == ord("}") and phase in "{," and not missing:
                return [_done(rest)]
            if c == ord('"') and phase in "{k":
                allowed = tuple(k for k in node.props if k not in seen) if node.closed else None
                if node.ordered and allowed:
                    allowed = allowed[:1]
                if allowed == ():
                    return []
                return [stack + (("K", allowed, b""),)]
            if c == ord(",") and phase == ",":
                if node.closed and all(k in seen for k in node.props):
                    return []
                return [rest + (("O", node, "k", seen, None),)]
            if c == ord(":") and phase == ":":
                return [rest + (("O", node, "v", seen, top[4]), ("V", node.child(top[4])))]
            return []
        if kind == "A":
            node, phase, count = top[1], top[2], top[3]
            if c in WS:
                return [stack]
            if c == ord("]") and phase in "[," and count >= node.min_items:
                return [_done(rest)]
            room = node.max_items is None or count < node.max_items
            if c == ord(",") and phase == "," and room:
                return [rest + (("A", node, "n", count),)]
            if phase in "[n" and room:
                return _start(rest + (("A", node, "v", count),), node.item(), c)
            return []
        raise AssertionError(f"unknown frame {kind}")
    return []


def _feed(state: State, data: bytes) -> State | None:
    stacks, ws = state
    for c in data:
        in_string = any(s and s[-1][0] in "SK" for s in stacks)
        ws = ws + 1 if c in WS and not in_string else 0
        if ws > MAX_WS:
            return None
        nxt = [n for s in stacks for n in _step(s, c)]
        if not nxt:
            return None
        stacks = tuple(dict.fromkeys(nxt))[:MAX_STACKS]
    return stacks, ws


# ---- closing: a short text that completes the output ----
def _string_rest(spec: StrSpec, count: int, states: frozenset[int] | None) -> str:
    """The fewest characters that complete a string from here (its length and pattern met)."""
    need = max(0, spec.min_len - count)
    if spec.pattern is None or states is None:
        return "a" * need
    rx, room = spec.pattern, None if spec.max_len is None else spec.max_len - count
    todo: collections.deque[tuple[frozenset[int], str]] = collections.deque([(states, "")])
    seen = {(states, 0)}
    while todo:
        st, text = todo.popleft()
        if rx.accept in st and len(text) >= need:
            return text
        if room is not None and len(text) >= room:
            continue
        for s in st:
            for cs, _ in rx.moves[s]:
                ch = cs.sample()
                if ch is None:
                    continue
                nxt = rx.step(st, ch)
                key = (nxt, min(len(text) + 1, need))
                if nxt and key not in seen and rx.to_end(nxt) >= 0:
                    seen.add(key)
                    todo.append((nxt, text + ch))
    raise AssertionError(f"no string of {spec} completes from here")


def _quoted(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def _minimal(node: Node, depth: int = 0) -> bytes:
    """The start of the shortest value of `node` (a whole primitive; `{`/`[` for containers, closed later)."""
    if depth > 64:
        raise AssertionError("the schema's references have no finite value")
    if node.alts:
        return min((_minimal(a, depth + 1) for a in node.alts), key=len)
    if node.enum is not None:
        return min(node.enum, key=len)
    k = node.kinds
    if "null" in k:
        return b"null"
    if "integer" in k or "number" in k:
        return minimal_number(dataclasses.replace(node.num, integer="number" not in k))
    if "string" in k:
        return b'"' + _quoted(_string_rest(node.string, 0, _str_start(node.string))) + b'"'
    if "boolean" in k:
        return b"true"
    return b"{" if "object" in k else b"["


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
    if kind == "S":
        mode = top[2]
        if mode != 0:  # finish the escape or character: the first byte that keeps the string possible
            pool = b"0123456789abcdef" if mode > 0 else b'n"\\/tbfr' if mode == -1 else bytes(range(0x80, 0xC0))
            for c in pool:
                if _step_string(top, stack[:-1], c):
                    return bytes((c,))
            raise AssertionError(f"no byte continues the string {top}")
        spec = top[1]
        tail = "" if spec is None else _string_rest(spec, top[4], top[5])
        return _quoted(tail) + b'"'
    if kind == "K":
        allowed, partial = top[1], top[2]
        obj = stack[-2]
        missing = [k.encode() for k in obj[1].required if k not in obj[3] and k.encode().startswith(partial)]
        keys = [k.encode() for k in (allowed or ()) if k.encode().startswith(partial)]
        if not missing and allowed is None:
            return b'"' if partial.decode() not in obj[3] else b'_"'
        best: bytes = min(missing or keys, key=len)
        return best[len(partial) :] + b'"'
    if kind == "N":
        return num_tail(top[1], top[2], top[3])
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
    node, phase, count = top[1], top[2], top[3]  # A
    if phase in "[,":
        if count >= node.min_items:
            return b"]"
        return b"," if phase == "," else _minimal(node.item())
    return _minimal(node.item())


def _closing_one(stack: Stack, memo: dict[Stack, bytes]) -> bytes:
    chain: list[tuple[Stack, bytes]] = []  # the stacks passed and the piece written at each
    for _ in range(100_000):
        if not stack or stack in memo:
            break
        piece = _next_closing(stack)
        if piece == b" ":  # a finished number or literal at the end: only a following byte ends it
            top = stack[-1]
            chain.append((stack, b""))
            stack = _done(stack[:-1]) if top[0] in "LN" else stack
            continue
        fed = _feed(((stack,), 0), piece)
        assert fed is not None, (stack[-1], piece)
        chain.append((stack, piece))
        stack = fed[0][0]
    else:
        raise AssertionError("the closing text does not end")
    out = memo.get(stack, b"") if stack else b""
    if len(memo) > 50_000:
        memo.clear()
    for st, piece in reversed(chain):
        out = piece + out
        memo[st] = out
    return out


def closing(stacks: tuple[Stack, ...], memo: dict[Stack, bytes] | None = None) -> bytes:
    """The short text that completes the JSON (and the suffix) from any of the live `stacks`. `memo` keeps the
    closing of every stack passed (the stacks of one output share their tails: a constraint keeps one)."""
    memo = {} if memo is None else memo
    return min((_closing_one(s, memo) for s in stacks), key=len)


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
    """The output must be `prefix` + JSON matching `schema` (a JSON schema or a compiled Node; any JSON value when
    None; any object with `root_object`) + `suffix`. Implements the engine's `Constraint`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        schema: Any = None,
        root_object: bool = False,
        prefix: str = "",
        suffix: str = "",
    ) -> None:
        node = schema if isinstance(schema, Node) else compile_schema(schema)
        if root_object:
            node = Node(kinds=frozenset({"object"}))
        stack: Stack = ()
        if suffix:
            stack += (("X", suffix.encode(), 0),)
        stack += (("V", node),)
        if prefix:
            stack += (("X", prefix.encode(), 0),)
        self.state: State = ((stack,), 0)
        self.budget: int | None = None  # tokens left, as last told by `forced`
        self.memo: dict[Stack, bytes] = {}  # closing texts of the stacks seen
        self.raw, self.lookup = token_table(tokenizer)
        self.max_len = max((len(b) for b in self.lookup), default=1)

    def allows(self, tok: int) -> bool:
        """Whether token `tok` may come next."""
        data = self.raw[tok] if 0 <= tok < len(self.raw) else b""
        fed = _feed(self.state, data) if data else None
        if fed is None:
            return False
        if self.budget is not None and self.budget - 1 < len(closing(fed[0], self.memo)):
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
        return any(not s for s in self.state[0])

    def closing(self) -> bytes:
        """The shortest text found that completes the output from here."""
        return closing(self.state[0], self.memo)

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
