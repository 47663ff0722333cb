"""The NV backend's check for the day a GPU is lent: one script, under 5 minutes, run from source.

Run: scripts/gpu-check            (on the GPU machine; see packages/backend-nv/README.md)
     scripts/gpu-check --mock     (here: MOCKGPU=1, the PTX interpreter, a 64^3 matmul; proves the script runs)
BEAM's search (width --beam, at most --beam-steps actions) runs only while the time spent is under 60% of --budget.

1. environment: NV's availability (the reason if not), GPU, compute capability, driver and NVRTC versions, where the
   CUDA headers and ptxas were found, torch and whether it sees the GPU;
2. conformance: the op subset of packages/backend-nv/tests/nv_ops.py (32 ops: elementwise, int, casts incl.
   half/bfloat16/fp8, reductions, softmax, cumsum, gather, matmuls on tensor cores, conv2d, pooling, layernorm,
   attention) on NV with each renderer (CUDA, PTX), each compared with the PYTHON reference device and with numpy;
3. matmul N^3 (default 8192) in float16 and bfloat16: xgrad with the heuristic's kernel and with BEAM's best, beside
   torch.matmul (cuBLAS) on the same GPU, best of --reps, TFLOPS and the ratio to torch; 8 rows checked in float64;
   the opts each kernel used (TC i code: xgrad_codegen.tc_tile's tile shape, 0 = untiled);
4. (--tiles, on by default) the bfloat16 matmul kernel with each tile shape of xgrad_codegen.tc_tile.TILE_SHAPES and
   with the untiled tensor cores (TC amount 0), each checked against the heuristic's output and timed: what BEAM
   chooses among, one row per shape (2 to 4 stages of cp.async copies where they fit 48 KiB), and the heuristic's
   shape once more with its slices copied through registers ("... registers": what cp.async gains).

Prints a table and, with --json PATH, writes the results there. Exit status 1 when an op or a matmul is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mock", action="store_true", help="MOCKGPU=1: the PTX interpreter, tiny sizes (runs anywhere)")
    p.add_argument("--size", type=int, default=0, help="matmul N (default 8192; 64 with --mock)")
    p.add_argument("--reps", type=int, default=0, help="timed repetitions (default 10; 2 with --mock)")
    p.add_argument("--beam", type=int, default=2, help="BEAM width for the matmul search (0: skip)")
    p.add_argument("--beam-steps", type=int, default=3, help="BEAM_MAX_STEPS of that search (keeps it in budget)")
    p.add_argument("--budget", type=float, default=270.0, help="seconds; BEAM is skipped when the time runs short")
    p.add_argument("--cuda-include", default="", help="a folder with cuda_fp16.h/cuda_bf16.h for NVRTC")
    p.add_argument("--renderers", default="CUDA,PTX", help="NV renderers to check")
    p.add_argument("--tiles", type=int, default=1, help="1: time the bf16 matmul with every tile shape (0: skip)")
    p.add_argument("--json", default="", help="write the results to this file")
    return p.parse_args()


ARGS = parse_args()
if ARGS.mock:
    os.environ["MOCKGPU"] = "1"  # read by xgrad.helpers when it is imported
sys.path.insert(0, str(ROOT / "packages" / "backend-nv" / "tests"))  # nv_ops, the op subset

import numpy as np  # noqa: E402
from nv_ops import OPS  # noqa: E402

from xgrad import Device, Tensor, TinyJit, dtypes  # noqa: E402
from xgrad.helpers import Context  # noqa: E402
from xgrad.uop.ops import KernelInfo, UOp  # noqa: E402
from xgrad_codegen import search  # noqa: E402
from xgrad_codegen.device import CompiledProgram, program_info  # noqa: E402
from xgrad_codegen.opt import Opt, OptError  # noqa: E402
from xgrad_codegen.pipeline import before_optimize, full_rewrite  # noqa: E402
from xgrad_codegen.tc_tile import TILE_SHAPES  # noqa: E402
from xgrad_nv import compiler  # noqa: E402
from xgrad_nv.plugin import nv_available  # noqa: E402

START = time.perf_counter()
RESULTS: dict[str, Any] = {"args": vars(ARGS)}


BEAM_PICKS: dict[str, list[Opt]] = {}  # kernel name -> the opts BEAM chose (or read from its cache)
_beam_opts = search.beam_opts


def _recording_beam_opts(ast: UOp, device: Any, width: int | None = None) -> list[Opt] | None:
    opts = _beam_opts(ast, device, width)
    if opts is not None and isinstance(ast.arg, KernelInfo):
        BEAM_PICKS[ast.arg.name] = opts
    return opts


search.beam_opts = _recording_beam_opts  # the device imports it when it compiles: BEAM's pick is reported


def elapsed() -> float:
    return time.perf_counter() - START


def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str) -> None:
    say(f"\n== {title} ({elapsed():.0f} s)")


def environment() -> bool:
    section("environment")
    if ARGS.cuda_include:
        compiler.use_cuda_include(pathlib.Path(ARGS.cuda_include))
    ok, why = nv_available()
    env: dict[str, Any] = {"python": platform.python_version(), "nv_available": ok, "nv_reason": why}
    say(f"python {env['python']}; NV available: {ok}: {why}")
    nvrtc_ok, nvrtc = compiler.nvrtc_status()
    env.update(nvrtc=nvrtc, include=str(compiler.find_cuda_include()), ptxas=str(compiler.find_tool("ptxas")))
    say(f"{nvrtc}; CUDA headers: {env['include']}; ptxas: {env['ptxas']}")
    if ok:
        dev = Device["NV"]
        drv = dev.driver
        env.update(
            gpu=drv.device_name(dev.ordinal),
            arch=dev.compile_arch,
            gpus=drv.device_count(),
            driver_cuda=drv.driver_version(),
            memory_gib=round(drv.total_memory(dev.ordinal) / 2**30, 1),
        )
        say(
            f"GPU 0 of {env['gpus']}: {env['gpu']} ({env['arch']}, {env['memory_gib']} GiB),"
            f" driver CUDA {env['driver_cuda']}"
        )
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = bool(torch.cuda.is_available())
        say(f"torch {torch.__version__}, CUDA available to torch: {env['torch_cuda']}")
    except ImportError:
        env["torch"] = None
        say("torch: not installed (no cuBLAS comparison)")
    RESULTS["environment"] = env
    return ok


def compare(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> str:
    """'' when `got` equals `want` within the tolerances, else what differs."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = ~(np.isclose(g, w, atol=atol, rtol=rtol) | (np.isnan(g) & np.isnan(w)))
    if not bad.any():
        return ""
    i = np.argwhere(bad)[0]
    return f"{int(bad.sum())} of {bad.size} differ, e.g. at {tuple(int(x) for x in i)}: {g[tuple(i)]} vs {w[tuple(i)]}"


