"""JSON numbers for constrained decoding: the grammar of a number's text as phases (`num_next`), and its bounds
(`NumSpec`) checked on prefixes: a prefix passes while some number it begins is within the bounds, so the output
can always end in range. Numbers with bounds take no exponent (their completions would be unbounded).

In: a number's spec, its phase and text so far, a byte. Out: the next phase (or None), whether it may end here, and
the bytes that complete it within the bounds (`num_tail`, `minimal_number`).
"""

from __future__ import annotations

from fractions import Fraction

from xgrad_llm.server.schema import NumSpec

MAX_DIGITS = 24
DIGITS = frozenset(b"0123456789")


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


def _int_bounds(spec: NumSpec) -> tuple[int | None, int | None]:
    """The least and greatest integers within the bounds (None: unbounded)."""
    lo = hi = None
    if spec.lo is not None:
        lo = spec.lo.__ceil__()
        lo += spec.lo_x and lo == spec.lo
    if spec.hi is not None:
        hi = spec.hi.__floor__()
        hi -= spec.hi_x and hi == spec.hi
    return lo, hi


def _meets(a: Fraction, b: Fraction | None, spec: NumSpec) -> bool:
    """Whether some x with a <= x < b (b None: no end) is within the bounds of `spec`."""
    lower, l_incl = a, True
    if spec.lo is not None and spec.lo > a:
        lower, l_incl = spec.lo, not spec.lo_x
    elif spec.lo is not None and spec.lo == a:
        l_incl = not spec.lo_x
    upper, u_incl = b, False
    if spec.hi is not None and (upper is None or spec.hi < upper):
        upper, u_incl = spec.hi, not spec.hi_x
    if upper is None:
        return True
    return lower < upper or (lower == upper and l_incl and u_incl)


def _num_viable(spec: NumSpec, text: bytes) -> bool:
    """Whether some number that `text` begins (no exponent) is within the bounds."""
    s = text.decode()
    neg = s.startswith("-")
    ip, dot, fp = s[neg:].partition(".")
    if neg:  # the magnitude's bounds
        lo, hi = (None if spec.hi is None else -spec.hi), (None if spec.lo is None else -spec.lo)
        spec = NumSpec(spec.integer, lo, hi, spec.hi_x, spec.lo_x)
    if spec.integer:
        lo_i, hi_i = _int_bounds(spec)
        if not ip:
            spans: list[tuple[int, int | None]] = [(0, None)]
        elif ip == "0":
            spans = [(0, 0)]
        else:
            n = int(ip)
            spans = [(n * 10**j, n * 10**j + 10**j - 1) for j in range(MAX_DIGITS - len(s) + 1)]
        return any((hi_i is None or a <= hi_i) and (lo_i is None or b is None or lo_i <= b) for a, b in spans)
    if not ip:
        return _meets(Fraction(0), None, spec)
    if dot:
        v0 = Fraction(ip + "." + (fp or "0"))
        return _meets(v0, v0 + Fraction(1, 10 ** len(fp)), spec)
    if ip == "0":
        return _meets(Fraction(0), Fraction(1), spec)
    n = int(ip)
    return any(_meets(Fraction(n * 10**j), Fraction((n + 1) * 10**j), spec) for j in range(MAX_DIGITS - len(s) + 1))


def num_next(spec: NumSpec, phase: str, text: bytes, c: int) -> str | None:
    """The number's phase after byte `c`, or None when `c` cannot extend it."""
    cls = _num_class(c)
    nxt = _NUM[phase].get(cls)
    if nxt is None or (spec.integer and cls in ".e" and phase != "e") or (spec.bounded and cls == "e"):
        return None
    if len(text) >= MAX_DIGITS and phase in _NUM_DONE:
        return None
    if spec.bounded and not _num_viable(spec, text + bytes((c,))):
        return None
    return nxt


def num_ends(spec: NumSpec, phase: str, text: bytes) -> bool:
    """Whether the number may end after `text` (a whole number, within the bounds)."""
    return phase in _NUM_DONE and (not spec.bounded or spec.holds(Fraction(text.decode())))


def num_tail(spec: NumSpec, phase: str, text: bytes) -> bytes:
    """The next byte towards a number within the bounds: one that ends it in range if any, else the first that
    keeps a completion in range; b" " when it may end here."""
    if num_ends(spec, phase, text):
        return b" "
    first = None
    for c in b"0123456789.-":
        nxt = num_next(spec, phase, text, c)
        if nxt is None:
            continue
        if num_ends(spec, nxt, text + bytes((c,))):
            return bytes((c,))
        first = first if first is not None else bytes((c,))
    assert first is not None, (spec, text)
    return first


def minimal_number(spec: NumSpec) -> bytes:
    """A short number within the bounds (the one `num_tail` leads to from nothing)."""
    phase, text = "start", b""
    for _ in range(4 * MAX_DIGITS):
        piece = num_tail(spec, phase, text)
        if piece == b" ":
            return text
        nxt = num_next(spec, phase, text, piece[0])
        assert nxt is not None
        phase, text = nxt, text + piece
    raise AssertionError(f"no number found within {spec}")
