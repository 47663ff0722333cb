"""OpenAI's wire format: a request body (bytes) in, a validated request out; results in, response objects out.

Every problem with a request becomes an `APIError` carrying the HTTP status and OpenAI's error object
(`{"error": {"message", "type", "param", "code"}}`). Unknown fields are ignored, as OpenAI does; a field of the wrong
type, out of range, or a value this server does not support (n > 1) is a 400 naming the field.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xgrad.errors import XgradError

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 16
MAX_TOP_LOGPROBS = 20


class APIError(XgradError):
    """A request the server refuses: `status` is the HTTP status, `body()` OpenAI's error object."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_json(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body: invalid UTF-8, malformed JSON and a non-object are 400s."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(
            f"the request body is not valid UTF-8 ({e.reason} at byte {e.start})", code="invalid_utf8"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise APIError("the request body nests too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(v), type(v).__name__ if v is not None else "null"
    )


class _Fields:
    """Typed reads of a request's fields, each naming the field when it is wrong."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def _bad(self, name: str, want: str) -> APIError:
        got = self.data[name]
        return APIError(f"'{name}' must be {want}, got {_type_name(got)} {json.dumps(got)[:80]}", param=name)

    def number(self, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self._bad(name, "a number")
        if v > hi or v < lo or (lo_open and v == lo):
            raise self._bad(name, f"in {'(' if lo_open else '['}{lo}, {hi}]")
        return float(v)

    def integer(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(name, "an integer")
        if not lo <= v <= hi:
            raise self._bad(name, f"an integer in [{lo}, {hi}]")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(name, "a boolean")
        return v

    def string(self, name: str, default: str | None = None) -> str | None:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self._bad(name, "a string")
        return v

    def obj(self, name: str) -> dict[str, Any] | None:
        v = self.data.get(name)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._bad(name, "an object")
        return v


@dataclass
class Sampling:
    """The sampling fields shared by chat and completions requests."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float | None  # None: not in the request (the server's default applies)
    frequency_penalty: float | None
    repeat_penalty: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int


