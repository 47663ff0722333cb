"""Structured output of the server: JSON-constrained decoding (the output always parses, and matches the schema's
types and required keys, even from a random model and a tight token budget), tool calls (Hermes `<tool_call>` and
the function form, streamed as tool-call deltas), and reasoning split out of `<think>` blocks."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tiny_models as tm  # noqa: E402

from xgrad_llm.server.constrain import JSONConstraint, closing, compile_schema, tool_call_node  # noqa: E402
from xgrad_llm.server.protocol import APIError  # noqa: E402
from xgrad_llm.server.tools import ChatStream, merge_deltas, parse_call, tool_messages  # noqa: E402
from xgrad_llm.tokenizer import Tokenizer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "area": {"type": "number"},
        "capital": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["town", "city", 3]},
        "mayor": {"type": ["string", "null"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
    },
    "required": ["city", "population", "where"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


def conforms(value: Any, schema: dict[str, Any]) -> bool:
    """The test's own check of the schema subset: types, enums, required keys, no unknown keys when closed."""
    if "enum" in schema:
        return value in schema["enum"] and type(value) in {type(v) for v in schema["enum"]}
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if kinds and not any(checks[k](value) for k in kinds):
        return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(conforms(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list) and "items" in schema:
        return all(conforms(v, schema["items"]) for v in value)
    return True


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    scores = [0.0] * 260 + [-float(i) for i in range(len(tm.PIECES))]
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tm.VOCAB,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * 256 + [1] * len(tm.PIECES),
            "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.eos_token_id": 1,
        }
    )


def random_walk(tokenizer: Tokenizer, c: JSONConstraint, budget: int, rng: np.random.Generator) -> tuple[str, int]:
    """Pick uniformly among the allowed tokens (a worst-case 'model'), obeying forced tokens; (text, tokens used)."""
    out = b""
    for used in range(budget):
        if c.complete:
            return out.decode(), used
        tok = c.forced(budget - used)
        if tok is None:
            allowed = [t for t in range(tokenizer.vocab_size) if c.allows(t)]
            assert allowed, f"no token allowed after {out!r}"
            tok = int(rng.choice(allowed))
        c.advance(tok)
        out += tokenizer.token_bytes(tok)
    assert c.complete, f"not complete after {budget} tokens: {out!r}"
    return out.decode(), budget


@pytest.mark.parametrize("seed", range(6))
def test_random_choices_always_give_json_matching_the_schema(tokenizer: Tokenizer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(60, 160))
    text, used = random_walk(tokenizer, JSONConstraint(tokenizer, SCHEMA), budget, rng)
    value = json.loads(text)
    assert conforms(value, SCHEMA), text
    assert used <= budget


