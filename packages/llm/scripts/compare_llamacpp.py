"""Compare xgrad's logits with llama.cpp's along the greedy runs of tests/fixtures/gemma3_270m_greedy_llamacpp.json.

For each prompt of the fixture (the raw one and the chat-templated one) both sides are fed the prompt and then the
fixture's 32 greedy ids, and the logits after the prompt and after each id (33 steps) are compared: the spread of
the difference over the vocabulary (its standard deviation once its mean, which no sampler sees, is removed),
where the two sides' best tokens differ, and how far apart llama.cpp's two best logits are there. llama.cpp runs in
a child process of the bench environment's python (see record_llamacpp.py for how that environment is made):

    .venv/bin/python packages/llm/scripts/compare_llamacpp.py --peer-python .bench-venv/bin/python
    ... --n-batch 1      # llama.cpp feeds the prompt one token at a time (the recording fed it as one batch)
    ... --self 1         # also llama.cpp with the prompt fed one token at a time, against llama.cpp
    ... --numerics xgrad # only one of xgrad's numerics (default: both)

The README's numbers on numerics come from this script.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3_270m_greedy_llamacpp.json"

CHILD = """
import json, sys
import numpy as np
import llama_cpp
import llama_cpp.llama as api
default_params = api.llama_cpp.llama_model_default_params
def no_extra_buffers():  # as record_llamacpp.py: llama.cpp's AMX matmul segfaults in this VM
    p = default_params()
    p.use_extra_bufts = False
    return p
api.llama_cpp.llama_model_default_params = no_extra_buffers
job = json.load(sys.stdin)
nb = job["n_batch"]
llm = llama_cpp.Llama(model_path=job["model"], n_ctx=256, n_threads=2, n_batch=nb, n_ubatch=nb, verbose=False)
vocab = llm.n_vocab()
for run, out in zip(job["runs"], job["outputs"]):
    llm.reset()
    llm.eval(run["prompt_ids"])
    rows = []
    def last():
        ptr = api.llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(vocab,)).copy()
    rows.append(last())
    for tok in run["greedy_ids"]:
        llm.eval([tok])
        rows.append(last())
    np.save(out, np.stack(rows))
"""


def llama_cpp_logits(peer: str, model: str, runs: list[dict[str, list[int]]], n_batch: int) -> list[np.ndarray]:
    """llama.cpp's logits (steps, vocab) for each run: the prompt fed in batches of `n_batch`, then one id at a
    time."""
    with tempfile.TemporaryDirectory() as tmp:
        outputs = [str(pathlib.Path(tmp) / f"run{i}.npy") for i in range(len(runs))]
        job = {"model": model, "runs": runs, "outputs": outputs, "n_batch": n_batch}
        done = subprocess.run([peer, "-c", CHILD], input=json.dumps(job), capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"llama.cpp failed ({done.returncode}): {done.stderr[-2000:]}")
        return [np.load(o) for o in outputs]


def xgrad_logits(model: str, runs: list[dict[str, list[int]]], numerics: str) -> list[np.ndarray]:
    """xgrad's logits (steps, vocab) for each run, fed as the generation feeds it (prefill, then decode steps)."""
    from xgrad_llm.generate import LLM

    llm = LLM.load(model, max_context=64, numerics=numerics)
    out = []
    for run in runs:
        ids, gen = run["prompt_ids"], run["greedy_ids"]
        llm.runner.cached = []
        out.append(np.stack([llm.runner.feed(ids + gen[:i]).copy() for i in range(len(gen) + 1)]))
    return out


def report(name: str, ours: np.ndarray, theirs: np.ndarray) -> str:
    d = ours - theirs
    spread = (d - d.mean(1, keepdims=True)).std(1)
    top2 = np.sort(theirs, 1)[:, -2:]
    differ = [int(i) for i in np.nonzero(ours.argmax(1) != theirs.argmax(1))[0]]
    ties = ", ".join(f"step {i} (llama.cpp's margin {top2[i, 1] - top2[i, 0]:.3f})" for i in differ)
    return f"  {name}: spread {spread.mean():.3f} (max {spread.max():.3f}); best tokens differ at: {ties or 'none'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", required=True, help="python of the environment that has llama_cpp")
    p.add_argument("--model", default=None, help="GGUF file (default: the gemma package's)")
    p.add_argument("--n-batch", type=int, default=64, help="llama.cpp's batch size for the prompt (default 64)")
    p.add_argument("--numerics", choices=("xgrad", "llama.cpp"), action="append", help="default: both")
    p.add_argument("--self", type=int, default=0, metavar="N", help="also compare llama.cpp with n_batch=N to it")
    args = p.parse_args()
    from xgrad_llm.cli import default_model

    model = str(args.model or default_model())
    fx = json.loads(FIXTURE.read_text())
    runs = [{k: fx[k] for k in ("prompt_ids", "greedy_ids")}, {k: fx["chat"][k] for k in ("prompt_ids", "greedy_ids")}]
    theirs = llama_cpp_logits(args.peer_python, model, runs, args.n_batch)
    for i, name in enumerate(("raw prompt", "chat prompt")):
        recorded = [int(x) for x in theirs[i].argmax(1)[:-1]]
        same = "the fixture's ids" if recorded == runs[i]["greedy_ids"] else "NOT the fixture's ids"
        print(f"{name}: llama.cpp (n_batch={args.n_batch}) picks {same}")
    if args.self:
        other = llama_cpp_logits(args.peer_python, model, runs, args.self)
        print(f"llama.cpp n_batch={args.self} against llama.cpp n_batch={args.n_batch}:")
        for i, name in enumerate(("raw prompt", "chat prompt")):
            print(report(name, other[i], theirs[i]))
    for numerics in args.numerics or ["xgrad", "llama.cpp"]:
        ours = xgrad_logits(model, runs, numerics)
        print(f"xgrad numerics={numerics!r} against llama.cpp:")
        for i, name in enumerate(("raw prompt", "chat prompt")):
            print(report(name, ours[i], theirs[i]))


if __name__ == "__main__":
    main()
