"""JSON schemas for constrained decoding: a schema (a dict) in, a tree of `Node`s out that `constrain.py`'s recognizer
follows (`pattern` goes through `regex.py`).

Keywords that constrain values: `type` (one or a list), `enum`, `const`, `properties`, `required`,
`additionalProperties` (false, true or a schema), `items` (one schema), `minItems`/`maxItems`,
`minLength`/`maxLength` (in code points), `pattern`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`
(numbers, or draft 4's boolean `exclusive*`), `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion
allowed), `anyOf` and `oneOf`. Annotations (`title`, `description`, `default`, ...) are ignored. Any other keyword
is an error (HTTP 400 naming it), never silently ignored. `oneOf` is decoded as `anyOf`: the output matches at least
one alternative, exactly one when the alternatives do not overlap.

`pattern` takes the regex subset that `regex.py` describes (ECMA search semantics). `format` is checked (not an
annotation) for `date`, `time`, `date-time` (RFC 3339: valid days of each month, but never February 29, no leap
second, at most 6 fraction digits) and `uuid`, each as a pattern; other formats are errors.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from xgrad_llm.server.protocol import APIError
from xgrad_llm.server.regex import Regex, compile_regex

_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d\d|00[1-9]\d|000[1-9])"
_DAY = r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))"
_DATE = f"{_YEAR}-{_DAY}"
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
FORMATS = {  # format -> the pattern it is decoded as (a subset of the valid strings)
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
}
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
        "format",
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
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in FORMATS:
                raise _bad(path, f"format {fmt!r} is not supported (supported: {', '.join(FORMATS)}); use a pattern")
            if pattern is not None:
                raise _bad(path, "format beside pattern is not supported; use one of them")
            pattern = compile_regex(FORMATS[fmt], f"{path}.format")
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
