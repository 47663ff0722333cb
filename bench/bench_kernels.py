"""Time each kernel of the digits demo's training step (bench_train.py's model and batch) on its own: the kernel ASTs
are caught on their way to the CPU device, and each one's heuristic program is timed on scratch buffers (random
data, best of `--runs` launches). `--beam N` also runs BEAM=N on each and prints what it finds (slow: minutes).

Run: .venv/bin/python bench/bench_kernels.py [--runs 30] [--beam 2]   (asserts nothing)
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from xgrad import Context, Device
from xgrad.uop.ops import UOp
from xgrad_codegen import search

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_train  # noqa: E402


def step_kernels() -> dict[str, UOp]:
    """Kernel name -> AST of every kernel that a few steps of bench_train compile (first AST per name)."""
    dev = Device["CPU"]
    seen: dict[str, UOp] = {}
    compile_fn = type(dev).compile

    def spy(self: Any, ast: UOp) -> Any:
        seen.setdefault(search._kernel_name(ast), ast)
        return compile_fn(self, ast)

    type(dev).compile = spy  # type: ignore[method-assign]
    try:
        bench_train.main(["--steps", "3"])
    finally:
        type(dev).compile = compile_fn  # type: ignore[method-assign]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30, help="launches per kernel (the best counts)")
    parser.add_argument("--beam", type=int, default=0, help="also search each kernel with BEAM=N")
    args = parser.parse_args()
    dev = Device["CPU"]
    kernels = step_kernels()
    rows = []
    for name, ast in kernels.items():
        scratch = search.make_scratch(ast, dev)
        if scratch is None:
            continue
        opts = search.heuristic(ast, dev.renderer)
        seconds = search.time_program(search._build(ast, dev, opts), scratch, args.runs, 1.0)
        search.free_scratch(scratch)
        rows.append((seconds, name, opts))
    rows.sort(reverse=True)
    print(f"\n{len(rows)} kernels, {sum(r[0] for r in rows) * 1e6:.1f} us in all (heuristic, scratch buffers)")
    for seconds, name, opts in rows:
        print(f"{seconds * 1e6:9.1f} us  {name:28s} {' '.join(map(str, opts))}")
    for _, name, _ in rows if args.beam else []:
        with Context(DEBUG=2, IGNORE_BEAM_CACHE=1):  # prints heuristic -> chosen time and actions per kernel
            search.beam_opts(kernels[name], dev, args.beam)


if __name__ == "__main__":
    main()
