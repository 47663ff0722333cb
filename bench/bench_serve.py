"""Aggregate decode throughput of `xgrad-llm serve` at 1, 4 and 8 concurrent streams, beside llama-server
(llama-cpp-python's `llama_cpp.server`, same model, same threads) when that is installed.

Run: .venv/bin/python bench/bench_serve.py [--model PATH | --tiny] [--streams 1,4,8] [--tokens 64] [--batch]
     [--client sse|openai] [--peer-python .bench-venv/bin/python] [--peer-extra-bufts on|off]
Each server runs in its own process on a free loopback port. For each concurrency N, N clients stream a chat reply
each (greedy, `max_tokens` = --tokens, distinct prompts) at the same time; the numbers are the generated tokens
(from each stream's usage) over the wall time from the first request to the last [DONE], the same from each stream's
first token on ("decode": prefill excluded), and the mean time to the first token; also the CPU seconds of the server
process and of the clients (this process) during the run, and tokens per server CPU second (steadier than wall time on
a loaded host). xgrad runs with --parallel N.
`--tiny` serves a tiny random-weight llama written on the spot (a smoke run; its numbers mean little). Asserts
nothing. Not run in CI: the peer needs a bench environment (see bench_llm.py; the server also needs
`pip install 'llama-cpp-python[server]'` there), named by --peer-python. llama-server answers one request at a time
(llama-cpp-python's server has one context), so it is measured at every concurrency in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float, path: str = "/health") -> None:
    """Until GET `path` answers 200 (llama_cpp.server has no /health: /v1/models there)."""
    import httpx2 as httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} was not ready after {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_streams(url: str, n: int, tokens: int, pid: int | None = None, client: str = "sse") -> dict[str, float]:
    """Stream n replies at once; with the server's `pid`, also the CPU seconds it and this process (the clients)
    spent meanwhile. `client` "sse" reads the stream with httpx and json (a few microseconds a chunk), "openai" with
    the official client (its typed chunk objects cost ~10x more CPU, which the clients take from the server: they
    share its cores)."""
    import httpx2 as httpx
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=3600)
    http = httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=n + 1))
    results: list[tuple[float, float, float, int]] = []  # start, first token, end, tokens
    lock = threading.Lock()

    def chunks(i: int) -> Any:
        """(content, completion tokens from usage or None) of each chunk of reply i."""
        body: dict[str, Any] = {
            "model": "m",
            "messages": [{"role": "user", "content": f"Write a long story about a river, number {i}."}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if client == "openai":
            for c in oai.chat.completions.create(**body):
                yield (
                    (c.choices[0].delta.content if c.choices else None),
                    (c.usage.completion_tokens if c.usage else None),
                )
            return
        with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                c = json.loads(line[6:])
                content = c["choices"][0].get("delta", {}).get("content") if c.get("choices") else None
                yield content, (c["usage"]["completion_tokens"] if c.get("usage") else None)

    def one(i: int) -> None:
        start = time.perf_counter()
        first = None
        used = pieces = 0
        for content, usage in chunks(i):
            if content:
                pieces += 1
                if first is None:
                    first = time.perf_counter()
            if usage is not None:
                used = usage
        used = used or pieces  # llama_cpp.server sends no usage in streams: one token per content chunk there
        end = time.perf_counter()
        with lock:
            results.append((start, first or end, end, used))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    server_cpu, client_cpu = cpu_seconds(pid) if pid else float("nan"), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server_cpu = (cpu_seconds(pid) if pid else float("nan")) - server_cpu
    client_cpu = time.process_time() - client_cpu
    http.close()
    t0 = min(r[0] for r in results)
    t_first = min(r[1] for r in results)
    t1 = max(r[2] for r in results)
    total = sum(r[3] for r in results)
    return {
        "tokens": total,
        "tok_s": total / (t1 - t0),
        "decode_tok_s": max(total - n, 0) / max(t1 - t_first, 1e-9),
        "ttft_s": sum(r[1] - r[0] for r in results) / n,
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
    }


def start_xgrad(model: str, port: int, parallel: int, threads: int, ctx: int, batch: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NUM_CPU_THREADS": str(threads)}  # the CPU backend's worker threads
    cmd = [
        sys.executable,
        "-m",
        "xgrad_llm",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--max-context",
        str(ctx),
        "--batch" if batch else "--no-batch",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# runs llama_cpp.server, first turning llama.cpp's extra buffer types off when argv[1] is "off" (its AMX matmul
# segfaults in some VMs; bench_llm.py does the same)
LLAMA_SERVER = """
import runpy, sys
if sys.argv.pop(1) == "off":
    import llama_cpp.llama_cpp as api
    default_params = api.llama_model_default_params
    def no_extra_buffers():
        p = default_params()
        p.use_extra_bufts = False
        return p
    api.llama_model_default_params = no_extra_buffers
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