def _sampling(f: _Fields, max_context: int, legacy_logprobs: bool) -> Sampling:
    d = f.data
    if f.integer("n", 1, 1, 1_000_000) != 1:
        raise APIError("'n' must be 1: this server returns one choice per request", param="n")
    max_tokens = f.integer("max_completion_tokens", None, 1, 1 << 62)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", None, 1, 1 << 62)
    if max_tokens is not None and max_tokens > max_context:
        which = "max_completion_tokens" if d.get("max_completion_tokens") is not None else "max_tokens"
        raise APIError(
            f"'{which}' is {max_tokens}, more than the context of {max_context} tokens; ask for fewer",
            param=which,
        )
    stop_v = d.get("stop")
    stops: tuple[str, ...]
    if stop_v is None:
        stops = ()
    elif isinstance(stop_v, str):
        stops = (stop_v,) if stop_v else ()
    elif isinstance(stop_v, list) and all(isinstance(s, str) for s in stop_v):
        if len(stop_v) > MAX_STOPS:
            raise APIError(f"'stop' holds {len(stop_v)} strings; at most {MAX_STOPS}", param="stop")
        stops = tuple(s for s in stop_v if s)
    else:
        raise f._bad("stop", "a string or an array of strings")
    opts = f.obj("stream_options") or {}
    include_usage = _Fields(opts).boolean("include_usage", False)
    if legacy_logprobs:  # completions: logprobs is how many alternatives to list (0..5)
        n = f.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
        logprobs, top = n is not None, n or 0
    else:
        logprobs = f.boolean("logprobs", False)
        top = f.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0
        if top and not logprobs:
            raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    seed = f.integer("seed", None, -(1 << 63), (1 << 64) - 1)
    return Sampling(
        max_tokens=max_tokens,
        temperature=f.number("temperature", 1.0, 0.0, 2.0),
        top_p=f.number("top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=f.integer("top_k", 0, 0, 1 << 31) or 0,
        min_p=f.number("min_p", 0.0, 0.0, 1.0),
        presence_penalty=None if d.get("presence_penalty") is None else f.number("presence_penalty", 0, -2.0, 2.0),
        frequency_penalty=None if d.get("frequency_penalty") is None else f.number("frequency_penalty", 0, -2.0, 2.0),
        repeat_penalty=f.number("repeat_penalty", 1.0, 0.0, 10.0, lo_open=True),
        seed=None if seed is None else seed % (1 << 64),
        stop=stops,
        stream=f.boolean("stream", False),
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top,
    )


@dataclass
class ChatRequest:
    """A validated /v1/chat/completions request."""

    model: str | None
    messages: list[dict[str, Any]]
    sampling: Sampling
    response_format: dict[str, Any] | None = None  # {"type": "json_object"} or {"type": "json_schema", "schema": ...}
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"


def _content(m: Mapping[str, Any], i: int) -> str | None:
    """A message's text: a string, or the text parts of a content-part array joined."""
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or not isinstance(p.get("type"), str):
                raise APIError(f"messages[{i}].content[{j}] must be an object with a 'type'", param="messages")
            if p["type"] == "text":
                if not isinstance(p.get("text"), str):
                    raise APIError(f"messages[{i}].content[{j}].text must be a string", param="messages")
                parts.append(p["text"])
            else:
                raise APIError(
                    f"messages[{i}].content[{j}] is of type {p['type']!r}; this model reads only 'text' parts",
                    param="messages",
                )
        return "".join(parts)
    raise APIError(f"messages[{i}].content must be a string or an array of content parts", param="messages")


def parse_chat(data: dict[str, Any], max_context: int) -> ChatRequest:
    """Validate a chat completions body."""
    f = _Fields(data)
    msgs = data.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError("'messages' must be a non-empty array of messages", param="messages")
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise APIError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise APIError(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {role!r}", param="messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _content(m, i)}
        if role == "assistant" and isinstance(m.get("tool_calls"), list):
            msg["tool_calls"] = m["tool_calls"]
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        if msg["content"] is None:
            if "tool_calls" not in msg:
                raise APIError(f"messages[{i}].content is missing", param="messages")
            msg["content"] = ""
        messages.append(msg)
    tools = data.get("tools") or []
    if not isinstance(tools, list) or not all(_is_tool(t) for t in tools):
        raise APIError(
            "'tools' must be an array of {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}",
            param="tools",
        )
    choice = data.get("tool_choice", "auto")
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if name not in names:
            raise APIError(f"'tool_choice' names the function {name!r}, which is not in 'tools'", param="tool_choice")
    elif choice not in ("auto", "none", "required"):
        raise APIError("'tool_choice' must be 'auto', 'none', 'required' or a named function", param="tool_choice")
    if choice == "required" and not tools:
        raise APIError("'tool_choice' is 'required' but no 'tools' are given", param="tool_choice")
    return ChatRequest(
        model=f.string("model"),
        messages=messages,
        sampling=_sampling(f, max_context, legacy_logprobs=False),
        response_format=_response_format(f),
        tools=tools,
        tool_choice=choice,
    )


def _is_tool(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return (
        isinstance(fn, dict)
        and t.get("type", "function") == "function"
        and isinstance(fn.get("name"), str)
        and bool(fn["name"])
        and isinstance(fn.get("parameters", {}), dict)
    )


def _response_format(f: _Fields) -> dict[str, Any] | None:
    rf = f.obj("response_format")
    if rf is None or rf.get("type") == "text":
        return None
    if rf.get("type") == "json_object":
        return {"type": "json_object"}
    if rf.get("type") == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise APIError(
                "'response_format.json_schema' must be an object with a 'schema' object", param="response_format"
            )
        return {"type": "json_schema", "schema": js.get("schema", {})}
    raise APIError("'response_format.type' must be 'text', 'json_object' or 'json_schema'", param="response_format")


@dataclass
class CompletionRequest:
    """A validated /v1/completions request: the prompt as text or as token ids."""

    model: str | None
    prompt: str | list[int]
    sampling: Sampling
    echo: bool


def parse_completion(data: dict[str, Any], max_context: int, vocab_size: int) -> CompletionRequest:
    """Validate a completions body (one prompt: a string, token ids, or a one-element array of either)."""
    f = _Fields(data)
    p = data.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]
    prompt: str | list[int]
    if isinstance(p, str):
        prompt = p
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if bad := [t for t in p if not 0 <= t < vocab_size]:
            raise APIError(f"prompt token ids {bad[:5]} are outside the vocabulary of {vocab_size}", param="prompt")
        prompt = list(p)
    else:
        raise APIError(
            "'prompt' must be a string or a non-empty array of token ids (one prompt per request)", param="prompt"
        )
    return CompletionRequest(
        model=f.string("model"),
        prompt=prompt,
        sampling=_sampling(f, max_context, legacy_logprobs=True),
        echo=f.boolean("echo", False),
    )


def parse_tokenize(data: dict[str, Any]) -> tuple[str, bool]:
    """(content, add_special) of a /tokenize body."""
    f = _Fields(data)
    content = f.string("content")
    if content is None:
        raise APIError("'content' (the text to tokenize) is missing", param="content")
    return content, f.boolean("add_special", True)


def parse_detokenize(data: dict[str, Any], vocab_size: int) -> list[int]:
    """The token ids of a /detokenize body."""
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise APIError("'tokens' must be an array of token ids", param="tokens")
    if bad := [t for t in tokens if not 0 <= t < vocab_size]:
        raise APIError(f"token ids {bad[:5]} are outside the vocabulary of {vocab_size}", param="tokens")
    return list(tokens)


def parse_embeddings(data: dict[str, Any]) -> list[str | list[int]]:
    """The inputs of a /v1/embeddings body: a string, an array of strings, token ids or arrays of token ids."""
    x = data.get("input")
    if isinstance(x, str):
        return [x]
    if isinstance(x, list) and x:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in x):
            return [list(x)]
        items: list[str | list[int]] = []
        for v in x:
            if isinstance(v, str):
                items.append(v)
            elif isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
                items.append(list(v))
            else:
                break
        else:
            return items
    raise APIError("'input' must be a string, an array of strings, or token ids", param="input")


def new_id(prefix: str) -> str:
    """A fresh response id such as chatcmpl-3f2a..."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Unix seconds, the `created` field."""
    return int(time.time())


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
