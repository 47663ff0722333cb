"""Chat templates: a list of chat messages in, the prompt text a model was trained on out.

A GGUF file carries its chat template as Jinja source in `tokenizer.chat_template` (Hugging Face's format). It is
untrusted input, so it is rendered in Jinja2's `ImmutableSandboxedEnvironment`: no attribute starting with `_`, no
method that mutates a list or dict, no import, no file access. Any attempt (and any other failure of the template)
raises `TemplateError`. The template sees the variables Hugging Face's `apply_chat_template` provides: `messages`,
`add_generation_prompt`, `tools`, `bos_token`, `eos_token`, the functions `raise_exception(message)` and
`strftime_now(format)`, and the `tojson` filter that does not escape HTML (tool schemas must stay readable).

A file without a template gets a built-in one picked by its vocabulary: the Gemma turn format
(`<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n`) for Gemma vocabularies, Llama 3's header format
for Llama 3 vocabularies, ChatML (`<|im_start|>role\\n...<|im_end|>\\n`) otherwise.

`render` drops a BOS text the template writes at the very start, as llama.cpp does: the tokenizer adds BOS itself
when the model wants it, so `tokenizer.encode(template.render(messages))` is the prompt, with one BOS.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import jinja2
import jinja2.exceptions
import jinja2.sandbox

from xgrad.errors import XgradError


class TemplateError(XgradError, ValueError):
    """A chat template did not compile, tried something its sandbox forbids, or refused the messages (its
    `raise_exception`)."""


GEMMA_TEMPLATE = """\
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] | trim + '\n\n' -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}
{%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception('Gemma conversations alternate user/assistant/user/... after an optional system message') }}
{%- endif -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\n' + (system if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

CHATML_TEMPLATE = """\
{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\n' }}
{%- endif -%}
"""

LLAMA3_TEMPLATE = """\
{{- bos_token -}}
{%- for message in messages -%}
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif -%}
"""

# a vocabulary holding the first token uses the template (checked in order; ChatML when none matches)
_FALLBACKS = (
    ("<start_of_turn>", "gemma", GEMMA_TEMPLATE),
    ("<|start_header_id|>", "llama3", LLAMA3_TEMPLATE),
)


class _TemplateRaisedError(Exception):
    pass


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaisedError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, made strict: reading an unsafe attribute fails at once instead of yielding an
    undefined value that prints as nothing."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe"
        )


def _environment() -> jinja2.Environment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _content_text(content: Any) -> Any:
    """Message content as templates expect it: a list of parts (OpenAI's format) keeps only its text parts."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return content


class ChatTemplate:
    """A chat template, compiled once, rendered per conversation.

    >>> t = ChatTemplate(CHATML_TEMPLATE)
    >>> t.render([{"role": "user", "content": "Hi!"}])
    '<|im_start|>user\\nHi!<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "custom") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(
                f"the {name} chat template does not compile: {e}; fix tokenizer.chat_template or pass a template"
            ) from e

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], name: str | None = None) -> ChatTemplate:
        """The model's `tokenizer.chat_template` (or `tokenizer.chat_template.<name>`), else the built-in template
        that fits its vocabulary."""
        tokens: Sequence[Any] = metadata.get("tokenizer.ggml.tokens") or ()

        def token(key: str) -> str:
            i = metadata.get(key)
            return str(tokens[i]) if isinstance(i, int) and 0 <= i < len(tokens) else ""

        bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
        key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
        source = metadata.get(key)
        if name is not None and source is None:
            raise TemplateError(f"the model has no chat template named {name!r} (no {key} in its metadata)")
        if isinstance(source, str) and source.strip():
            return cls(source, bos, eos, name=key)
        vocab = set(tokens)
        for marker, fallback, text in _FALLBACKS:
            if marker in vocab:
                return cls(text, bos, eos, name=f"built-in {fallback}")
        return cls(CHATML_TEMPLATE, bos, eos, name="built-in chatml")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (dicts with `role` and `content`, as in OpenAI's chat API), ending with
        the model's turn opening when `add_generation_prompt`. `extra` reaches the template as more variables
        (e.g. `enable_thinking` for Qwen 3). A BOS text at the start is dropped: the tokenizer adds BOS."""
        msgs = [{**m, "content": _content_text(m.get("content", ""))} for m in messages]
        try:
            text = self._template.render(
                **extra,
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except _TemplateRaisedError as e:
            raise TemplateError(f"the {self.name} chat template refused the messages: {e}") from e
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the {self.name} chat template tried something its sandbox forbids: {e}") from e
        except Exception as e:  # any error inside untrusted template code
            raise TemplateError(f"the {self.name} chat template failed: {type(e).__name__}: {e}") from e
        if self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text
