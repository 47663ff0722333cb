"""The server's engine through HTTP: slots with their own KV caches and prefix reuse, the bounded queue (503 with
Retry-After), a disconnecting client freeing its slot, the per-request timeout, /health and /metrics answering while
the model runs, /v1/embeddings against a numpy forward pass. The model's steps are slowed down where a test needs a
request to stay running (a wrapper around each slot's `Runner.feed`)."""

from __future__ import annotations

import json
import pathlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import serve_helpers as sh  # noqa: E402

from xgrad_llm.generate import LLM, GenerationError  # noqa: E402
from xgrad_llm.server import ServerConfig, create_app  # noqa: E402

CHAT_A = [{"role": "user", "content": "the capital of France is"}]
CHAT_B = [{"role": "user", "content": "hello world!"}]


class Env:
    def __init__(self, url: str, llm: LLM, ref: sh.NumpyLlama, app: Any) -> None:
        self.url, self.llm, self.ref, self.app = url, llm, ref, app
        self.engine = app.state.xgrad.engine
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.delay = 0.0
        self.calls: list[tuple[int, int]] = []  # (slot, tokens fed) of every model step
        for slot in self.engine.slots:  # a knob to make every model step slow, and a log of the steps
            feed = slot.runner.feed
            slot.runner.feed = lambda ids, feed=feed, i=slot.index: (
                self.calls.append((i, len(ids))),
                time.sleep(self.delay),
                feed(ids),
            )[2]
        batch = self.engine.batch  # the batched decode rounds of several slots: slowed and logged too
        step = batch.step
        batch.step = lambda toks, pos, slots=None: (
            self.calls.append((-1, len(toks))),
            time.sleep(self.delay),
            step(toks, pos, slots),
        )[2]

    def http(self) -> Any:
        return self.client._client

    def wait_busy(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.engine.busy_slots() < n:
            assert time.monotonic() < deadline, f"{n} slots never got busy"
            time.sleep(0.01)

    def wait_idle(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.engine.busy_slots() or self.engine.queued():
            assert time.monotonic() < deadline, "a slot stayed busy"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def env(tmp_path_factory: Any) -> Iterator[Env]:
    ref, path = sh.write_model(tmp_path_factory.mktemp("engine"))
    llm = LLM.load(path, max_context=256, chunk=16)
    app = create_app(ServerConfig(model_name="tiny", parallel=2, max_queue=1, batch=True), llm=llm)
    with sh.running(app) as url:
        e = Env(url, llm, ref, app)
        for _ in range(2):  # compile and capture prefill and decode of both slots first
            threads = [
                threading.Thread(
                    target=e.client.completions.create, kwargs=dict(model="t", prompt="a b c", max_tokens=4)
                )
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        yield e


def metrics(env: Env) -> dict[str, float]:
    text = env.http().get(env.url + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_parallel_streams_both_complete_and_each_slot_reuses_its_prefix(env: Env) -> None:
    results: dict[str, Any] = {}

    def run(name: str, messages: list[dict[str, str]]) -> None:
        chunks = list(
            env.client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=20,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        results[name] = ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage)

    env.delay = 0.01
    try:
        threads = [threading.Thread(target=run, args=(n, m)) for n, m in (("a", CHAT_A), ("b", CHAT_B))]
        for t in threads:
            t.start()
        env.wait_busy(2)  # both run at once
        for t in threads:
            t.join()
    finally:
        env.delay = 0.0
    for name, chat in (("a", CHAT_A), ("b", CHAT_B)):
        prompt = env.llm.chat_ids(chat)
        assert results[name][0] == env.llm.decode(env.ref.greedy(prompt, 20))
    assert metrics(env)["xgrad_llm_batched_decode_rounds_total"] > 0  # their decodes ran as batched forwards
    # a follow-up of each conversation lands on the slot that holds it: its whole prompt is cached
    for chat in (CHAT_B, CHAT_A):
        r = env.client.chat.completions.create(model="tiny", messages=chat, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def test_three_requests_on_four_slots_decode_in_rounds_of_their_rows_only(tmp_path: pathlib.Path) -> None:
    """The engine with 4 slots and 3 concurrent greedy requests: rounds of 3 rows (the idle slot computes nothing)
    and each reply equals the numpy oracle's greedy continuation."""
    ref, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=128, chunk=16)
    app = create_app(ServerConfig(model_name="tiny", parallel=4, batch=True), llm=llm)
    rows: list[int] = []
    prompts = ["the capital of France is", "hello world!", "a city"]
    out: dict[int, str] = {}
    with sh.running(app) as url:
        batch = app.state.xgrad.engine.batch
        step = batch.step
        for slot in app.state.xgrad.engine.slots:  # every step slowed a little, so that the three requests overlap
            slot.runner.feed = lambda ids, feed=slot.runner.feed: (time.sleep(0.02), feed(ids))[1]
        batch.step = lambda toks, pos, slots=None: (
            rows.append(len(toks)),
            time.sleep(0.005),
            step(toks, pos, slots),
        )[2]
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def run(i: int) -> None:
            r = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=12, temperature=0)
            out[i] = r.choices[0].text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert 3 in rows and max(rows) == 3, rows  # never a row for the idle slot
    for i, prompt in enumerate(prompts):
        assert out[i] == llm.decode(ref.greedy(llm.encode(prompt), 12)), i


def test_full_queue_answers_503_with_retry_after_and_recovers(env: Env) -> None:
    env.delay = 0.05
    streams = []
    try:
        for _ in range(3):  # two slots and one queue place
            s = env.client.chat.completions.create(model="tiny", messages=CHAT_A, max_tokens=200, stream=True)
            streams.append(s)
        env.wait_busy(2)
        resp = env.http().post(env.url + "/v1/chat/completions", json={"messages": CHAT_B, "max_tokens": 2})
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "server_busy"
        assert env.http().get(env.url + "/health").status_code == 200  # the loop answers while the slots run
        m = metrics(env)
        assert m["xgrad_llm_slots_busy"] == 2 and m["xgrad_llm_requests_deferred"] == 1
    finally:
        env.delay = 0.0
        for s in streams:
            s.close()
    env.wait_idle()
    assert env.client.chat.completions.create(model="tiny", messages=CHAT_B, max_tokens=2).usage.completion_tokens <= 2


def test_client_that_disconnects_frees_its_slot(env: Env) -> None:
    before = metrics(env).get('xgrad_llm_requests_total{outcome="cancelled"}', 0.0)
    env.delay = 0.05
    try:
        stream = env.client.chat.completions.create(model="tiny", messages=CHAT_A, max_tokens=200, stream=True)
        next(iter(stream))
        stream.close()  # streamed: Starlette sees the disconnect
        body = json.dumps({"messages": CHAT_B, "max_tokens": 200}).encode()
        with socket.create_connection(("127.0.0.1", int(env.url.rsplit(":", 1)[1]))) as sock:  # not streamed
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            env.wait_busy(1)
            time.sleep(0.2)
        t0 = time.monotonic()
        env.wait_idle(timeout=5.0)
        assert time.monotonic() - t0 < 2.0  # freed within a few steps, not after 200 of them (10 s)
    finally:
        env.delay = 0.0
    assert metrics(env)['xgrad_llm_requests_total{outcome="cancelled"}'] >= before + 2


def test_request_over_the_timeout_gets_504_and_frees_the_slot(env: Env) -> None:
    env.engine.timeout, env.delay = 0.3, 0.05
    try:
        resp = env.http().post(env.url + "/v1/chat/completions", json={"messages": CHAT_A, "max_tokens": 100})
        assert resp.status_code == 504 and resp.json()["error"]["type"] == "timeout_error"
    finally:
        env.engine.timeout, env.delay = 600.0, 0.0
    env.wait_idle()


def test_metrics_count_tokens_of_each_request(env: Env) -> None:
    env.wait_idle()
    m0 = metrics(env)
    r = env.client.chat.completions.create(
        model="tiny",
        messages=CHAT_B + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
        max_tokens=7,
        temperature=0,
    )
    m1 = metrics(env)
    assert m1["xgrad_llm_tokens_predicted_total"] - m0["xgrad_llm_tokens_predicted_total"] == r.usage.completion_tokens
    ran = m1["xgrad_llm_prompt_tokens_total"] - m0["xgrad_llm_prompt_tokens_total"]
    cached = m1["xgrad_llm_prompt_cached_tokens_total"] - m0["xgrad_llm_prompt_cached_tokens_total"]
    assert ran + cached == r.usage.prompt_tokens and cached == r.usage.prompt_tokens_details.cached_tokens
    assert m1['xgrad_llm_requests_total{outcome="ok"}'] == m0['xgrad_llm_requests_total{outcome="ok"}'] + 1


def test_embeddings_are_normalised_mean_hidden_states(env: Env) -> None:
    texts = ["the capital of France is Paris.", "hello"]
    r = env.client.embeddings.create(model="tiny", input=texts)
    assert [d.index for d in r.data] == [0, 1]
    for d, text in zip(r.data, texts):
        ids = env.llm.encode(text)
        want = env.ref.hidden(ids).mean(axis=0)
        want /= np.linalg.norm(want)
        np.testing.assert_allclose(d.embedding, want, atol=1e-4)
    by_ids = env.client.embeddings.create(model="tiny", input=env.llm.encode("hello"))
    np.testing.assert_allclose(by_ids.data[0].embedding, r.data[1].embedding, atol=1e-6)
    assert r.usage.prompt_tokens == sum(len(env.llm.encode(t)) for t in texts)


def test_long_prompt_is_fed_in_parts_between_the_other_slots_steps(env: Env) -> None:
    env.wait_idle()
    long_chat = [{"role": "user", "content": "the capital of France is Paris. " * 4}]
    prompt = env.llm.chat_ids(long_chat)
    assert len(prompt) > 3 * env.engine.prefill_step
    env.delay = 0.01
    try:
        stream = env.client.chat.completions.create(model="tiny", messages=CHAT_A, max_tokens=100, stream=True)
        next(iter(stream))
        env.calls.clear()
        r = env.client.chat.completions.create(model="tiny", messages=long_chat, max_tokens=2, temperature=0)
        calls = list(env.calls)
        stream.close()
    finally:
        env.delay = 0.0
    assert r.choices[0].message.content == env.llm.decode(env.ref.greedy(prompt, 2))
    b = next(i for i, n in calls if n > 3 * env.engine.prefill_step)  # the long prompt's slot
    step, done = env.engine.prefill_step, r.usage.prompt_tokens_details.cached_tokens
    parts = []
    while len(prompt) - done > step:
        done += step
        parts.append(done)
    fed = [n for i, n in calls if i == b]
    assert fed[: len(parts) + 1] == [*parts, len(prompt)]  # parts, the rest (then a decode, maybe batched)
    first, last = calls.index((b, parts[0])), calls.index((b, len(prompt)))
    assert any(i != b for i, _ in calls[first:last])  # the other stream stepped in between


def gemma3_state(spec: Any, seed: int = 1) -> dict[str, Any]:
    """Random Gemma 3 weights under Hugging Face names (QK-norms, four norms per layer), for tiny_models' writer."""
    rng = np.random.default_rng(seed)
    d, hd = spec.dim, spec.head_dim
    mat = lambda r, c: sh._Array((rng.standard_normal((r, c)) / np.sqrt(c)).astype(np.float32))  # noqa: E731
    vec = lambda n: sh._Array((0.1 * rng.standard_normal(n)).astype(np.float32))  # noqa: E731
    w = {"model.embed_tokens.weight": mat(spec.vocab_size, d), "model.norm.weight": vec(d)}
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
            w[p + name + ".weight"] = vec(d)
        w[p + "post_feedforward_layernorm.weight"] = vec(d)
        w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = vec(hd), vec(hd)
        w[p + "self_attn.q_proj.weight"] = mat(spec.n_heads * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(spec.n_kv_heads * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(spec.n_kv_heads * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, spec.n_heads * hd)
        w[p + "mlp.gate_proj.weight"] = mat(spec.ffn_dim, d)
        w[p + "mlp.up_proj.weight"] = mat(spec.ffn_dim, d)
        w[p + "mlp.down_proj.weight"] = mat(d, spec.ffn_dim)
    return w


def test_batched_decode_rows_equal_one_sequence_each(tmp_path: pathlib.Path) -> None:
    """Continuous batching's forward: three slots at different positions in one pass give each row the logits of
    decoding that slot alone (a gemma3 with a sliding window of 6, QK-norms and post-norms, against the one-sequence
    Runner; the llama through HTTP is checked against numpy above), and a lone decode after batched rounds still
    sees the rows' keys and values."""
    from xgrad_llm.server.batch import BatchDecoder

    # head_dim 32: the scores' products run as 16 partial sums (model.lane_dot); olmoe's 8 below: one sum
    spec = sh.tm.Spec("gemma3", n_layers=2, n_kv_heads=1, head_dim=32, tied=True, sliding_window=6, dim=32)
    state = gemma3_state(spec)
    path = sh.tm.write_gguf(spec, type("M", (), {"state_dict": lambda self: state})(), tmp_path / "g.gguf")
    alone = LLM.load(path, max_context=64, chunk=4)

    def oracle(ids: list[int]) -> np.ndarray:
        alone.runner.cached = []
        return alone.runner.feed(ids)

    llm = LLM.load(path, max_context=64, chunk=4)
    batch = BatchDecoder(llm, 3)
    runners = [batch.runner(b) for b in range(3)]
    ids = [[2, 270, 261, 262], [2, 265, 100, 101, 102, 103, 104, 105, 106, 263], [2, 9]]
    for b in range(3):
        np.testing.assert_allclose(runners[b].feed(ids[b]), oracle(ids[b]), atol=1e-4)
        ids[b].append(int(np.argmax(oracle(ids[b]))))
    for _ in range(4):
        out = batch.decode([x[-1] for x in ids], [len(x) - 1 for x in ids])
        for b in range(3):
            np.testing.assert_allclose(out[b], oracle(ids[b]), atol=1e-4)
            runners[b].cached = list(ids[b])
            ids[b].append(int(np.argmax(out[b])))
    np.testing.assert_allclose(runners[1].feed(ids[1]), oracle(ids[1]), atol=1e-4)
    # a round of rows 0 and 1 only: row 2's cache is not touched
    out = batch.decode([ids[1][-1], ids[0][-1]], [len(ids[1]) - 1, len(ids[0]) - 1], [1, 0])
    np.testing.assert_allclose(out[0], oracle(ids[1]), atol=1e-4)
    np.testing.assert_allclose(out[1], oracle(ids[0]), atol=1e-4)
    np.testing.assert_allclose(runners[2].feed(ids[2]), oracle(ids[2]), atol=1e-4)  # its cached prefix is intact


def test_round_of_three_busy_slots_out_of_four_computes_only_their_rows(tmp_path: pathlib.Path) -> None:
    """4 slots, 3 decoding (slots 0, 1, 3 at different positions; slot 2 holds a prompt): a round of 3 rows gathers
    their caches and gives each the logits of decoding it alone; the idle slot's cache is untouched (its next decode
    equals the oracle), rounds of 2 and of all 4 rows agree too, and each round size is one captured program."""
    from xgrad_llm.server.batch import BatchDecoder

    spec = sh.tm.Spec("gemma3", n_layers=2, n_kv_heads=1, head_dim=16, tied=True, sliding_window=6, dim=32)
    state = gemma3_state(spec, seed=5)
    path = sh.tm.write_gguf(spec, type("M", (), {"state_dict": lambda self: state})(), tmp_path / "g.gguf")
    alone = LLM.load(path, max_context=64, chunk=4)

    def oracle(ids: list[int]) -> np.ndarray:
        alone.runner.cached = []
        return alone.runner.feed(ids)

    batch = BatchDecoder(LLM.load(path, max_context=64, chunk=4), 4)
    runners = [batch.runner(b) for b in range(4)]
    ids = [[2, 270, 261], [2, 265, 100, 101, 102, 103, 104, 105, 263], [2, 9, 10, 11, 12], [2, 7]]
    for b in range(4):
        runners[b].feed(ids[b])
        ids[b].append(int(np.argmax(oracle(ids[b]))))
    busy = [3, 0, 1]
    for _ in range(4):
        out = batch.decode([ids[b][-1] for b in busy], [len(ids[b]) - 1 for b in busy], busy)
        assert out.shape[0] == 3
        for row, b in enumerate(busy):
            np.testing.assert_allclose(out[row], oracle(ids[b]), atol=1e-4)
            runners[b].cached = list(ids[b])
            ids[b].append(int(np.argmax(out[row])))
    assert batch._rounds[2].captured is not None  # the 3-row program was captured and replayed
    np.testing.assert_allclose(runners[2].feed(ids[2]), oracle(ids[2]), atol=1e-4)  # the idle slot's cache
    runners[2].cached = list(ids[2])
    ids[2].append(int(np.argmax(oracle(ids[2]))))
    for slots in ([2, 1], [0, 1, 2, 3], [3, 2, 1, 0]):
        r = batch.step([ids[b][-1] for b in slots], [len(ids[b]) - 1 for b in slots], slots)
        best = [r.best(row) for row in range(len(slots))]  # each row's argmax, computed in the round
        out = r.all_logits()
        for row, b in enumerate(slots):
            np.testing.assert_allclose(out[row], oracle(ids[b]), atol=1e-4)
            np.testing.assert_array_equal(r.logits(row), out[row])
            assert best[row] == int(np.argmax(out[row]))
        for b in slots:
            runners[b].cached = list(ids[b])
            ids[b].append(int(np.argmax(oracle(ids[b]))))
    with pytest.raises(GenerationError, match="distinct slots"):
        batch.decode([1, 1], [3, 3], [0, 0])


def test_batched_decode_with_a_long_context(tmp_path: pathlib.Path) -> None:
    """A round over a cache of 20,000 rows: its attention's index math rounds a position down to a multiple of the
    symbolic row count, whose bound grew with that count squared and made codegen refuse the kernel (an index of
    2.5e9 > int32) at Gemma's serving context; the round equals decoding each row alone."""
    from xgrad_llm.server.batch import BatchDecoder

    spec = sh.tm.Spec("gemma3", n_layers=1, n_kv_heads=1, head_dim=32, tied=True, sliding_window=6, dim=32)
    state = gemma3_state(spec, seed=7)
    path = sh.tm.write_gguf(spec, type("M", (), {"state_dict": lambda self: state})(), tmp_path / "g.gguf")
    alone = LLM.load(path, max_context=64, chunk=4)
    batch = BatchDecoder(LLM.load(path, max_context=20000, chunk=4), 4)
    ids = [[2, 260 + b, 261] for b in range(4)]
    for b in range(4):
        batch.runner(b).feed(ids[b])
    out = batch.decode([i[-1] for i in ids], [len(i) - 1 for i in ids], [0, 1, 2, 3])
    for b in range(4):
        alone.runner.cached = []
        np.testing.assert_allclose(out[b], alone.runner.feed(ids[b]), atol=1e-4)


def olmoe_state(spec: Any, seed: int = 2) -> dict[str, Any]:
    """Random OLMoE weights under Hugging Face names: q/k norms over all heads at once (weights of heads x head_dim),
    a router and 3-d expert tensors, for tiny_models' writer."""
    rng = np.random.default_rng(seed)
    d, hd, e, f = spec.dim, spec.head_dim, spec.n_experts, spec.expert_ffn_dim
    arr = lambda *shape: sh._Array((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))  # noqa: E731
    norm = lambda n: sh._Array((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))  # noqa: E731
    w = {"model.embed_tokens.weight": arr(spec.vocab_size, d), "model.norm.weight": norm(d)}
    w["lm_head.weight"] = arr(spec.vocab_size, d)
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(d), norm(d)
        w[p + "self_attn.q_norm.weight"] = norm(spec.n_heads * hd)
        w[p + "self_attn.k_norm.weight"] = norm(spec.n_kv_heads * hd)
        w[p + "self_attn.q_proj.weight"] = arr(spec.n_heads * hd, d)
        w[p + "self_attn.k_proj.weight"] = arr(spec.n_kv_heads * hd, d)
        w[p + "self_attn.v_proj.weight"] = arr(spec.n_kv_heads * hd, d)
        w[p + "self_attn.o_proj.weight"] = arr(d, spec.n_heads * hd)
        w[p + "mlp.gate.weight"] = arr(e, d)
        w[p + "mlp.experts.gate_up_proj"] = arr(e, 2 * f, d)
        w[p + "mlp.experts.down_proj"] = arr(e, d, f)
    return w


def test_batched_decode_of_olmoe_equals_one_sequence_each(tmp_path: pathlib.Path) -> None:
    """The batched forward projects q/k/v as the model does: OLMoE's q/k norms span all heads and q, k, v are
    clipped (its old copy of the projection normed per head and raised ShapeError); two rows at different positions
    give the logits of decoding each alone, the MoE FFN routing each row on its own."""
    from xgrad_llm.server.batch import BatchDecoder

    spec = sh.tm.Spec("olmoe", n_layers=2, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, clip_qkv=0.5)
    state = olmoe_state(spec)
    path = sh.tm.write_gguf(spec, type("M", (), {"state_dict": lambda self: state})(), tmp_path / "olmoe.gguf")
    alone = LLM.load(path, max_context=32, chunk=4)
    assert alone.model.cfg.clamp_kqv == 0.5

    def oracle(ids: list[int]) -> np.ndarray:
        alone.runner.cached = []
        return alone.runner.feed(ids)

    llm = LLM.load(path, max_context=32, chunk=4)
    batch = BatchDecoder(llm, 2)
    runners = [batch.runner(b) for b in range(2)]
    ids = [[2, 270, 261, 262, 263], [2, 9]]
    for b in range(2):
        np.testing.assert_allclose(runners[b].feed(ids[b]), oracle(ids[b]), atol=1e-4)
        ids[b].append(int(np.argmax(oracle(ids[b]))))
    for _ in range(3):
        out = batch.decode([x[-1] for x in ids], [len(x) - 1 for x in ids])
        for b in range(2):
            np.testing.assert_allclose(out[b], oracle(ids[b]), atol=1e-4)
            ids[b].append(int(np.argmax(out[b])))


def test_a_round_is_batched_whenever_two_or_more_slots_decode() -> None:
    """A batched round computes only the decoding slots' rows, so any two or more decodes share one forward."""
    from xgrad_llm.server.engine import batches

    assert [batches(k, 4) for k in range(5)] == [False, False, True, True, True]
    assert [batches(k, 2) for k in range(3)] == [False, False, True]
    assert not batches(1, 1)


def test_slots_share_one_prefill_and_one_decode_program(tmp_path: pathlib.Path) -> None:
    """Every slot's Runner replays the same captured prefill and decode programs (the cache row is a bound Variable):
    once slot 0 captured them, the first prompt and the first lone decode of slots 1 and 2 run no unjitted trace
    (a fresh slot used to trace and capture its own, stalling every stream for about a second on Gemma 3 270M), and
    each slot's logits equal decoding it alone."""
    from xgrad_llm.server.batch import BatchDecoder

    ref, path = sh.write_model(tmp_path)
    batch = BatchDecoder(LLM.load(path, max_context=64, chunk=4), 3)
    runners = [batch.runner(b) for b in range(3)]
    for ids in ([2, 30, 31, 32, 33, 34], [2, 40, 41, 42, 43, 44, 45], [2, 50], [2, 50, 51], [2, 50, 51, 52]):
        runners[0].feed(ids)  # prefills and lone decodes: unjitted, captured, replayed
    shared = batch._row_runner
    traces: list[str] = []
    for jit in (shared._prefill, shared._decode, shared._write_row):
        assert jit.captured is not None
        jit.fxn = lambda *a, fxn=jit.fxn, **k: (traces.append("trace"), fxn(*a, **k))[1]
    for b, ids in ((1, [2, 60, 61, 62, 63, 64]), (2, [2, 70, 71, 72, 73, 74, 75, 76, 77])):
        np.testing.assert_allclose(runners[b].feed(ids), ref.logits(ids), atol=1e-3)
        np.testing.assert_allclose(runners[b].feed(ids + [9]), ref.logits(ids + [9]), atol=1e-3)
    np.testing.assert_allclose(runners[0].feed([2, 50, 51, 52, 53]), ref.logits([2, 50, 51, 52, 53]), atol=1e-3)
    assert traces == []


def test_warm_engine_captures_every_program_before_the_first_request(tmp_path: pathlib.Path) -> None:
    """`ServerConfig(warm=True)`: the prefill, the lone decode and a batched round of every size are captured before
    the server answers, so concurrent requests only replay programs (no unjitted trace, which would stall every
    stream), and the filler tokens the warm-up wrote into the caches never reach a reply: each equals the numpy
    oracle's greedy continuation and none reuses a cached prefix."""
    ref, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=128, chunk=16)
    # loaded (and warmed) in the background, as `xgrad-llm serve` does: /health answers 503 until the engine is ready
    app = create_app(ServerConfig(model_name="tiny", parallel=3, batch=True, warm=True), loader=lambda: llm)
    prompts = ["the capital of France is", "hello world!", "a city"]
    out: dict[int, Any] = {}
    traces: list[str] = []
    with sh.running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        http = client._client
        deadline = time.monotonic() + 600
        while (status := http.get(url + "/health").status_code) != 200 and time.monotonic() < deadline:
            assert status == 503
            time.sleep(0.1)
        engine = app.state.xgrad.engine
        shared = engine.batch._row_runner
        jits = [shared._prefill, shared._decode, shared._write_row, *engine.batch._rounds[1:]]
        for jit in jits:
            assert jit.captured is not None
            jit.fxn = lambda *a, fxn=jit.fxn, **k: (traces.append("trace"), fxn(*a, **k))[1]
        assert all(s.runner.cached == [] for s in engine.slots)

        def run(i: int) -> None:
            out[i] = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=12, temperature=0)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert traces == []
    for i, prompt in enumerate(prompts):
        assert out[i].choices[0].text == llm.decode(ref.greedy(llm.encode(prompt), 12)), i
        assert out[i].usage.prompt_tokens_details.cached_tokens == 0


def test_greedy_sampling_takes_the_argmax_without_copying_the_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A greedy request without penalties picks the argmax of the logits as they are: `penalize` (a float64 copy of
    the whole vocabulary, 10x the argmax's time for Gemma's 262k tokens, per token of every stream) is skipped; with
    a penalty it still applies."""
    from xgrad_llm.generate import Sampler, SamplingParams

    rng = np.random.default_rng(3)
    logits = rng.standard_normal(5000).astype(np.float32)
    logits[[17, 4000]] = logits.max() + 1  # a tie: the first wins, as numpy's argmax of the float64 logits
    history = [17, 17, 5]
    penalized = Sampler(SamplingParams(presence_penalty=2.0)).penalize(logits, history, history)
    assert penalized[17] == np.float64(logits[17]) - 2.0
    calls: list[int] = []
    real = Sampler.penalize
    monkeypatch.setattr(Sampler, "penalize", lambda self, *a: (calls.append(1), real(self, *a))[1])
    assert Sampler(SamplingParams())(logits, history, history) == int(np.argmax(logits.astype(np.float64))) == 17
    assert calls == []
    assert Sampler(SamplingParams(presence_penalty=2.0))(logits, history, history) == int(np.argmax(penalized))
    assert Sampler(SamplingParams(repetition_penalty=1.5))(logits, history, history) == 4000
    assert len(calls) == 2


def test_events_of_one_round_reach_the_event_loop_with_one_wakeup() -> None:
    """The worker's events for several streams, posted while the event loop is busy, are delivered by one wake-up of
    the loop (one `call_soon_threadsafe`, not one per stream), each to its own stream's queue, in order."""
    import asyncio

    from xgrad_llm.server.app import _Mailbox
    from xgrad_llm.server.engine import Event

    async def main() -> tuple[list[list[str]], list[int]]:
        mailbox = _Mailbox(asyncio.get_running_loop())
        queues: list[asyncio.Queue[Event | None]] = [asyncio.Queue() for _ in range(4)]
        got: list[list[str]] = [[] for _ in queues]
        wakeups = []
        for r in range(3):  # three rounds
            texts = [f"{r}{i}" for i in range(len(queues))]
            poster = threading.Thread(
                target=lambda t=texts: [mailbox.post(q, Event(text=x)) for q, x in zip(queues, t)]
            )
            poster.start()
            poster.join()  # the loop is blocked here: nothing is delivered before the round is whole
            for i, q in enumerate(queues):
                ev = await q.get()
                assert ev is not None
                got[i].append(ev.text)
            wakeups.append(mailbox.wakeups)
        return got, wakeups

    got, wakeups = asyncio.run(main())
    assert got == [[f"{r}{i}" for r in range(3)] for i in range(4)]
    assert wakeups == [1, 2, 3]


def test_greedy_rows_of_a_round_take_its_argmax_and_leave_the_logits_on_the_device(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batched rounds of greedy requests read only each row's argmax (computed in the round), never the logits (1 MB a
    row for Gemma's vocabulary): the replies equal the numpy oracle's greedy continuations. A request that samples
    (temperature > 0) in the same rounds makes the round copy the logits out, for its row only."""
    from xgrad_llm.server.batch import Round

    calls: list[str] = []
    real_logits, real_best = Round.logits, Round.best
    monkeypatch.setattr(Round, "logits", lambda self, b: (calls.append("logits"), real_logits(self, b))[1])
    monkeypatch.setattr(Round, "best", lambda self, b: (calls.append("best"), real_best(self, b))[1])
    ref, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=128, chunk=16)
    app = create_app(ServerConfig(model_name="tiny", parallel=3, batch=True), llm=llm)
    prompts = ["the capital of France is", "hello world!", "a city"]
    with sh.running(app) as url:
        for slot in app.state.xgrad.engine.slots:  # every step slowed a little, so that the requests overlap
            slot.runner.feed = lambda ids, feed=slot.runner.feed: (time.sleep(0.02), feed(ids))[1]
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        for temperatures in ((0, 0, 0), (0, 0, 1.0)):
            calls.clear()
            out: dict[int, str] = {}

            def run(i: int, temperature: float, out: dict[int, str] = out) -> None:
                r = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=12, temperature=temperature)
                out[i] = r.choices[0].text

            threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(temperatures)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i, t in enumerate(temperatures):
                if t == 0:
                    assert out[i] == llm.decode(ref.greedy(llm.encode(prompts[i]), 12)), i
            assert "best" in calls
            if temperatures == (0, 0, 0):
                assert "logits" not in calls
            else:  # the sampling row reads the logits, the greedy rows their argmax
                assert "logits" in calls


def test_warm_without_batching_captures_each_slots_programs(tmp_path: pathlib.Path) -> None:
    """`Engine.warm` with `--no-batch`: every slot has its own Runner, and each one's prefill and decode are captured;
    the slots' caches are forgotten, so a request afterwards equals the numpy oracle's greedy continuation."""
    from xgrad_llm.generate import SamplingParams
    from xgrad_llm.server.engine import Engine, Event, Job

    ref, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=64, chunk=8)
    engine = Engine(llm, parallel=2, batch=False)
    engine.warm()
    for slot in engine.slots:
        assert slot.runner._prefill.captured is not None and slot.runner._decode.captured is not None
        assert slot.runner.cached == []
    events: list[Event] = []
    done = threading.Event()
    engine.start()
    try:
        prompt = llm.encode("hello world!")
        engine.submit(
            Job(prompt, SamplingParams(max_tokens=8), lambda ev: (events.append(ev), ev.finish and done.set()))
        )
        assert done.wait(120)
    finally:
        engine.stop()
    assert "".join(ev.text for ev in events) == llm.decode(ref.greedy(prompt, 8))
    assert events[-1].cached_tokens == 0
