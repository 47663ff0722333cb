"""Dump every intermediate tensor llama.cpp computes for a greedy run, to compare with xgrad's op by op.

llama.cpp's scheduler calls `llama_context_params.cb_eval` for every node of its graph; this script's child (in the
bench environment's python, see record_llamacpp.py) answers "yes" to every node and copies each float32/float16
result out of ggml's tensor (its shape and strides read from `struct ggml_tensor`). The prompt is fed as one batch,
then each id of `--ids` (default: the AVX2 fixture's greedy ids) one at a time, as `Llama.generate` does; step 0 is
the prompt, step s >= 1 the s-th fed id. Everything goes into one .npz: key "{step}/{node number}/{node name}"
(node numbers count the step's evaluated nodes; names, not unique, as llama.cpp gives them: "attn_norm-0", "Qcur-0",
"kq-0", "kq_soft_max-0", "ffn_out-0", "l_out-0", "result_output", ...), a JSON index "meta" with each node's op,
type, shape, strides and sources (their keys, or names for weights and inputs), and "picked", llama.cpp's best id
after each step. check_llamacpp_ops.py recomputes the nodes from these.

    .venv/bin/python packages/llm/scripts/dump_llamacpp.py --peer-python .bench-venv/bin/python --out /tmp/lc.npz
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"

CHILD = r"""
import ctypes, json, sys
import numpy as np
import llama_cpp
import llama_cpp.llama as api
from llama_cpp import llama_cpp as C

job = json.load(sys.stdin)
default_model = C.llama_model_default_params
def no_extra_buffers():  # as record_llamacpp.py: no repacked weights
    p = default_model()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = no_extra_buffers

base = ctypes.CDLL(str(__import__("pathlib").Path(C.__file__).parent / "lib" / "libggml-base.so"))
base.ggml_op_name.restype = ctypes.c_char_p
base.ggml_op_name.argtypes = [ctypes.c_int]
OFF_NE, OFF_NB, OFF_OP, OFF_SRC, OFF_DATA, OFF_NAME = 16, 48, 80, 152, 248, 256
F32, F16 = 0, 1
store, meta = {}, {}
step = [0]
index = {}  # this step's nodes: address -> key

def name_of(p):
    return ctypes.string_at(p + OFF_NAME).decode()

def on_eval(t, ask, user):
    if ask:
        return True
    kind = ctypes.c_int.from_address(t).value
    name = name_of(t)
    ne = [ctypes.c_int64.from_address(t + OFF_NE + 8 * i).value for i in range(4)]
    nb = [ctypes.c_size_t.from_address(t + OFF_NB + 8 * i).value for i in range(4)]
    op = base.ggml_op_name(ctypes.c_int.from_address(t + OFF_OP).value).decode()
    srcs = []
    for i in range(10):
        s = ctypes.c_void_p.from_address(t + OFF_SRC + 8 * i).value
        if s:
            srcs.append(index.get(s, name_of(s)))
    key = f"{step[0]}/{len(index):04d}/{name}"
    index[t] = key
    meta[key] = {"op": op, "type": kind, "ne": ne, "nb": nb, "src": srcs}
    data = ctypes.c_void_p.from_address(t + OFF_DATA).value
    if kind in (F32, F16) and data:
        item = 4 if kind == F32 else 2
        span = sum((n - 1) * b for n, b in zip(ne, nb)) + item
        raw = np.frombuffer(ctypes.string_at(data, span), dtype=np.float32 if kind == F32 else np.float16)
        arr = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1], strides=nb[::-1]).copy()
        store[key] = arr
    return True

callback = C.ggml_backend_sched_eval_callback(on_eval)
default_ctx = C.llama_context_default_params
def with_callback():
    p = default_ctx()
    p.cb_eval = callback
    return p
C.llama_context_default_params = with_callback
api.llama_cpp.llama_context_default_params = with_callback

llm = llama_cpp.Llama(model_path=job["model"], n_ctx=256, n_threads=2, n_batch=64, verbose=False)
llm.reset()
picked = []
vocab = llm.n_vocab()
def best():
    ptr = C.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(vocab,)).argmax())
llm.eval(job["prompt_ids"])
picked.append(best())
for tok in job["ids"]:
    step[0] += 1
    index.clear()
    llm.eval([tok])
    picked.append(best())
store["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
store["picked"] = np.array(picked)
np.savez(job["out"], **store)
print(json.dumps({"picked": picked, "nodes": len(meta)}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", required=True, help="python of the environment that has llama_cpp")
    p.add_argument("--model", default=None, help="GGUF file (default: the gemma package's)")
    p.add_argument("--fixture", default="gemma3_270m_greedy_llamacpp_avx2.json", help="fixture under tests/fixtures")
    p.add_argument("--chat", action="store_true", help="the fixture's chat-templated prompt instead of the raw one")
    p.add_argument("--steps", type=int, default=32, help="how many of the fixture's ids to feed after the prompt")
    p.add_argument("--out", required=True, help=".npz to write")
    args = p.parse_args()
    from xgrad_llm.cli import default_model

    fx = json.loads((FIXTURES / args.fixture).read_text())
    run = fx["chat"] if args.chat else fx
    job = {
        "model": str(args.model or default_model()),
        "prompt_ids": run["prompt_ids"],
        "ids": run["greedy_ids"][: args.steps],
        "out": args.out,
    }
    done = subprocess.run([args.peer_python, "-c", CHILD], input=json.dumps(job), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"llama.cpp failed ({done.returncode}): {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    same = result["picked"][: len(job["ids"])] == job["ids"]
    print(f"{result['nodes']} nodes dumped; llama.cpp's picks {'match' if same else 'DO NOT match'} the fixture's ids")
    if not same:
        print(f"  picked  {result['picked']}\n  fixture {job['ids']}")


if __name__ == "__main__":
    main()
