"""Chat output parts: generated text in, OpenAI message deltas out (`content`, `reasoning_content`, `tool_calls`).

`ChatStream` splits the text as it streams: a `<think>...</think>` block is reasoning, a Hermes `<tool_call>{"name":
..., "arguments": {...}}</tool_call>` block or the XML-ish function form (`<function=name>{...}</function>`, or
`<function=name><parameter=key>value</parameter>...</function>`) is a tool call, the rest is content. Text that may
be the start of a tag is held back until it is decided, so a tag never leaks into the content.

`tool_prompt` tells a model whose chat template has no tool support which functions exist and how to call them
(Hermes format), and `tool_messages` rewrites the tool turns of a conversation into text such a template renders.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from xgrad_llm.generate import _stop_prefix_len

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FN_OPEN, FN_CLOSE = "<function=", "</function>"


def _tool_call(index: int, name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "index": index,
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def parse_call(block: str) -> tuple[str, Any] | None:
    """(name, arguments) of one tool-call block's inside (Hermes JSON or the function form), or None."""
    text = block.strip()
    if text.startswith(FN_OPEN):
        m = re.match(r"<function=([^>\s]+)>(.*?)(?:</function>)?\s*$", text, re.S)
        if m is None:
            return None
        name, body = m.group(1), m.group(2).strip()
        params = re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", body, re.S)
        if params:
            args: dict[str, Any] = {}
            for key, raw in params:
                try:
                    args[key] = json.loads(raw.strip())
                except json.JSONDecodeError:
                    args[key] = raw.strip()
            return name, args
        try:
            return name, json.loads(body) if body else {}
        except json.JSONDecodeError:
            return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return obj["name"], obj.get("arguments", obj.get("parameters", {}))


