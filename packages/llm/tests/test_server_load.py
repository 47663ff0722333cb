"""A bounded load test on loopback: 32 concurrent streaming clients and 1,000 malformed requests at once. Every valid
request gets a complete answer, every malformed one a 4xx OpenAI error, the process's RSS comes back to within 10% of
where it started, and no slot stays busy."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import pathlib
import sys
import threading
import time
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import serve_helpers as sh  # noqa: E402

from xgrad_llm.generate import LLM  # noqa: E402
from xgrad_llm.server import ServerConfig, create_app  # noqa: E402

CLIENTS = 32
MALFORMED = 1000
CHAT = [{"role": "user", "content": "hello"}]
BAD: list[tuple[str, str, bytes]] = [  # (method, path, body)
    ("POST", "/v1/chat/completions", b'{"messages": ['),
    ("POST", "/v1/chat/completions", b'{"messages": "\xff\xfe\xfd"}'),
    ("POST", "/v1/chat/completions", b"null"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": CHAT, "temperature": "x"}).encode()),
    ("POST", "/v1/chat/completions", json.dumps({"messages": CHAT, "max_tokens": -5}).encode()),
    ("POST", "/v1/chat/completions", json.dumps({"messages": CHAT, "max_tokens": 10**9}).encode()),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()),
    ("POST", "/v1/chat/completions", b'{"messages": "' + b"a" * 70_000 + b'"}'),
    ("POST", "/v1/completions", json.dumps({"prompt": [1, 2, -3]}).encode()),
    ("POST", "/v1/completions", json.dumps({"prompt": {"a": 1}}).encode()),
    ("POST", "/v1/embeddings", json.dumps({"input": 5}).encode()),
    ("POST", "/tokenize", json.dumps({"content": 7}).encode()),
    ("POST", "/detokenize", json.dumps({"tokens": ["a"]}).encode()),
    ("GET", "/v1/chat/completions", b""),
    ("GET", "/v1/nope", b""),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}'),
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not pathlib.Path("/proc/self/statm").exists(), reason="needs /proc to read the RSS")
def test_32_streams_and_1000_malformed_requests(tmp_path: pathlib.Path) -> None:
    _, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=256, chunk=16)
    app = create_app(ServerConfig(model_name="tiny", parallel=2, max_queue=64, max_body=1 << 16, batch=True), llm=llm)
    with sh.running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        http = client._client
        engine = app.state.xgrad.engine

        def stream(i: int) -> tuple[str, Any]:
            chunks = list(
                client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"hello {i}"}],
                    max_tokens=12,
                    temperature=1.0,
                    seed=i,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            return finish, chunks[-1].usage

        def bad(i: int) -> int:
            method, route, body = BAD[i % len(BAD)]
            resp = http.request(method, url + route, content=body, headers={"content-type": "application/json"})
            if resp.status_code >= 400:
                err = resp.json()["error"]
                assert err["message"] and err["type"]
            return int(resp.status_code)

        def load(n_streams: int, n_bad: int) -> tuple[list[tuple[str, Any]], list[int]]:
            with concurrent.futures.ThreadPoolExecutor(CLIENTS + 8) as pool:
                streams = [pool.submit(stream, i) for i in range(n_streams)]
                statuses = list(pool.map(bad, range(n_bad)))
                return [f.result() for f in streams], statuses

        load(8, 200)  # warm-up with as many client threads: compile, capture, the threads' allocator arenas
        gc.collect()
        rss0 = rss_bytes()
        t0 = time.monotonic()
        results, statuses = load(CLIENTS, MALFORMED)
        elapsed = time.monotonic() - t0
        for finish, usage in results:
            assert finish in ("length", "stop") and usage.completion_tokens >= 1
            assert finish == "stop" or usage.completion_tokens == 12
        assert len(statuses) == MALFORMED and all(400 <= s < 500 for s in statuses), sorted(set(statuses))
        deadline = time.monotonic() + 10
        while engine.busy_slots() or engine.queued():
            assert time.monotonic() < deadline, "a slot stayed busy"
            time.sleep(0.05)
        assert threading.active_count() < 80
        gc.collect()
        rss1 = rss_bytes()
        print(f"RSS {rss0 >> 20} -> {rss1 >> 20} MiB; {CLIENTS} streams + {MALFORMED} bad requests in {elapsed:.1f} s")
        assert rss1 <= rss0 * 1.10, f"RSS grew from {rss0 >> 20} to {rss1 >> 20} MiB in {elapsed:.1f} s"
        assert http.get(url + "/health").json()["slots_busy"] == 0