@pytest.mark.parametrize("seed", range(4))
def test_json_object_mode_and_tool_call_frame(tokenizer: Tokenizer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    text, _ = random_walk(tokenizer, JSONConstraint(tokenizer, root_object=True), 80, rng)
    assert isinstance(json.loads(text), dict)
    node = tool_call_node({"get_weather": WEATHER["function"]["parameters"]})
    c = JSONConstraint(tokenizer, node, prefix="<tool_call>\n", suffix="\n</tool_call>")
    text, _ = random_walk(tokenizer, c, 120, rng)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
    assert call["name"] == "get_weather" and conforms(call["arguments"], WEATHER["function"]["parameters"])


def test_recognizer_refuses_what_json_refuses(tokenizer: Tokenizer) -> None:
    def accepts(text: str, schema: Any = None) -> bool:
        c = JSONConstraint(tokenizer, schema)
        for b in text.encode():
            tok = 4 + b  # the byte token <0xNN>
            if not c.allows(tok):
                return False
            c.advance(tok)
        return c.complete

    for good in ['{"a":[1,-2.5e+3,true,null,"x\\"y\\u00e9"]}', "[]", '"s"', "{ }", '{"k":{"j":[[]]}}']:
        assert accepts(good), good
    for bad in ['{"a" 1}', "[1,]", "01", '{"a":1,}', "tru", '"\\x"', "{'a':1}", "[1 2]"]:
        assert not accepts(bad), bad
    obj = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    assert accepts('{"n":3}', obj)
    assert not accepts('{"n":3.5}', obj) and not accepts("{}", obj) and not accepts('{"m":1}', obj)


def test_closing_text_completes_any_prefix(tokenizer: Tokenizer) -> None:
    for prefix in ['{"city":"Par', '{"where":{"lat":-', '{"tags":["a",', '{"city":"x","population":12', '{"ki']:
        c = JSONConstraint(tokenizer, SCHEMA)
        c.state = (c.state[0], 0)
        for b in prefix.encode():
            c.advance(4 + b)
        assert conforms(json.loads(prefix + closing(c.state[0]).decode()), SCHEMA), prefix


def test_bad_schemas_are_400s() -> None:
    for bad in [{"type": "banana"}, {"properties": []}, {"enum": []}, {"required": "x"}, "nope"]:
        with pytest.raises(APIError) as e:
            compile_schema(bad)
        assert e.value.status == 400 and e.value.param == "response_format"


RICH = {
    "$defs": {
        "point": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -3, "maximum": 7},
                "y": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "tree": {
            "type": "object",
            "properties": {
                "label": {"type": "string", "maxLength": 3},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2},
            },
            "required": ["label"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
        "name": {"type": "string", "minLength": 2, "maxLength": 5, "description": "an annotation"},
        "level": {"type": "integer", "exclusiveMinimum": 10, "maximum": 13},
        "ratio": {"type": "number", "minimum": -1.5, "exclusiveMaximum": -1.25},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", 1]}, "minItems": 1, "maxItems": 3},
        "where": {"$ref": "#/$defs/point"},
        "tree": {"$ref": "#/$defs/tree"},
        "either": {
            "anyOf": [
                {"type": "string", "pattern": "x+"},
                {"type": "integer", "minimum": 100},
                {
                    "type": "object",
                    "properties": {"k": {"const": True}},
                    "required": ["k"],
                    "additionalProperties": False,
                },
            ]
        },
        "one": {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
        "kind": {"const": "fixed"},
        "extra": {"type": "object", "additionalProperties": {"type": "integer", "maximum": 0}},
    },
    "required": ["code", "name", "level", "ratio", "tags", "where", "tree", "either", "kind"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(8))
def test_random_choices_satisfy_value_constraints_by_jsonschema(tokenizer: Tokenizer, seed: int) -> None:
    """enum/const, integer and number bounds, length and item counts, pattern, $ref (recursive too), anyOf/oneOf
    and additionalProperties (false and a schema): a walk choosing uniformly among the allowed tokens, with a budget
    from tight to roomy, always ends in JSON that the reference validator accepts."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle of this test")
    rng = np.random.default_rng(seed)
    c = JSONConstraint(tokenizer, RICH)
    tight = len(c.closing()) + 1
    budget = int(rng.integers(tight, tight + 200))
    text, _ = random_walk(tokenizer, c, budget, rng)
    jsonschema.Draft202012Validator(RICH).validate(json.loads(text))


@pytest.mark.parametrize("seed", range(4))
def test_a_call_of_one_of_several_tools_follows_that_tools_parameters(tokenizer: Tokenizer, seed: int) -> None:
    """Several functions: the call names one first, then its arguments follow that function's own schema (with
    its own $defs); another function's keys are refused."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle of this test")
    params = {
        "get_weather": WEATHER["function"]["parameters"],
        "move": {
            "$defs": {"step": {"type": "integer", "minimum": 1, "maximum": 3}},
            "type": "object",
            "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1}},
            "required": ["steps"],
            "additionalProperties": False,
        },
    }
    rng = np.random.default_rng(seed)
    for _ in range(4):
        c = JSONConstraint(tokenizer, tool_call_node(params))
        text, _ = random_walk(tokenizer, c, int(rng.integers(40, 120)), rng)
        call = json.loads(text)
        assert list(call) == ["name", "arguments"]
        jsonschema.Draft202012Validator(params[call["name"]]).validate(call["arguments"])
    assert accepts(tokenizer, tool_call_node(params), '{"name": "move", "arguments": {"steps": [3, 1]}}')
    assert not accepts(tokenizer, tool_call_node(params), '{"name": "move", "arguments": {"city": "x", "days": 1}}')
    assert not accepts(tokenizer, tool_call_node(params), '{"arguments": {"steps": [1]}, "name": "move"}')
    with pytest.raises(APIError) as e:
        tool_call_node({"f": {"type": "object", "propertyNames": {"maxLength": 2}}})
    assert e.value.param == "tools" and "'propertyNames'" in str(e.value)


def accepts(tokenizer: Tokenizer, schema: dict[str, Any], text: str) -> bool:
    """Whether the constraint takes `text` byte by byte and is then complete."""
    c = JSONConstraint(tokenizer, schema)
    for b in text.encode():
        if not c.allows(4 + b):
            return False
        c.advance(4 + b)
    return c.complete


def test_number_bounds_accept_exactly_the_numbers_in_range(tokenizer: Tokenizer) -> None:
    """Against exact rational comparison: every integer in -130..130 and every one- or two-decimal number in
    -3..3 is accepted inside an array iff it is within the bounds (inclusive or exclusive)."""
    from fractions import Fraction

    cases = [
        ({"type": "integer", "minimum": -7, "maximum": 105}, lambda v: -7 <= v <= 105),
        ({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 12}, lambda v: 9 < v < 12),
        ({"type": "integer", "minimum": -120.5, "maximum": -99}, lambda v: -120.5 <= v <= -99),
        ({"type": "integer", "minimum": 0}, lambda v: v >= 0),
    ]
    for schema, ok in cases:
        arr = {"type": "array", "items": schema}
        for v in range(-130, 131):
            assert accepts(tokenizer, arr, f"[{v}]") == ok(v), (schema, v)
        assert not accepts(tokenizer, arr, "[1.0]") and not accepts(tokenizer, arr, "[1e2]")
    cases = [
        (
            {"type": "number", "minimum": -1.5, "exclusiveMaximum": 0.25},
            lambda v: Fraction("-1.5") <= v < Fraction("0.25"),
        ),
        ({"type": "number", "exclusiveMinimum": 0.1, "maximum": 2}, lambda v: Fraction("0.1") < v <= 2),
        ({"type": "number", "maximum": -2.75}, lambda v: v <= Fraction("-2.75")),
    ]
    for schema, ok in cases:
        arr = {"type": "array", "items": schema}
        for hundredths in range(-300, 301, 1):
            v = Fraction(hundredths, 100)
            for text in {f"{float(v):.2f}", f"{float(v):.1f}" if hundredths % 10 == 0 else f"{float(v):.2f}"}:
                assert accepts(tokenizer, arr, f"[{text}]") == ok(Fraction(text)), (schema, text)


def test_pattern_subset_agrees_with_python_re(tokenizer: Tokenizer) -> None:
    """Strings over a small alphabet are accepted iff re.search finds the pattern (ECMA search semantics: unanchored
    unless ^/$; ECMA's \\w and \\d are ASCII, hence re.ASCII), and length bounds count code points."""
    import itertools
    import re

    patterns = [
        "^[a-c]+$",
        "ab",
        "^a(b|cd)*$",
        "^(?:ab|c){2,3}$|^d$",
        "c\\d?$",
        "^[^b]b{1,2}",
        "^\\w\\W\\s?.$",
        "^a*?c?$",
        "^é+$",
    ]
    words = ["".join(p) for n in range(4) for p in itertools.product("abcd1 é", repeat=n)]
    words += ["".join(p) for p in itertools.product("abcd1 é", repeat=4)][::7]
    for pattern in patterns:
        schema = {"type": "array", "items": {"type": "string", "pattern": pattern}}
        for w in words:
            assert accepts(tokenizer, schema, json.dumps([w], ensure_ascii=False)) == bool(
                re.search(pattern, w, re.ASCII)
            ), (
                pattern,
                w,
            )
    sized = {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 3}}
    for w in ["a", "ab", "abc", "abcd", "éé", "ééé", "éééé", "\n\t"]:
        assert accepts(tokenizer, sized, json.dumps([w], ensure_ascii=False)) == (2 <= len(w) <= 3), w
    assert accepts(tokenizer, sized, '["a\\n"]') and not accepts(tokenizer, sized, '["\\u0041b"]')


@pytest.mark.parametrize("seed", range(3))
def test_formats_give_strings_that_parse_as_dates_times_and_uuids(tokenizer: Tokenizer, seed: int) -> None:
    """date, time, date-time and uuid are decoded as patterns: random walks give strings that Python's own parsers
    take (datetime's fromisoformat, uuid.UUID), and malformed ones are refused."""
    import datetime
    import uuid

    schema = {
        "type": "object",
        "properties": {f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid")},
        "required": ["date", "time", "date-time", "uuid"],
        "additionalProperties": False,
    }
    rng = np.random.default_rng(seed)
    c = JSONConstraint(tokenizer, schema)
    text, _ = random_walk(tokenizer, c, len(c.closing()) + int(rng.integers(1, 80)), rng)
    value = json.loads(text)
    datetime.date.fromisoformat(value["date"])
    datetime.time.fromisoformat(value["time"])
    datetime.datetime.fromisoformat(value["date-time"])
    assert str(uuid.UUID(value["uuid"])) == value["uuid"]
    dates = {"type": "array", "items": schema["properties"]["date"]}
    assert accepts(tokenizer, dates, '["2024-01-31", "0001-12-01"]')
    for bad in ("2023-02-30", "2023-04-31", "0000-01-01", "2023-1-01", "2023-01-01T"):
        assert not accepts(tokenizer, dates, json.dumps([bad])), bad


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "string", "format": "email"}, "format 'email'"),
        ({"type": "string", "format": "date", "pattern": "^1"}, "format beside pattern"),
        ({"type": "object", "minProperties": 1}, "'minProperties'"),
        ({"allOf": [{"type": "string"}]}, "'allOf'"),
        ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "'not'"),
        ({"type": "array", "items": [{"type": "string"}]}, "items"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "names nothing"),
        ({"type": "string", "pattern": "(a)\\1"}, "escape \\1"),
        ({"type": "string", "pattern": "a(?=b)"}, "lookaround"),
        ({"type": "string", "pattern": "a^b"}, "'^'"),
        ({"type": "integer", "minimum": 3, "exclusiveMaximum": 4, "maximum": 9}, None),
        ({"type": "integer", "minimum": 3.5, "maximum": 3.9}, "no integer"),
        ({"type": "string", "minLength": 4, "maxLength": 2}, "minLength"),
        ({"enum": ["a"], "type": "integer"}, "enum"),
    ],
)
def test_unsupported_or_impossible_schemas_are_400s_naming_the_keyword(schema: Any, named: str | None) -> None:
    if named is None:  # a valid one: only 3 is in range
        assert compile_schema(schema).num.hi == 4
        return
    with pytest.raises(APIError) as e:
        compile_schema({"type": "object", "properties": {"v": schema}})
    assert e.value.status == 400 and e.value.param == "response_format" and named in str(e.value), str(e.value)


