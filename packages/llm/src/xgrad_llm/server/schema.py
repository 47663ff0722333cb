"""JSON schemas for constrained decoding: a schema (a dict) in, a tree of `Node`s out that `constrain.py`'s recognizer
follows; and the regular-expression subset of `pattern`, compiled to an NFA over characters.

Keywords that constrain values: `type` (one or a list), `enum`, `const`, `properties`, `required`,
`additionalProperties` (false, true or a schema), `items` (one schema), `minItems`/`maxItems`,
`minLength`/`maxLength` (in code points), `pattern`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`
(numbers, or draft 4's boolean `exclusive*`), `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion
allowed), `anyOf` and `oneOf`. Annotations (`title`, `description`, `default`, ...) are ignored. Any other keyword
is an error (HTTP 400 naming it), never silently ignored. `oneOf` is decoded as `anyOf`: the output matches at least
one alternative, exactly one when the alternatives do not overlap.

`pattern` (ECMA-262 semantics: a match anywhere unless anchored) supports literals, `.`, classes `[a-z_]`/`[^...]`,
the escapes `\\d \\D \\w \\W \\s \\S` and escaped metacharacters, groups `(...)`, `(?:...)`, `(?<name>...)`,
alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy forms match the same strings), and `^`/`$` at the start or
end of a top-level alternative. Backreferences, lookaround, `\\b`, `\\p{...}` and inner anchors are errors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from xgrad_llm.server.protocol import APIError

KINDS = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly"}
)
KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "$ref",
        "$defs",
        "definitions",
        "anyOf",
        "oneOf",
    }
)
MAX_NFA_STATES = 4000


@dataclass(frozen=True)
class NumSpec:
    """A number's type and bounds (None: unbounded; `*_x`: exclusive)."""

    integer: bool = False
    lo: Fraction | None = None
    hi: Fraction | None = None
    lo_x: bool = False
    hi_x: bool = False

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None

    def holds(self, v: Fraction) -> bool:
        """Whether `v` is within the bounds."""
        if self.lo is not None and (v < self.lo or (self.lo_x and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_x and v == self.hi)))


