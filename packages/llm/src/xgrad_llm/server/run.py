"""`xgrad-llm serve ...`: the serve flags in, a running server out (until Ctrl-C).

The server binds 127.0.0.1 unless --host names another address, starts answering at once (/health says 503 until
the model is loaded in the background) and prints the chat page's URL.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from xgrad_llm.cli import CLIError, load
from xgrad_llm.cli import build_parser as model_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xgrad-llm serve",
        allow_abbrev=False,  # --model belongs to the model flags, not to --model-name
        description="Serve a GGUF model over an OpenAI-compatible HTTP API, with a web chat.",
        epilog="The model flags of xgrad-llm also apply: --model PATH (default: Gemma 3 270M Q4_K_M), "
        "--max-context N (per slot), --device, the weight-format flags, and --presence-penalty / --frequency-penalty "
        "(the defaults of requests that do not set them; see xgrad-llm -h).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="slots: requests run at once (default 1)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N", help="requests waiting beyond the slots (64)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds a request may take (600)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'")
    p.add_argument("--cors", action="append", default=[], metavar="ORIGIN", help="allow browser calls from ORIGIN")
    p.add_argument("--max-body", type=int, default=8 << 20, metavar="BYTES", help="largest request body (8 MiB)")
    p.add_argument(
        "--batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run concurrent decodes of the slots as one batched forward over the decoding slots (default; "
        "--no-batch: one forward per slot)",
    )
    p.add_argument(
        "--warm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture every prefill, decode and batched-round program before /health says ready (default; "
        "--no-warm: the first requests capture them, stalling the streams running then)",
    )
    p.add_argument("--model-name", default=None, help="the model id in responses (default: the file's name)")
    return p


def main(argv: list[str]) -> int:
    """Run the server; 1 with one line on stderr for a problem the user fixes."""
    args, rest = build_parser().parse_known_args(argv)
    model_args = model_parser().parse_args(rest)  # --model, --max-context, --device, weights: as the CLI reads them
    try:
        if args.parallel < 1 or args.max_queue < 0 or not 0 < args.port < 65536:
            raise CLIError("--parallel must be >= 1, --max-queue >= 0 and --port in 1..65535")
        if model_args.max_context is not None and model_args.max_context < 2:
            raise CLIError("--max-context must be at least 2")
        for flag in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(model_args, flag) <= 2.0:  # the range a request may ask for (OpenAI's)
                raise CLIError(f"--{flag.replace('_', '-')} must be in [-2, 2], got {getattr(model_args, flag)}")
        if model_args.model is not None and not os.path.isfile(model_args.model):
            raise CLIError(f"no such model file: {model_args.model!r}; pass --model PATH to a .gguf file")
        try:
            import uvicorn

            from xgrad_llm.server.app import ServerConfig, create_app
        except ImportError as e:
            raise CLIError(f"the server needs its extra: pip install 'xgrad-llm[serve]' ({e})") from None
        path = model_args.model
        name = args.model_name or (os.path.basename(path) if path else "gemma-3-270m-it-q4_k_m")
        config = ServerConfig(
            model_name=name,
            parallel=args.parallel,
            max_queue=args.max_queue,
            timeout=args.timeout,
            api_key=args.api_key,
            cors=list(args.cors),
            max_body=args.max_body,
            batch=args.batch,
            warm=args.warm,
            presence_penalty=model_args.presence_penalty,
            frequency_penalty=model_args.frequency_penalty,
        )
        app = create_app(config, loader=lambda: load(model_args))
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"xgrad-llm: chat at http://{host}:{args.port}/  (OpenAI API at http://{host}:{args.port}/v1)",
            file=sys.stderr,
            flush=True,
        )
        kwargs: dict[str, Any] = {"host": args.host, "port": args.port, "log_level": "warning"}
        uvicorn.run(app, **kwargs)
    except CLIError as e:
        print(f"xgrad-llm: error: {e}", file=sys.stderr)
        return 1
    return 0