def test_chat_stream_splits_think_tool_calls_and_content_at_any_cut() -> None:
    text = (
        "<think>plan: call it</think>\nSure. <tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<function=lookup>{"q": "x<y"}</function> <tool_call>not json</tool_call>'
    )
    whole = ChatStream(tools=True)
    msg = merge_deltas(whole.push(text) + whole.finish())
    assert msg["reasoning_content"] == "plan: call it"
    assert msg["content"] == "Sure. <tool_call>not json</tool_call>"
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]]
    assert calls == [("get_weather", {"city": "Paris", "days": 2}), ("lookup", {"q": "x<y"})]
    for cut in range(1, 8):  # streamed in pieces of every size: the same message
        s = ChatStream(tools=True)
        deltas = [d for i in range(0, len(text), cut) for d in s.push(text[i : i + cut])] + s.finish()
        assert all("<think" not in d.get("content", "") for d in deltas)
        again = merge_deltas(deltas)
        assert again["content"] == msg["content"] and again["reasoning_content"] == msg["reasoning_content"]
        assert [c["function"] for c in again["tool_calls"]] == [c["function"] for c in msg["tool_calls"]]
    assert merge_deltas(ChatStream(tools=False).push("a <tool_call>{}</tool_call>")) == {
        "role": "assistant",
        "content": "a <tool_call>{}</tool_call>",
    }  # without tools the tags are text
    opened = ChatStream(tools=False, thinking=True)  # the template opened <think> in the prompt
    assert merge_deltas(opened.push("hmm</think>Yes") + opened.finish())["reasoning_content"] == "hmm"