def start_llama(
    python: str, model: str, port: int, threads: int, ctx: int, extra_bufts: str, chat_format: str | None
) -> subprocess.Popen[bytes]:
    cmd = [
        python,
        "-c",
        LLAMA_SERVER,
        extra_bufts,
        "--model",
        model,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--n_threads",
        str(threads),
        "--n_ctx",
        str(ctx),
        *(["--chat_format", chat_format] if chat_format else []),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tiny_model(folder: pathlib.Path) -> str:
    sys.path.insert(0, str(ROOT / "packages" / "llm" / "tests"))
    import serve_helpers

    return str(serve_helpers.write_model(folder)[1])


def default_model() -> str:
    from xgrad_llm.cli import default_model as find

    return find()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a .gguf file (default: Gemma 3 270M Q4_K_M from its pip package)")
    p.add_argument("--tiny", action="store_true", help="a tiny random-weight model (smoke run)")
    p.add_argument("--streams", default="1,4,8", help="concurrencies to measure (default 1,4,8)")
    p.add_argument("--tokens", type=int, default=64, help="max_tokens per stream (default 64)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of each server")
    p.add_argument("--ctx", type=int, default=512, help="context per slot (default 512)")
    p.add_argument("--batch", action="store_true", help="run xgrad with --batch (continuous batching; else --no-batch)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds to wait for a server to load")
    p.add_argument(
        "--client",
        choices=("sse", "openai"),
        default="sse",
        help="how the clients read the streams: httpx + json (default) or the openai package (more CPU a chunk)",
    )
    p.add_argument("--peer-python", default=sys.executable, help="the Python that has llama-cpp-python[server]")
    p.add_argument("--peer-extra-bufts", choices=("on", "off"), default="on", help="llama.cpp's extra buffer types")
    p.add_argument(
        "--peer-chat-format",
        default=None,
        help="llama_cpp.server's --chat_format (default: gemma for a Gemma file, which has no template in its "
        "metadata; llama-2, its fallback, makes Gemma stop at once)",
    )
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    model = tiny_model(pathlib.Path(tmp.name)) if args.tiny else (args.model or default_model())
    counts = [int(x) for x in args.streams.split(",")]
    probe = subprocess.run([args.peer_python, "-c", "import llama_cpp.server.app"], capture_output=True)
    peer = probe.returncode == 0
    if not peer:
        print(f"{args.peer_python} has no llama_cpp.server: no llama-server column (see --peer-python)")
    print(f"model {pathlib.Path(model).name}, {args.tokens} tokens per stream, {args.threads} threads")
    rows: dict[str, dict[int, dict[str, float]]] = {}
    servers: list[tuple[str, Any]] = [("xgrad", None)] + ([("llama-server", None)] if peer else [])
    for name, _ in servers:
        rows[name] = {}
        for n in counts if name == "xgrad" else [0]:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            if name == "xgrad":
                proc = start_xgrad(model, port, n, args.threads, args.ctx, args.batch)
            else:
                gemma = "gemma" in pathlib.Path(model).name.lower()
                chat_format = args.peer_chat_format or ("gemma" if gemma else None)
                ctx = args.ctx * max(counts)
                proc = start_llama(args.peer_python, model, port, args.threads, ctx, args.peer_extra_bufts, chat_format)
            try:
                wait_ready(url, proc, args.timeout, "/health" if name == "xgrad" else "/v1/models")
                run_streams(url, 1, 4)  # warm-up: compiles and captures
                for m in counts if name != "xgrad" else [n]:
                    if name == "xgrad":  # every round size's program (one per number of busy slots, made on first use)
                        for warm in range(1, m + 1):
                            run_streams(url, warm, 4)
                    rows[name][m] = run_streams(url, m, args.tokens, proc.pid, args.client)
                    r = rows[name][m]
                    print(
                        f"{name:12s} {m:2d} streams: {r['tok_s']:7.1f} tok/s, decode {r['decode_tok_s']:7.1f} tok/s, "
                        f"first token {r['ttft_s']:.2f} s ({int(r['tokens'])} tokens); CPU: server "
                        f"{r['server_cpu_s']:.2f} s ({r['tokens'] / r['server_cpu_s']:.1f} tok/CPU-s), clients "
                        f"{r['client_cpu_s']:.2f} s, load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    base = rows["xgrad"].get(1)
    for n, r in rows["xgrad"].items():
        if base and n > 1 and base["decode_tok_s"] > 0:
            cpu = (r["tokens"] / r["server_cpu_s"]) / (base["tokens"] / base["server_cpu_s"])
            print(
                f"xgrad {n} streams / 1 stream: {r['decode_tok_s'] / base['decode_tok_s']:.2f}x "
                f"(tokens per server CPU second: {cpu:.2f}x)"
            )
        if peer and n in rows["llama-server"] and rows["llama-server"][n]["decode_tok_s"] > 0:
            ratio = r["decode_tok_s"] / rows["llama-server"][n]["decode_tok_s"]
            print(f"xgrad / llama-server at {n} streams: {ratio:.2f}x")


if __name__ == "__main__":
    main()
