"""A batched decode round of k streams against one stream's decode step, in one process: is batching worth it?

Run: .venv/bin/python bench/bench_rounds.py [--model PATH] [--rows 2,4] [--slots 4] [--pos 100] [--reps 20]
     [--threads N] [--cpu-time] [--kernels] [--engine TOKENS]
`xgrad-llm serve --parallel 1` decodes a stream with the model's own step (`Runner`); with more slots, k busy
streams decode in one round of `server/batch.BatchDecoder`. A k-row round that costs r one-stream steps gives k / r
times the single-stream throughput (the server's own work per token aside: `bench_serve.py` measures it whole).
The step and the rounds are timed in turn (best of --reps each), all rows at position --pos. `--cpu-time` times
process CPU time instead of wall time (with --threads 1 this is steadier on a loaded machine: other processes'
time is not counted); `--kernels` also times each kernel of the step and of the last round by itself, in the order
they run, and prints the sums by kind (the output head, the FFN and the other projections, attention, the rest).
`--engine N` also runs the server's engine without HTTP (`server/engine.Engine`, greedy chat requests of N tokens,
distinct prompts, prefill included): one request on one slot against --slots requests on --slots slots, best of 3
(tok/s of wall time and of process CPU time). Asserts nothing; compare the ratios of one run, not across runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from collections.abc import Callable
from typing import Any

KINDS = {  # a kernel's kind by its name's loop sizes (Gemma 3 270M: dim 640, FFN 2048, vocab 262144)
    "head": ("262144",),
    "ffn": ("2048", "640_16_128", "640_32_64"),
    "projections": ("_32_20", "640_32_32"),
    "attention": ("end", "start_pos"),
}


def best(fn: Callable[[], Any], clock: Callable[[], float], times: list[float]) -> None:
    start = clock()
    fn()
    times.append(clock() - start)


def kernel_times(jit: Any, clock: Callable[[], float], reps: int) -> list[tuple[str, float]]:
    """Each kernel of a captured TinyJit replay run alone, in order, `reps` times: (name, best seconds)."""
    steps = [st for st in jit.steps if st.program is not None and st.handles is not None]
    best_s = [float("inf")] * len(steps)
    for _ in range(reps):
        for i, st in enumerate(steps):
            start = clock()
            st.program(st.handles, {**st.var_vals, **jit.var_vals}, wait=True)
            best_s[i] = min(best_s[i], clock() - start)
    return [(st.program.info.name, t) for st, t in zip(steps, best_s)]


def by_kind(times: list[tuple[str, float]]) -> dict[str, float]:
    sums: dict[str, float] = collections.defaultdict(float)
    for name, t in times:
        sums[next((k for k, pats in KINDS.items() if any(p in name for p in pats)), "rest")] += t
    return sums


PROMPTS = (
    "Tell me a long story about a dragon.",
    "Explain how a CPU cache works in detail.",
    "Write a poem about the sea and the wind.",
    "List many facts about the moon, one per line.",
)


def engine_run(llm: Any, engine: Any, n: int, tokens: int) -> tuple[int, float, float]:
    """n greedy chat requests of `tokens` tokens at once: (tokens generated, wall seconds, CPU seconds)."""
    import threading

    from xgrad_llm.generate import SamplingParams
    from xgrad_llm.server.engine import Event, Job

    done, lock = threading.Event(), threading.Lock()
    state = {"tokens": 0, "left": n}

    def emit(ev: Event) -> None:
        if ev.finish is not None:
            with lock:
                state["tokens"] += ev.completion_tokens
                state["left"] -= 1
                if state["left"] == 0:
                    done.set()

    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):  # a fresh prompt each time: no cached prefix
        text = f"{PROMPTS[i % len(PROMPTS)]} ({i}, {time.perf_counter()})"
        engine.submit(Job(llm.chat_ids([{"role": "user", "content": text}]), SamplingParams(max_tokens=tokens), emit))
    done.wait()
    return state["tokens"], time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a .gguf file (default: Gemma 3 270M Q4_K_M from its pip package)")
    p.add_argument("--rows", default="2,4", help="round sizes k to time (default 2,4)")
    p.add_argument("--slots", type=int, default=4, help="the batch decoder's slots (default 4)")
    p.add_argument("--pos", type=int, default=100, help="the position every row decodes at (default 100)")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each (best of; default 20)")
    p.add_argument("--threads", type=int, default=0, help="NUM_CPU_THREADS (default: every core)")
    p.add_argument("--cpu-time", action="store_true", help="time process CPU time, not wall time")
    p.add_argument("--kernels", action="store_true", help="also time each kernel alone, summed by kind")
    p.add_argument("--engine", type=int, default=0, metavar="TOKENS", help="also time the engine (see above)")
    args = p.parse_args()
    if args.threads:
        os.environ["NUM_CPU_THREADS"] = str(args.threads)

    from xgrad_llm.cli import default_model
    from xgrad_llm.generate import LLM
    from xgrad_llm.server.batch import BatchDecoder

    rows = [int(k) for k in args.rows.split(",")]
    if not all(1 <= k <= args.slots for k in rows):
        raise SystemExit(f"--rows must be within 1..--slots ({args.slots}), got {rows}")
    llm = LLM.load(args.model or default_model(), max_context=max(1024, args.pos + args.slots + 1))
    batch = BatchDecoder(llm, args.slots)
    runner = llm.runner
    clock = time.process_time if args.cpu_time else time.perf_counter

    def step() -> Any:
        return runner._decode(runner.tok.bind(10), runner.pos.bind(args.pos)).numpy()

    def round_of(k: int) -> Callable[[], Any]:
        return lambda: batch.decode([10 + b for b in range(k)], [args.pos + b for b in range(k)], list(range(k)))

    calls = {"step": step, **{f"{k} rows": round_of(k) for k in rows}}
    for fn in calls.values():  # capture and warm each program
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.reps):
        for name, fn in calls.items():
            best(fn, clock, times[name])
    one = min(times["step"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model {os.path.basename(args.model or default_model())}, position {args.pos}, load average {load:.2f}")
    print(f"one stream's step: {one * 1e3:.2f} ms ({'CPU' if args.cpu_time else 'wall'} time, best of {args.reps})")
    for k in rows:
        t = min(times[f"{k} rows"])
        print(f"{k}-row round: {t * 1e3:.2f} ms = {t / one:.2f} steps -> {k * one / t:.2f}x one stream's throughput")
    if args.kernels:
        jits = {"step": runner._decode, **{f"{k} rows": batch._rounds[k - 1] for k in rows}}
        for name, jit in jits.items():
            kt = kernel_times(jit, clock, max(3, args.reps // 4))
            kinds = by_kind(kt)
            parts = " ".join(f"{kind} {kinds[kind] * 1e3:.2f}" for kind in (*KINDS, "rest"))
            print(f"  {name:8s} {len(kt):4d} kernels, {sum(t for _, t in kt) * 1e3:6.2f} ms: {parts}")
    if args.engine:
        from xgrad_llm.server.engine import Engine

        engines = {1: Engine(llm, parallel=1), args.slots: Engine(llm, parallel=args.slots)}
        for engine in engines.values():
            engine.start()
        for k in range(1, args.slots + 1):  # capture every round size (and the lone decode) first
            engine_run(llm, engines[args.slots], k, 4)
        engine_run(llm, engines[1], 1, 4)
        rates: dict[int, list[tuple[float, float]]] = {n: [] for n in engines}
        for _ in range(3):
            for n, engine in engines.items():
                got, wall, cpu = engine_run(llm, engine, n, args.engine)
                rates[n].append((got / wall, got / cpu))
        for engine in engines.values():
            engine.stop()
        one_wall, one_cpu = (max(r[i] for r in rates[1]) for i in (0, 1))
        for n in engines:
            w, c = (max(r[i] for r in rates[n]) for i in (0, 1))
            print(
                f"engine, {n} streams: {w:.1f} tok/s wall ({w / one_wall:.2f}x), {c:.1f} tok/CPU-s ({c / one_cpu:.2f}x)"
            )


if __name__ == "__main__":
    main()