def stream_chunks(deltas: list[dict[str, Any]], finish: str) -> list[dict[str, Any]]:
    """The chat.completion.chunk objects the server sends for these deltas (the app's framing, written out here)."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "tiny"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    return chunks + [{**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]


def test_tool_call_arguments_stream_in_fragments_that_the_openai_client_accumulates() -> None:
    """Two calls (Hermes JSON, then the parameter form) fed a few characters at a time: the first delta of each call
    carries index, id, type and name with empty arguments, later ones only argument fragments; the official client's
    stream accumulator adds them up to two calls with indexes 0 and 1 whose arguments parse."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    text = (
        'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\\"is", "days": [1, {"x": 2}]}}'
        "\n</tool_call>\n<function=lookup>\n<parameter=q>\nx<y\n</parameter>\n<parameter=n>3</parameter>\n</function>"
    )
    for cut in (1, 3, 7):
        s = ChatStream(tools=True)
        deltas = [d for i in range(0, len(text), cut) for d in s.push(text[i : i + cut])] + s.finish()
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        for index in (0, 1):
            mine = [c for c in calls if c["index"] == index]
            assert mine[0]["function"]["arguments"] == "" and mine[0]["type"] == "function"
            assert mine[0]["id"].startswith("call_") and mine[0]["function"]["name"]
            assert all("id" not in c and "name" not in c["function"] for c in mine[1:])
            assert len(mine) > 2  # the arguments came in fragments
        state = ChatCompletionStreamState()
        for chunk in stream_chunks(deltas, "tool_calls"):
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
        message = state.get_final_completion().choices[0].message
        assert message.content == "Let me look. "
        got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        assert got == [("get_weather", {"city": 'Par"is', "days": [1, {"x": 2}]}), ("lookup", {"q": "x<y", "n": 3})]
    s = ChatStream(tools=True)  # arguments as a JSON string, and a call cut off at the end of the output
    deltas = s.push('<tool_call>{"arguments": "{\\"a\\": 1}", "name": "f"}</tool_call><tool_call>{"name": "g", "a')
    deltas += s.push('rguments": {"b": tr') + s.finish()
    msg = merge_deltas(deltas)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        ("f", '{"a": 1}'),
        ("g", '{"b": tr'),
    ]