def conformance() -> bool:
    section("conformance: the op subset on NV against the PYTHON device and numpy")
    reference = {op.name: op.build("PYTHON").numpy() for op in OPS}
    all_ok = True
    out: dict[str, Any] = {}
    for renderer in [r.strip().upper() for r in ARGS.renderers.split(",") if r.strip()]:
        device = f"NV:{renderer}"
        t0 = time.perf_counter()
        failures: dict[str, str] = {}
        for op in OPS:
            try:
                got = op.build(device).numpy()
                why = compare(got, reference[op.name], op.atol, op.rtol)
                if not why and op.expect is not None:
                    why = compare(got, op.expect(), op.atol, op.rtol)
            except Exception as e:  # one broken op must not hide the others' results
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            if why:
                failures[op.name] = why
        passed = len(OPS) - len(failures)
        say(f"{device}: {passed}/{len(OPS)} ops pass ({time.perf_counter() - t0:.1f} s)")
        for name, why in failures.items():
            say(f"  FAIL {name}: {why}")
        out[device] = {"passed": passed, "total": len(OPS), "failures": failures}
        all_ok = all_ok and not failures
    RESULTS["conformance"] = out
    return all_ok


def best_time(fn: Any, sync: Any, reps: int) -> float:
    """Best wall time of `reps` calls of `fn`, each followed by `sync` (the GPU has finished)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul(dtype: Any, n: int, reps: int) -> bool:
    np_dt = np.float16 if dtype == dtypes.float16 else np.float32
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((n, n), dtype=np.float32).astype(np_dt)
    b_np = rng.standard_normal((n, n), dtype=np.float32).astype(np_dt)
    a = Tensor(a_np, device="NV").cast(dtype).realize()
    b = Tensor(b_np, device="NV").cast(dtype).realize()
    dev = Device["NV"]
    flops = 2.0 * n**3
    row: dict[str, Any] = {"n": n}
    rows = np.linspace(0, n - 1, 8).astype(int)
    # the operands as rounded to dtype, in float64: the reference of the checked rows
    a64 = a[Tensor(rows.astype(np.int32), device="NV")].cast(dtypes.float32).numpy().astype(np.float64)
    b64 = b.cast(dtypes.float32).numpy().astype(np.float64)
    want = a64 @ b64
    scale = np.abs(want).max()
    ok = True
    for label, beam in (("heuristic", 0), ("beam", ARGS.beam)):
        if label == "beam" and (beam <= 0 or elapsed() > ARGS.budget * 0.6):
            say(f"  {dtype.name} BEAM: skipped ({'--beam 0' if beam <= 0 else 'out of time'})")
            continue
        with Context(BEAM=beam, BEAM_MAX_STEPS=ARGS.beam_steps, BEAM_RUNS=2):
            step = TinyJit(lambda x, y: (x @ y).realize())
            t0 = time.perf_counter()
            out = step(a, b)
            first = time.perf_counter() - t0
            for _ in range(2):
                out = step(a, b)
            t = best_time(lambda f=step: f(a, b), dev.synchronize, reps)
        got = out[Tensor(rows.astype(np.int32), device="NV")].cast(dtypes.float32).numpy().astype(np.float64)
        err = float(np.abs(got - want).max() / scale)
        tol = 2e-2 if dtype == dtypes.bfloat16 else 5e-3
        good = err < tol
        ok = ok and good
        ast = matmul_ast(dev)
        picked = BEAM_PICKS.get(ast.arg.name) if label == "beam" and isinstance(ast.arg, KernelInfo) else None
        opts = picked if picked is not None else search.heuristic(before_optimize(ast), dev.renderer)
        row[label] = {
            "seconds": t,
            "tflops": flops / t / 1e12,
            "first_call_s": first,
            "max_rel_err": err,
            "ok": good,
            "opts": [str(o) for o in opts],
            "picked_by_beam": picked is not None,  # BEAM's pick may be no opts at all (the unoptimized kernel won)
        }
        say(
            f"  {dtype.name} xgrad {label:9s}: {t * 1e3:9.3f} ms  {flops / t / 1e12:8.2f} TFLOPS"
            f"  (first call {first:.1f} s; max rel err {err:.1e}{'' if good else ' WRONG'}) opts {row[label]['opts']}"
        )
    row["torch"] = torch_matmul(a_np, b_np, dtype, reps, flops)
    best = max((row[k]["tflops"] for k in ("heuristic", "beam") if k in row), default=0.0)
    if row["torch"] is not None:
        row["ratio_to_torch"] = best / row["torch"]["tflops"]
        say(f"  {dtype.name}: best xgrad / torch = {row['ratio_to_torch']:.3f} (target for bfloat16: >= 0.5)")
    RESULTS.setdefault("matmul", {})[dtype.name] = row
    return ok


def matmul_ast(dev: Any) -> UOp:
    """The AST of the last matmul (reduce) kernel `dev` compiled."""
    return [key[0] for key, p in dev._programs.items() if p.info.name.startswith("r_")][-1]  # type: ignore[no-any-return]


def tile_sweep(n: int, reps: int) -> bool:
    """The bf16 n^3 matmul kernel with each tile shape (and untiled), checked against the heuristic's output on random
    inputs and timed (best of `reps`)."""
    section(f"tile shapes: bfloat16 matmul {n}^3, TC <instruction> <shape> (xgrad_codegen.tc_tile)")
    dev = Device["NV"]
    a = Tensor.empty(n, n, dtype=dtypes.bfloat16, device="NV")
    b = Tensor.empty(n, n, dtype=dtypes.bfloat16, device="NV")
    a.matmul(b, dtype=dtypes.float32).realize()
    base = before_optimize(matmul_ast(dev))
    renderer = dev.renderer
    tc = next(i for i, t in enumerate(renderer.tensor_cores) if t.dtype == dtypes.bfloat16)
    scratch = search.make_scratch(base, dev)
    if scratch is None:
        say("  no scratch buffers: skipped")
        return True
    flops = 2.0 * n**3
    rows: dict[str, Any] = {}
    ok = True
    try:
        reference = build(dev, base, search.heuristic(base, renderer))  # the heuristic's shape, with cp.async
        # every shape (3 and 4 stages: cp.async pipelines), untiled, and the heuristic's shape with its slices copied
        # through registers instead of cp.async (async_copy_bytes 0), to measure what the asynchronous copies give
        heuristic = search.heuristic(base, renderer)
        shapes = [("", [Opt("TC", tc, 0)]), *(("", [Opt("TC", tc, s.code)]) for s in TILE_SHAPES)]
        for variant, opts in [*shapes, (" registers", heuristic)]:
            name = str(opts[0]) + variant
            try:
                prg = build(dev, base, opts, async_copies=not variant)
            except OptError as e:
                say(f"  {name:16s}: does not apply ({e})")
                continue
            same = search.same_outputs(prg, reference, scratch)
            t = search.time_program(prg, scratch, reps, float("inf"))
            ok = ok and same
            rows[name] = {"seconds": t, "tflops": flops / t / 1e12, "ok": same}
            say(f"  {name:16s}: {t * 1e3:9.3f} ms  {flops / t / 1e12:8.2f} TFLOPS{'' if same else '  WRONG'}")
    finally:
        search.free_scratch(scratch)
    RESULTS["tiles"] = rows
    torch_row = RESULTS.get("matmul", {}).get("bfloat16", {}).get("torch")
    if rows and torch_row:
        name, best = max(((k, r["tflops"]) for k, r in rows.items() if r["ok"]), key=lambda x: x[1])
        RESULTS["tiles_best"] = {"opt": name, "tflops": best, "ratio_to_torch": best / torch_row["tflops"]}
        say(f"  best shape {name}: {best:.2f} TFLOPS = {best / torch_row['tflops']:.3f} x torch (target >= 0.5)")
    return ok


def build(dev: Any, base: UOp, opts: list[Opt], async_copies: bool = True) -> CompiledProgram:
    """`base` with `opts` compiled for `dev`; `async_copies` False: as for a renderer without cp.async."""
    renderer = dev.renderer
    saved = renderer.async_copy_bytes
    renderer.async_copy_bytes = saved if async_copies else 0
    try:
        uops = full_rewrite(base, renderer, opts)
    finally:
        renderer.async_copy_bytes = saved
    name = base.arg.name if isinstance(base.arg, KernelInfo) else "matmul"
    src = renderer.render(name, uops)
    return CompiledProgram(dev, dev.build(name, uops, src), program_info(name, uops, src))


def torch_matmul(a_np: np.ndarray, b_np: np.ndarray, dtype: Any, reps: int, flops: float) -> dict[str, float] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        say("  torch: no CUDA device (no cuBLAS comparison)")
        return None
    tdt = torch.float16 if dtype == dtypes.float16 else torch.bfloat16
    a = torch.from_numpy(a_np.astype(np.float32)).to("cuda", tdt)
    b = torch.from_numpy(b_np.astype(np.float32)).to("cuda", tdt)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    t = best_time(lambda: torch.matmul(a, b), torch.cuda.synchronize, reps)
    say(f"  {dtype.name} torch.matmul   : {t * 1e3:9.3f} ms  {flops / t / 1e12:8.2f} TFLOPS")
    return {"seconds": t, "tflops": flops / t / 1e12}


def main() -> int:
    say(f"xgrad NV check ({'MOCKGPU=1: PTX interpreter' if ARGS.mock else 'GPU'}), budget {ARGS.budget:.0f} s")
    if not environment():
        say("NV is not available: nothing more to check (the reason is above)")
        RESULTS["verdict"] = "unavailable"
        write_json()
        return 1
    conformance_ok = conformance()
    n = ARGS.size or (64 if ARGS.mock else 8192)
    reps = ARGS.reps or (2 if ARGS.mock else 10)
    section(f"matmul {n}^3")
    matmul_ok = True
    for dtype in (dtypes.float16, dtypes.bfloat16):
        try:
            matmul_ok = matmul(dtype, n, reps) and matmul_ok
        except Exception as e:  # report and go on to the other dtype
            say(f"  {dtype.name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            matmul_ok = False
    tiles_ok = True
    if ARGS.tiles:
        try:
            tiles_ok = tile_sweep(n, reps)
        except Exception as e:  # report it; the rest of the check stands
            say(f"  tile sweep: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            tiles_ok = False
    ok = conformance_ok and matmul_ok and tiles_ok
    RESULTS["verdict"] = "ok" if ok else "failed"
    RESULTS["seconds"] = elapsed()
    section(f"done: {'all correct' if ok else 'FAILURES above'}")
    write_json()
    return 0 if ok else 1


def write_json() -> None:
    if ARGS.json:
        pathlib.Path(ARGS.json).write_text(json.dumps(RESULTS, indent=1, default=str))
        say(f"results written to {ARGS.json}")


if __name__ == "__main__":
    sys.exit(main())