@dataclass(frozen=True, eq=False)
class Regex:
    """An NFA over characters: `eps` and `moves` (CharSet, target) per state; state 0 starts, `accept` ends. `dist`
    is each state's fewest characters to the accept state (-1: none)."""

    source: str
    eps: tuple[tuple[int, ...], ...]
    moves: tuple[tuple[tuple[CharSet, int], ...], ...]
    accept: int
    dist: tuple[int, ...]

    def closure(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        """The states reachable through empty moves."""
        todo, seen = list(states), set(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def start(self) -> frozenset[int]:
        return self.closure({0})

    def step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        """The states after character `ch`."""
        return self.closure({t for s in states for cs, t in self.moves[s] if cs.has(ch)})

    def to_end(self, states: frozenset[int]) -> int:
        """The fewest characters that reach the accept state from `states` (-1: never)."""
        ds = [self.dist[s] for s in states if self.dist[s] >= 0]
        return min(ds) if ds else -1


@dataclass(frozen=True)
class CharSet:
    """Characters in `ranges` (inclusive code-point pairs), or outside them when `negate`."""

    ranges: tuple[tuple[int, int], ...]
    negate: bool = False

    def has(self, ch: str) -> bool:
        o = ord(ch)
        return any(lo <= o <= hi for lo, hi in self.ranges) != self.negate

    def sample(self) -> str | None:
        """A printable character of the set, ASCII letters and digits first (None: none found)."""
        for ch in "a0A_-x. ":
            if self.has(ch):
                return ch
        for lo, hi in self.ranges if not self.negate else ((0x21, 0x7E), (0xA1, 0x2FF)):
            for o in range(max(lo, 0x20), min(hi, lo + 256) + 1):
                if self.has(chr(o)) and chr(o).isprintable():
                    return chr(o)
        return None


@dataclass(frozen=True)
class StrSpec:
    """A string's length bounds (code points) and pattern."""

    min_len: int = 0
    max_len: int | None = None
    pattern: Regex | None = None


@dataclass(eq=False)
class Node:
    """A compiled schema: which kinds of value it accepts and what their parts must be. `alts` (anyOf/oneOf): the
    value follows one of them instead; `additional`: the schema of keys not in `props` (None: any value), `closed`:
    no keys but `props` (additionalProperties: false)."""

    kinds: frozenset[str] = KINDS
    props: dict[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    additional: Node | None = None
    closed: bool = False
    items: Node | None = None
    enum: tuple[bytes, ...] | None = None
    ordered: bool = False  # keys come in the order of `props` (a tool call names its function first)
    alts: tuple[Node, ...] = ()
    num: NumSpec = NumSpec()
    string: StrSpec = StrSpec()
    min_items: int = 0
    max_items: int | None = None

    def child(self, key: str) -> Node:
        return self.props.get(key) or self.additional or ANY

    def item(self) -> Node:
        return self.items or ANY


ANY = Node()


def _bad(path: str, what: str, param: str = "response_format") -> APIError:
    return APIError(f"{path}: {what}", param=param)


class _Compiler:
    def __init__(self, root: Any, param: str) -> None:
        self.root, self.param = root, param
        self.refs: dict[str, Node] = {}

    def node(self, schema: Any, path: str) -> Node:
        try:
            return self._node(schema, path)
        except APIError as e:
            e.param = self.param
            raise

    def _node(self, schema: Any, path: str) -> Node:
        if schema is True or schema == {}:
            return ANY
        if not isinstance(schema, dict):
            raise _bad(path, "must be a JSON schema object")
        unknown = [k for k in schema if k not in KEYWORDS and k not in ANNOTATIONS]
        if unknown:
            raise _bad(
                path,
                f"the JSON schema keyword {unknown[0]!r} is not supported by constrained decoding (supported: "
                f"{', '.join(sorted(KEYWORDS))}); remove it or express it with those",
            )
        constraining = {k for k in schema if k not in ANNOTATIONS and k not in ("$defs", "definitions")}
        if "$ref" in schema:
            if constraining != {"$ref"}:
                raise _bad(path, "'$ref' beside other keywords is not supported; move them into the referenced schema")
            return self.ref(schema["$ref"], path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = schema[key]
                if constraining != {key}:
                    raise _bad(path, f"{key!r} beside other keywords is not supported; move them into each alternative")
                if not isinstance(alts, list) or not alts:
                    raise _bad(path, f"{key} must be a non-empty array of schemas")
                return Node(alts=tuple(self.node(a, f"{path}.{key}[{i}]") for i, a in enumerate(alts)))
        return self.plain(schema, path)

    def ref(self, ref: Any, path: str) -> Node:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise _bad(path, f"$ref {ref!r} is not supported: only '#' and '#/$defs/...' or '#/definitions/...'")
        if ref not in self.refs:
            target = self.root
            for part in ref[2:].split("/") if ref != "#" else []:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise _bad(path, f"$ref {ref!r} names nothing in the schema")
                target = target[part]
            placeholder = self.refs[ref] = Node()  # a recursive reference finds this one, filled in below
            done = self.node(target, ref)
            for f in dataclasses.fields(Node):
                setattr(placeholder, f.name, getattr(done, f.name))
        return self.refs[ref]

    def plain(self, schema: dict[str, Any], path: str) -> Node:
        kind = schema.get("type")
        if kind is None:
            kinds = KINDS
        else:
            names = [kind] if isinstance(kind, str) else kind
            if not isinstance(names, list) or not names or not all(isinstance(k, str) and k in KINDS for k in names):
                raise _bad(path, f"type {kind!r} is not a JSON schema type")
            kinds = frozenset(names)
        node = Node(kinds=kinds)
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not values:
                raise _bad(path, "enum must be a non-empty array")
            if kind is not None:
                values = [v for v in values if _kind_of(v) in kinds or (_kind_of(v) == "integer" and "number" in kinds)]
                if not values:
                    raise _bad(path, f"no member of enum/const is of type {kind!r}")
            node.enum = tuple(json.dumps(v, ensure_ascii=False).encode() for v in values)
            return node
        props_raw = schema.get("properties", {})
        if not isinstance(props_raw, dict):
            raise _bad(path, "properties must be an object")
        node.props = {k: self.node(v, f"{path}.properties.{k}") for k, v in props_raw.items()}
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _bad(path, "required must be an array of key names")
        node.required = tuple(dict.fromkeys(required))
        extra = schema.get("additionalProperties", True)
        node.closed = extra is False
        if not isinstance(extra, bool):
            node.additional = self.node(extra, f"{path}.additionalProperties")
        if node.closed and (missing := [r for r in node.required if r not in node.props]):
            raise _bad(path, f"required key {missing[0]!r} is not in properties and additionalProperties is false")
        if "items" in schema:
            if not isinstance(schema["items"], dict | bool):
                raise _bad(path, "items must be one schema (the array form is not supported)")
            node.items = self.node(schema["items"], f"{path}.items")
        node.min_items, node.max_items = _size(schema, "minItems", "maxItems", path)
        min_len, max_len = _size(schema, "minLength", "maxLength", path)
        pattern = None
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise _bad(path, "pattern must be a string")
            pattern = compile_regex(schema["pattern"], f"{path}.pattern")
        node.string = StrSpec(min_len, max_len, pattern)
        node.num = _num_spec(schema, "number" not in kinds, path)
        return node


def _kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _size(schema: dict[str, Any], lo_key: str, hi_key: str, path: str) -> tuple[int, int | None]:
    lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
    for key, v in ((lo_key, lo), (hi_key, hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise _bad(path, f"{key} must be a non-negative integer, got {v!r}")
    if hi is not None and lo > hi:
        raise _bad(path, f"{lo_key} {lo} is above {hi_key} {hi}: no value can satisfy both")
    return lo, hi


def _number(v: Any, key: str, path: str) -> Fraction:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(path, f"{key} must be a number, got {v!r}")
    return Fraction(v) if isinstance(v, int) else Fraction(repr(v))


def _num_spec(schema: dict[str, Any], integer: bool, path: str) -> NumSpec:
    lo = hi = None
    lo_x = hi_x = False
    if "minimum" in schema:
        lo = _number(schema["minimum"], "minimum", path)
    if "maximum" in schema:
        hi = _number(schema["maximum"], "maximum", path)
    for key, is_lo in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        if key not in schema:
            continue
        v = schema[key]
        if isinstance(v, bool):  # draft 4: a flag on minimum/maximum
            if is_lo:
                lo_x = v and lo is not None
            else:
                hi_x = v and hi is not None
            continue
        x = _number(v, key, path)
        if is_lo and (lo is None or x >= lo):
            lo, lo_x = x, True
        elif not is_lo and (hi is None or x <= hi):
            hi, hi_x = x, True
    spec = NumSpec(integer, lo, hi, lo_x, hi_x)
    if lo is not None and hi is not None:
        empty = lo > hi or (lo == hi and (lo_x or hi_x))
        if integer and not empty:
            first = lo.__ceil__() + (lo_x and lo.__ceil__() == lo)
            empty = not spec.holds(Fraction(first))
        if empty:
            raise _bad(path, f"no {'integer' if integer else 'number'} lies within the minimum and maximum")
    return spec


def compile_schema(schema: Any, path: str = "schema", param: str = "response_format") -> Node:
    """The Node of a JSON schema (a dict; True, None or {} accept anything). Raises APIError (HTTP 400, its `param`
    the request field given) naming an unsupported keyword or a malformed schema."""
    if schema is None:
        return ANY
    return _Compiler(schema, param).node(schema, path)


# ---- pattern: a regex subset to an NFA ----
_DIGIT = ((48, 57),)
_WORD = ((48, 57), (65, 90), (95, 95), (97, 122))
_SPACE = ((9, 13), (32, 32), (0xA0, 0xA0), (0x2028, 0x2029), (0xFEFF, 0xFEFF))
_CLASSES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True)}
_CLASSES |= {"s": (_SPACE, False), "S": (_SPACE, True)}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_ANY_BUT_NEWLINE = CharSet(((10, 10), (13, 13), (0x2028, 0x2029)), negate=True)
_EVERYTHING = CharSet((), negate=True)

Ast = tuple[Any, ...]  # ("set", CharSet) | ("cat", [Ast]) | ("alt", [Ast]) | ("rep", Ast, min, max | None)


class _RegexParser:
    def __init__(self, src: str, path: str) -> None:
        self.src, self.i, self.path = src, 0, path

    def error(self, what: str) -> APIError:
        return _bad(self.path, f"{what} at offset {self.i} of {self.src!r} (see the supported regex subset)")

    def peek(self) -> str | None:
        return self.src[self.i] if self.i < len(self.src) else None

    def top(self) -> Ast:
        """The whole pattern: each top-level alternative anchored by its own ^/$ or open-ended (ECMA search)."""
        branches = []
        while True:
            head = self.peek() == "^"
            self.i += head
            seq = self.seq(top=True)
            tail = bool(seq) and seq[-1] == ("end",)
            seq = [x for x in seq if x != ("end",)]
            any_run: Ast = ("rep", ("set", _EVERYTHING), 0, None)
            branches.append(("cat", ([] if head else [any_run]) + seq + ([] if tail else [any_run])))
            if self.peek() != "|":
                break
            self.i += 1
        if self.i != len(self.src):
            raise self.error("an unmatched ')'")
        return ("alt", branches)

    def alt(self) -> Ast:
        branches = [("cat", self.seq())]
        while self.peek() == "|":
            self.i += 1
            branches.append(("cat", self.seq()))
        return ("alt", branches)

    def seq(self, top: bool = False) -> list[Ast]:
        out: list[Ast] = []
        while (c := self.peek()) is not None and c not in "|)":
            if c == "$":
                self.i += 1
                if not top or self.peek() not in (None, "|"):
                    raise self.error("'$' is supported only at the end of the pattern or of a top-level alternative")
                out.append(("end",))
                continue
            if c == "^":
                raise self.error("'^' is supported only at the start of the pattern or of a top-level alternative")
            out.append(self.quantified(self.atom()))
        return out

    def atom(self) -> Ast:
        c = self.src[self.i]
        self.i += 1
        if c == ".":
            return ("set", _ANY_BUT_NEWLINE)
        if c == "(":
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.src.startswith("?<", self.i) and self.src[self.i + 2 : self.i + 3] not in ("=", "!"):
                end = self.src.find(">", self.i)
                if end < 0:
                    raise self.error("an unclosed group name")
                self.i = end + 1
            elif self.peek() == "?":
                raise self.error("lookaround and other '(?' groups are not supported")
            inner = self.alt()
            if self.peek() != ")":
                raise self.error("an unclosed '('")
            self.i += 1
            return inner
        if c == "[":
            return ("set", self.charclass())
        if c == "\\":
            return ("set", self.escape(in_class=False))
        if c in "*+?{":
            raise self.error(f"a quantifier {c!r} with nothing before it")
        return ("set", CharSet(((ord(c), ord(c)),)))

    def escape(self, in_class: bool) -> CharSet:
        if self.i >= len(self.src):
            raise self.error("a trailing backslash")
        c = self.src[self.i]
        self.i += 1
        if c in _CLASSES:
            ranges, negate = _CLASSES[c]
            return CharSet(ranges, negate)
        if c in _ESCAPES:
            o = ord(_ESCAPES[c])
            return CharSet(((o, o),))
        if c in "ux":
            n = 4 if c == "u" else 2
            digits = self.src[self.i : self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"a malformed \\{c} escape")
            self.i += n
            o = int(digits, 16)
            return CharSet(((o, o),))
        if c.isalnum():
            raise self.error(f"the escape \\{c} is not supported")
        return CharSet(((ord(c), ord(c)),))

    def charclass(self) -> CharSet:
        negate = self.peek() == "^"
        self.i += negate
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.error("an unclosed '['")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                self.i += 1
                cs = self.escape(in_class=True)
                if cs.negate:
                    raise self.error("a negated class escape (\\D, \\W, \\S) inside [...]")
                ranges += cs.ranges
                continue
            self.i += 1
            lo = ord(c)
            if self.peek() == "-" and self.src[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi_c = self.src[self.i]
                self.i += 1
                if hi_c == "\\":
                    cs = self.escape(in_class=True)
                    if len(cs.ranges) != 1 or cs.ranges[0][0] != cs.ranges[0][1]:
                        raise self.error("a class escape as the end of a range")
                    hi = cs.ranges[0][0]
                else:
                    hi = ord(hi_c)
                if hi < lo:
                    raise self.error("a range out of order")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return CharSet(tuple(ranges), negate)

    def quantified(self, atom: Ast) -> Ast:
        while (c := self.peek()) is not None and c in "*+?{":
            if c == "{":
                end = self.src.find("}", self.i)
                body = self.src[self.i + 1 : end] if end > 0 else ""
                lo_s, _, hi_s = body.partition(",")
                if not lo_s.isdigit() or (hi_s and not hi_s.isdigit()):
                    return atom  # a literal '{' in ECMA's annex B: treat as text
                lo, hi = int(lo_s), (int(hi_s) if hi_s else (None if "," in body else int(lo_s)))
                if hi is not None and hi < lo:
                    raise self.error("a {n,m} quantifier with m < n")
                self.i = end + 1
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if self.peek() == "?":  # lazy: the same strings match
                self.i += 1
            atom = ("rep", atom, lo, hi)
        return atom


def compile_regex(src: str, path: str = "pattern") -> Regex:
    """The NFA of a pattern in the supported subset (APIError naming what is not)."""
    ast = _RegexParser(src, path).top()
    eps: list[list[int]] = []
    moves: list[list[tuple[CharSet, int]]] = []

    def new() -> int:
        if len(eps) >= MAX_NFA_STATES:
            raise _bad(path, f"the pattern {src!r} needs more than {MAX_NFA_STATES} states (large repetition counts)")
        eps.append([])
        moves.append([])
        return len(eps) - 1

    def build(a: Ast, start: int) -> int:
        """Add `a` from state `start`; its end state."""
        if a[0] == "set":
            end = new()
            moves[start].append((a[1], end))
            return end
        if a[0] == "cat":
            for part in a[1]:
                start = build(part, start)
            return start
        if a[0] == "alt":
            end = new()
            for part in a[1]:
                s = new()
                eps[start].append(s)
                eps[build(part, s)].append(end)
            return end
        _, inner, lo, hi = a
        for _ in range(lo):
            start = build(inner, start)
        if hi is None:
            loop = new()
            eps[start].append(loop)
            eps[build(inner, loop)].append(loop)
            return loop
        end = new()
        eps[start].append(end)
        for _ in range(hi - lo):
            start = build(inner, start)
            eps[start].append(end)
        return end

    new()
    accept = build(ast, 0)
    # fewest characters to the accept state: a 0-1 BFS over the reversed moves
    back: list[list[tuple[int, int]]] = [[] for _ in eps]
    for s in range(len(eps)):
        for t in eps[s]:
            back[t].append((s, 0))
        for _, t in moves[s]:
            back[t].append((s, 1))
    dist = [-1] * len(eps)
    dist[accept] = 0
    todo: collections.deque[int] = collections.deque([accept])
    while todo:
        t = todo.popleft()
        for s, w in back[t]:
            if dist[s] < 0 or dist[t] + w < dist[s]:
                dist[s] = dist[t] + w
                if w:
                    todo.append(s)
                else:
                    todo.appendleft(s)
    return Regex(src, tuple(tuple(e) for e in eps), tuple(tuple(m) for m in moves), accept, tuple(dist))
