"""xgrad-llm against llama.cpp on one GGUF file: prefill and decode tok/s and peak RSS, side by side.

Run: .venv/bin/python bench/bench_llm.py [--model PATH] [--prompt 128] [--gen 128] [--threads 2] [--rounds 2]
     [--peer-python .bench-venv/bin/python] [--peer-extra-bufts auto|on|off]
The peer is llama.cpp through `llama-cpp-python`, which builds llama.cpp from source (about 20 minutes on 2 cores),
so it lives in a bench environment, never in CI or xgrad's dependencies:
    python3.11 -m venv .bench-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" .bench-venv/bin/pip install llama-cpp-python numpy
Each measurement runs in a fresh process (its peak RSS is its own), xgrad and llama.cpp taking turns for --rounds
rounds; the best round of each counts. Both get the same random prompt of --prompt token ids (prefill), then decode
--gen tokens greedily, on --threads threads. xgrad's weights stay packed (the default); its decode is also put
against the machine's read bandwidth: the bytes of weights one decode step reads over the step's time, as a share
of the best of a few all-thread reads of a 256 MiB buffer (an xgrad sum, which streams memory at the hardware's
pace). Asserts nothing; on a shared machine compare the ratios of one run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent

XGRAD_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import numpy as np
    from xgrad import Tensor
    from xgrad.dtype import dtypes
    from xgrad_llm.generate import LLM
    path, n_prompt, n_gen, numerics = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    llm = LLM.load(path, max_context=n_prompt + n_gen + 64, numerics=numerics)
    r = llm.benchmark(n_prompt=n_prompt, n_gen=n_gen)
    r["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the bandwidth buffer
    buf = Tensor.ones(64 << 20, dtype=dtypes.float32).contiguous().realize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter(); buf.sum().realize(); best = min(best, time.perf_counter() - t)
    r["read_gb_s"] = buf.nbytes() / best / 1e9
    r["weight_bytes"] = llm.model.weight_nbytes
    print("RESULT " + json.dumps(r))
    """
)

LLAMA_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import numpy as np
    import llama_cpp.llama as api
    from llama_cpp import Llama
    path, n_prompt, n_gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if sys.argv[5] == "off":  # llama.cpp's extra buffer types (AMX matmul, repacked weights) off
        default_params = api.llama_cpp.llama_model_default_params
        def no_extra_buffers():
            p = default_params()
            p.use_extra_bufts = False
            return p
        api.llama_cpp.llama_model_default_params = no_extra_buffers
    llm = Llama(model_path=path, n_ctx=n_prompt + n_gen + 64, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    vocab = llm.n_vocab()
    rng = np.random.default_rng(0)
    warm = [int(x) for x in rng.integers(0, vocab, 16)]
    llm.reset(); llm.eval(warm)
    prompt = [int(x) for x in rng.integers(0, vocab, n_prompt)]
    llm.reset()
    t0 = time.perf_counter(); llm.eval(prompt); t1 = time.perf_counter()
    for _ in range(n_gen):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    t2 = time.perf_counter()
    r = {"prefill_tok_s": n_prompt / (t1 - t0), "decode_tok_s": n_gen / (t2 - t1),
         "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print("RESULT " + json.dumps(r))
    """
)


def run_child(cmd: list[str], env: dict[str, str], quiet: bool = False) -> dict[str, Any] | None:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    if not quiet:
        print(f"  failed ({out.returncode}): {out.stderr.strip()[-600:]}", file=sys.stderr)
    return None


def default_model() -> str:
    from xgrad_llm.cli import default_model as find

    return find()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file (default: the Gemma 3 270M Q4_K_M package's)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--numerics",
        choices=("xgrad", "llama.cpp"),
        default="xgrad",
        help="xgrad's arithmetic (see xgrad_llm.numerics)",
    )
    p.add_argument("--peer-python", default=str(ROOT / ".bench-venv" / "bin" / "python"))
    p.add_argument(
        "--peer-extra-bufts",
        choices=("auto", "on", "off"),
        default="auto",
        help="llama.cpp's extra buffer types (AMX, repacked weights); auto: on, off if that run crashes",
    )
    args = p.parse_args()
    model = args.model or default_model()
    env = {**os.environ, "NUM_CPU_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    peer_ok = pathlib.Path(args.peer_python).exists()
    if peer_ok:
        check = subprocess.run([args.peer_python, "-c", "import llama_cpp"], capture_output=True)
        peer_ok = check.returncode == 0
    if not peer_ok:
        print(f"llama-cpp-python is not importable from {args.peer_python}: xgrad only (see the docstring)")
    print(f"model {model}\nprompt {args.prompt} tokens, decode {args.gen} tokens, {args.threads} threads")
    print(f"xgrad numerics: {args.numerics}")
    best: dict[str, dict[str, float]] = {}
    for rnd in range(args.rounds):
        xgrad_cmd = [sys.executable, "-c", XGRAD_CHILD, model, str(args.prompt), str(args.gen), args.numerics]
        runs = [("xgrad", xgrad_cmd)]
        if peer_ok:
            cmd = [args.peer_python, "-c", LLAMA_CHILD, model, str(args.prompt), str(args.gen), str(args.threads)]
            runs.append(("llama.cpp", cmd))
        for name, cmd in runs:
            if name == "llama.cpp":
                bufts = "on" if args.peer_extra_bufts == "auto" else args.peer_extra_bufts
                r = run_child([*cmd, bufts], env, quiet=args.peer_extra_bufts == "auto")
                if r is None and args.peer_extra_bufts == "auto":
                    print("llama.cpp crashed with its extra buffer types (AMX on this CPU?): rerun with them off")
                    args.peer_extra_bufts = "off"
                    r = run_child([*cmd, "off"], env)
            else:
                r = run_child(cmd, env)
            if r is None:
                continue
            print(
                f"round {rnd + 1} {name:9s} prefill {r['prefill_tok_s']:7.1f} tok/s  decode {r['decode_tok_s']:6.1f} "
                f"tok/s  peak RSS {r['peak_rss_mib']:6.0f} MiB"
            )
            b = best.setdefault(name, dict(r))
            for key in ("prefill_tok_s", "decode_tok_s", "read_gb_s"):
                if key in r:
                    b[key] = max(b[key], r[key])
            b["peak_rss_mib"] = min(b["peak_rss_mib"], r["peak_rss_mib"])
    x = best.get("xgrad")
    if x is None:
        sys.exit("xgrad failed to run")
    print(f"\nbest of {args.rounds} rounds:")
    for name, r in best.items():
        print(
            f"  {name:9s} prefill {r['prefill_tok_s']:7.1f} tok/s  decode {r['decode_tok_s']:6.1f} tok/s  "
            f"peak RSS {r['peak_rss_mib']:6.0f} MiB"
        )
    read = x["weight_bytes"] * x["decode_tok_s"] / 1e9
    print(
        f"xgrad decode reads {x['weight_bytes'] / 2**20:.0f} MiB of weights per token: {read:.1f} GB/s, "
        f"{read / x['read_gb_s']:.0%} of the {x['read_gb_s']:.1f} GB/s an all-thread read reaches"
    )
    if (peer := best.get("llama.cpp")) is not None:
        print(
            f"xgrad / llama.cpp: prefill {x['prefill_tok_s'] / peer['prefill_tok_s']:.2f}x  "
            f"decode {x['decode_tok_s'] / peer['decode_tok_s']:.2f}x  "
            f"peak RSS {x['peak_rss_mib'] / peer['peak_rss_mib']:.2f}x"
        )


if __name__ == "__main__":
    main()
