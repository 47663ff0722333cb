"""The regular-expression subset of JSON schema's `pattern`: a pattern in, an NFA over characters out (`Regex`),
which the string frames of `constrain.py` step one character at a time.

ECMA-262 semantics (a match anywhere unless anchored): literals, `.`, classes `[a-z_]`/`[^...]`, the escapes
`\\d \\D \\w \\W \\s \\S` (ASCII `\\d`/`\\w`, as ECMA's), `\\n \\t \\uXXXX \\xXX` and escaped
metacharacters, groups `(...)`, `(?:...)`, `(?<name>...)`, alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy
forms match the same strings), and `^`/`$` at the start or end of a top-level alternative. Backreferences,
lookaround, `\\b`, `\\p{...}` and inner anchors are errors (HTTP 400 naming them).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from xgrad_llm.server.protocol import APIError

MAX_NFA_STATES = 4000


def _bad(path: str, what: str) -> APIError:
    return APIError(f"{path}: {what}", param="response_format")


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