def test_function_form_with_parameters_and_tool_turns_as_text() -> None:
    assert parse_call("<function=f><parameter=a>3</parameter><parameter=b>hi there</parameter></function>") == (
        "f",
        {"a": 3, "b": "hi there"},
    )
    msgs = tool_messages(
        [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ]
    )
    assert msgs[1] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert msgs[2] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


# ---- through the server ----
@pytest.fixture(scope="module")
def served(tmp_path_factory: Any) -> Iterator[tuple[Any, Any]]:
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    import serve_helpers as sh

    from xgrad_llm.generate import LLM
    from xgrad_llm.server import ServerConfig, create_app

    _, path = sh.write_model(tmp_path_factory.mktemp("structured"))
    llm = LLM.load(path, max_context=1024, chunk=16)
    with sh.running(create_app(ServerConfig(model_name="tiny"), llm=llm)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60), llm


def test_response_format_json_schema_through_the_client(served: tuple[Any, Any]) -> None:
    client, _ = served
    for seed in (1, 2):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "a city as JSON"}],
            max_tokens=120,
            seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
        )
        assert conforms(json.loads(r.choices[0].message.content), SCHEMA)
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "JSON"}],
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_value_constraints_through_the_client_and_unsupported_keyword_400(served: tuple[Any, Any]) -> None:
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle of this test")
    client, _ = served
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "JSON"}],
        max_tokens=400,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "rich", "schema": RICH, "strict": True}},
    )
    jsonschema.Draft202012Validator(RICH).validate(json.loads(r.choices[0].message.content))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "JSON"}],
            max_tokens=20,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "patternProperties": {"^a": {}}}},
            },
        )
    assert e.value.status_code == 400 and "'patternProperties'" in e.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_call_is_returned_as_tool_calls(served: tuple[Any, Any], stream: bool) -> None:
    client, _ = served
    kw: dict[str, Any] = dict(
        model="tiny",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        max_tokens=100,
        seed=4,
        tools=[WEATHER],
        tool_choice="required",
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert deltas and all(d.index == 0 for d in deltas)
        assert deltas[0].id and deltas[0].function.name and deltas[0].function.arguments == ""
        assert len(deltas) > 2 and all(d.id is None and d.function.name is None for d in deltas[1:])
        name = "".join(d.function.name or "" for d in deltas)
        args = "".join(d.function.arguments or "" for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        r = client.chat.completions.create(**kw)
        (call,) = r.choices[0].message.tool_calls
        name, args, finish = call.function.name, call.function.arguments, r.choices[0].finish_reason
        content = r.choices[0].message.content or ""
        assert call.id.startswith("call_") and call.type == "function"
    assert name == "get_weather" and finish == "tool_calls" and content == ""
    assert conforms(json.loads(args), WEATHER["function"]["parameters"])


def test_tools_reach_the_prompt_natively_or_as_a_system_text() -> None:
    """A template that renders `tools` gets them; a template without tool support gets the Hermes instructions in
    the system turn and earlier calls and results as text; a prompt ending in <think> starts in reasoning."""
    import types

    import serve_helpers as sh

    from xgrad_llm.server.chat import chat_prompt
    from xgrad_llm.server.protocol import parse_chat
    from xgrad_llm.template import CHATML_TEMPLATE, ChatTemplate

    def prompt(template: str, body: dict[str, Any]) -> tuple[str, bool]:
        fake = types.SimpleNamespace(template=ChatTemplate(template), encode=lambda text: list(text.encode()))
        ids, thinking = chat_prompt(fake, parse_chat(body, 4096))  # type: ignore[arg-type]
        return bytes(ids).decode(), thinking

    turns = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    native, _ = prompt(sh.CHATML_TOOLS, {"messages": turns[:1], "tools": [WEATHER]})
    assert native.startswith("<|im_start|>system\n<tools>") and '"name": "get_weather"' in native
    text, thinking = prompt(CHATML_TEMPLATE, {"messages": turns, "tools": [WEATHER], "tool_choice": "required"})
    assert text.startswith("<|im_start|>system\nYou can call functions.") and "You must call at least one" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>" in text and not thinking
    plain, _ = prompt(CHATML_TEMPLATE, {"messages": turns[:1], "tools": [WEATHER], "tool_choice": "none"})
    assert "<tools>" not in plain and "tool_call" not in plain
    _, thinking = prompt(CHATML_TEMPLATE.replace("assistant\n'", "assistant\n<think>\n'"), {"messages": turns[:1]})
    assert thinking