@dataclass
class _Scan:
    """What the text of a Hermes call block says so far: its name, where its arguments value starts and ends (None:
    not yet in the text), and whether the block is no call at all (`bad`)."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    bad: bool = False


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _value_end(s: str, i: int) -> int | None:
    """The end of the JSON value that starts at s[i], or None when the text stops inside it."""
    depth, in_str, esc = 0, False, False
    for j in range(i, len(s)):
        c = s[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
                if depth == 0:
                    return j + 1
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth <= 0:
                return j + 1 if depth == 0 else j
        elif depth == 0 and (c in ", \t\r\n"):
            return j
    return None


def scan_hermes(s: str) -> _Scan:
    """Scan the inside of a `<tool_call>` block for its top-level "name" and "arguments" (or "parameters")."""
    out = _Scan()
    i = _skip_ws(s, 0)
    if i < len(s) and s[i] != "{":
        out.bad = True
        return out
    i += 1
    while True:
        i = _skip_ws(s, i)
        if i >= len(s) or s[i] == "}":
            return out
        if s[i] == ",":
            i += 1
            continue
        if s[i] != '"':
            out.bad = True
            return out
        if (e := _value_end(s, i)) is None:
            return out
        try:
            key = json.loads(s[i:e])
        except json.JSONDecodeError:
            out.bad = True
            return out
        i = _skip_ws(s, e)
        if i >= len(s):
            return out
        if s[i] != ":":
            out.bad = True
            return out
        i = _skip_ws(s, i + 1)
        if i >= len(s):
            return out
        if key in ("arguments", "parameters") and out.args_start is None:
            out.args_start = i
        if (e := _value_end(s, i)) is None:
            return out
        if key == "name":
            try:
                name = json.loads(s[i:e])
            except json.JSONDecodeError:
                name = None
            if not isinstance(name, str):
                out.bad = True
                return out
            out.name = name
        elif i == out.args_start:
            out.args_end = e
        i = e


class ChatStream:
    """Splits streamed text into deltas. `push(text)` and `finish()` return lists of delta dicts.

    A tool call streams as OpenAI's do: once its name is known (and, for the Hermes form, its arguments have begun;
    for the function form, its body shows JSON or parameters) the first `tool_calls` delta carries index, id, type and
    name with empty arguments; later deltas carry fragments of the arguments as they come. Hermes arguments are the
    model's JSON text as it is; the parameter form is written as a JSON object, one key at each `</parameter>`."""

    def __init__(self, tools: bool, thinking: bool = False) -> None:
        self.tools = tools
        self.state = "think" if thinking else "content"
        self.buf = ""
        self.calls = 0
        self.after_think = False  # the newlines right after </think> are not content
        self.opens = (THINK_OPEN, CALL_OPEN, FN_OPEN) if tools else (THINK_OPEN,)
        self.open_call = False  # the current block's first tool-call delta went out
        self.sent = 0  # characters (Hermes, function JSON body) or parameters (function form) of arguments sent

    def push(self, text: str) -> list[dict[str, Any]]:
        """Deltas decided by the text so far."""
        self.buf += text
        out: list[dict[str, Any]] = []
        while True:
            before = (self.state, len(self.buf))
            self._advance(out)
            if (self.state, len(self.buf)) == before:
                return out

    def _advance(self, out: list[dict[str, Any]]) -> None:
        if self.state == "content":
            hits = [(i, tag) for tag in self.opens if (i := self.buf.find(tag)) >= 0]
            if hits:
                i, tag = min(hits)
                self._emit(out, "content", self.buf[:i])
                if tag == THINK_OPEN:
                    self.buf, self.state = self.buf[i + len(tag) :], "think"
                else:  # the function form keeps its opening tag: it carries the name
                    self.buf, self.state = (
                        self.buf[i + len(CALL_OPEN) :] if tag == CALL_OPEN else self.buf[i:],
                        ("call" if tag == CALL_OPEN else "function"),
                    )
                    self.open_call, self.sent = False, 0
                return
            hold = _stop_prefix_len(self.buf, self.opens)
            self._emit(out, "content", self.buf[: len(self.buf) - hold])
            self.buf = self.buf[len(self.buf) - hold :]
        elif self.state == "think":
            i = self.buf.find(THINK_CLOSE)
            if i >= 0:
                self._emit(out, "reasoning_content", self.buf[:i])
                self.buf, self.state = self.buf[i + len(THINK_CLOSE) :], "content"
                self.after_think = True
                return
            hold = _stop_prefix_len(self.buf, (THINK_CLOSE,))
            self._emit(out, "reasoning_content", self.buf[: len(self.buf) - hold])
            self.buf = self.buf[len(self.buf) - hold :]
        else:
            close = CALL_CLOSE if self.state == "call" else FN_CLOSE
            i = self.buf.find(close)
            region = self.buf if i < 0 else self.buf[:i]
            if self.state == "call":
                self._stream_hermes(out, region, closed=i >= 0)
            else:
                self._stream_function(out, region, closed=i >= 0)
            if i >= 0:
                block = self.buf[: i + (len(close) if self.state == "function" else 0)]
                self.buf = self.buf[i + len(close) :].lstrip()
                self.state = "content"
                if self.open_call:
                    self.calls += 1
                else:
                    self._call(out, block)

    def _first(self, out: list[dict[str, Any]], name: str) -> None:
        out.append({"tool_calls": [_tool_call(self.calls, name, "")]})
        self.open_call = True

    def _args(self, out: list[dict[str, Any]], text: str) -> None:
        if text:
            out.append({"tool_calls": [{"index": self.calls, "function": {"arguments": text}}]})

    def _stream_hermes(self, out: list[dict[str, Any]], region: str, closed: bool) -> None:
        scan = scan_hermes(region)
        if scan.bad or scan.args_start is None:
            return
        if not self.open_call:
            if scan.name is None:
                return
            self._first(out, scan.name)
        start, end = scan.args_start, scan.args_end
        if region[start] == '"':  # arguments given as a JSON string: its decoded text, once whole
            if end is not None and not self.sent:
                self._args(out, json.loads(region[start:end]))
                self.sent = 1
            return
        stop = end if end is not None else (len(region.rstrip()) if closed else len(region))
        self._args(out, region[start + self.sent : stop])
        self.sent = max(self.sent, stop - start)

    def _stream_function(self, out: list[dict[str, Any]], region: str, closed: bool) -> None:
        m = re.match(r"<function=([^>\s]+)>", region)
        if m is None:
            return
        body = region[m.end() :]
        j = _skip_ws(body, 0)
        if body.startswith("{", j):
            if not self.open_call:
                self._first(out, m.group(1))
            hold = 0 if closed else _stop_prefix_len(body, (FN_CLOSE,))
            stop = len(body.rstrip()) if closed else len(body) - hold
            self._args(out, body[j + self.sent : stop])
            self.sent = max(self.sent, stop - j)
        elif body.startswith("<parameter=", j) or (closed and not body.strip()):
            if not self.open_call:
                self._first(out, m.group(1))
            params = re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", body, re.S)
            for key, raw in params[self.sent :]:
                try:
                    value = json.loads(raw.strip())
                except json.JSONDecodeError:
                    value = raw.strip()
                lead = "{" if self.sent == 0 else ", "
                self._args(
                    out, lead + json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
                )
                self.sent += 1
            if closed:
                self._args(out, "}" if self.sent else "{}")

    def _call(self, out: list[dict[str, Any]], block: str) -> None:
        parsed = parse_call(block)
        if parsed is None:  # not a call after all: it is content, tags included
            opened = CALL_OPEN if not block.startswith(FN_OPEN) else ""
            closed = CALL_CLOSE if opened else ""
            self._emit(out, "content", opened + block + closed)
            return
        out.append({"tool_calls": [_tool_call(self.calls, *parsed)]})
        self.calls += 1

    def _emit(self, out: list[dict[str, Any]], key: str, text: str) -> None:
        if key == "content" and self.after_think:
            text = text.lstrip("\n")
            self.after_think = not text
        if not text or (key == "content" and self.calls and not text.strip()):
            return  # whitespace between tool calls is not content
        out.append({key: text})

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of what was held back at the end (an unclosed tool call is closed or parsed if it can be)."""
        out: list[dict[str, Any]] = []
        if self.state in ("call", "function"):
            if self.open_call:  # the rest of its arguments as they are
                if self.state == "call":
                    self._stream_hermes(out, self.buf, closed=True)
                else:
                    self._stream_function(out, self.buf, closed=True)
                self.calls += 1
            else:
                self._call(out, self.buf)
        elif self.state == "think":
            self._emit(out, "reasoning_content", self.buf)
        else:
            self._emit(out, "content", self.buf)
        self.buf = ""
        return out


def merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the deltas add up to (for a non-streamed reply)."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    by_index: dict[int, dict[str, Any]] = {}
    for d in deltas:  # a call's first delta names it; the others add fragments of its arguments
        for c in d.get("tool_calls", []):
            if c["index"] not in by_index:
                by_index[c["index"]] = {k: v for k, v in c.items() if k != "index"} | {"function": dict(c["function"])}
            else:
                by_index[c["index"]]["function"]["arguments"] += c["function"].get("arguments", "")
    calls = [by_index[i] for i in sorted(by_index)]
    msg: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool_prompt(tools: list[dict[str, Any]], choice: Any) -> str:
    """System text that lists the functions and the Hermes call format (for templates without tool support)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    must = ""
    if choice == "required":
        must = " You must call at least one function."
    elif isinstance(choice, dict):
        must = f" You must call the function {choice['function']['name']}."
    return (
        "You can call functions. Their signatures are inside <tools></tools>:\n"
        f"<tools>\n{lines}\n</tools>\n"
        "To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' + must
    )


def tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with tool calls written as Hermes text in the assistant turns and tool results as user
    turns in <tool_response> tags, for templates that know only text turns."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function", {}) if isinstance(c, dict) else {}
                args = fn.get("arguments", "{}")
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    pass
                calls.append(f"{CALL_OPEN}\n{json.dumps({'name': fn.get('name'), 'arguments': args})}\n{CALL_CLOSE}")
            text = m.get("content") or ""
            out.append({"role": "assistant", "content": (text + "\n" if text else "") + "\n".join(calls)})
        elif m["role"] == "tool":
            body = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1]["role"] == "user" and str(out[-1]["content"]).startswith("<tool_response>"):
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + body}
            else:
                out.append({"role": "user", "content": body})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out
