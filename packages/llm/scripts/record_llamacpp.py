"""Record llama.cpp's answers for the Gemma 3 270M tests: the tokenizer corpus's ids and the greedy continuations.

llama.cpp is the issue's reference. It comes from `llama-cpp-python`, which builds llama.cpp from source (about 20
minutes on 2 cores), so it lives in a separate bench environment, never in CI:

    python3.11 -m venv .bench-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" .bench-venv/bin/pip install llama-cpp-python numpy
    .venv/bin/python packages/llm/scripts/record_llamacpp.py --peer-python .bench-venv/bin/python

The script runs in xgrad's environment (for the test corpus and the chat template) and runs llama.cpp in a child
process of the bench environment's python. It writes
- tests/fixtures/gemma3_tokens.json: `Llama(vocab_only=True).tokenize(text, add_bos=False, special=True)` for every
  text of test_tokenizer.CORPUS;
- tests/fixtures/gemma3_270m_greedy.json: llama.cpp's own tokenization of the prompt (BOS as the file says) and the
  first 32 greedy ids after it (temperature 0, top_k 1, no repetition penalty, 2 threads), for the raw prompt and
  for the chat-templated one (the built-in Gemma turn template, rendered by xgrad_llm: the file has none).
It prints where llama.cpp and the previous recording (transformers') disagree.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
N_GREEDY = 32


CHILD = """
import json, sys
import llama_cpp
import llama_cpp.llama as api
default_params = api.llama_cpp.llama_model_default_params
def no_extra_buffers():  # llama.cpp's AMX matmul segfaults in this VM; repacked weights off with it
    p = default_params()
    p.use_extra_bufts = False
    return p
api.llama_cpp.llama_model_default_params = no_extra_buffers
job = json.load(sys.stdin)
path = job["model"]
vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
tokens = [vocab.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in job["texts"]]
del vocab
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, n_batch=64, verbose=False)
runs = []
for text in job["prompts"]:
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    out = []
    for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) == job["n"]:
            break
    runs.append({"prompt_ids": ids, "greedy_ids": out})
json.dump({"version": llama_cpp.__version__, "tokens": tokens, "runs": runs}, sys.stdout)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", required=True, help="python of the environment that has llama_cpp")
    p.add_argument("--model", default=None, help="GGUF file (default: the gemma package's)")
    args = p.parse_args()
    from record_gemma3_tokens import dump
    from test_tokenizer import CORPUS

    from xgrad_llm.cli import default_model
    from xgrad_llm.generate import LLM

    path = pathlib.Path(args.model or default_model())
    chat_text = LLM.load(path, max_context=32).template.render(CHAT, add_generation_prompt=True)
    job = {"model": str(path), "texts": list(CORPUS), "prompts": [PROMPT, chat_text], "n": N_GREEDY}
    done = subprocess.run([args.peer_python, "-c", CHILD], input=json.dumps(job), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"llama.cpp failed ({done.returncode}): {done.stderr[-2000:]}")
    peer = json.loads(done.stdout)
    made_by = f"packages/llm/scripts/record_llamacpp.py with llama-cpp-python {peer['version']}"

    old_ids = {c["text"]: c["ids"] for c in json.loads((FIXTURES / "gemma3_tokens.json").read_text())["cases"]}
    cases = [{"text": text, "ids": ids} for text, ids in zip(CORPUS, peer["tokens"])]
    for c in cases:
        if old_ids.get(c["text"]) not in (None, c["ids"]):
            print(f"tokenizer: llama.cpp {c['ids']} vs previous {old_ids[c['text']]} for {c['text']!r}")
    (FIXTURES / "gemma3_tokens.json").write_text(
        dump({"model": path.name, "made_by": made_by, "cases": cases}), encoding="utf-8"
    )
    print(f"wrote {len(cases)} tokenizer cases")

    raw, chat = peer["runs"]
    record = {
        "model": path.name,
        "prompt": PROMPT,
        "prompt_ids": raw["prompt_ids"],
        "greedy_ids": raw["greedy_ids"],
        "how": (
            f"Recorded by {made_by}: Llama(model_path, n_ctx=256, n_threads=2) with the model parameter "
            "use_extra_bufts=False (llama.cpp's AMX matmul, which it picks on this AMX-capable Xeon, segfaults in "
            "the VM; its weight repacking goes off with it), tokenize(prompt, add_bos=True, "
            "special=True), then generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0) for the "
            f"first {N_GREEDY} ids."
        ),
        "chat": {
            "messages": CHAT,
            "text": chat_text,
            "prompt_ids": chat["prompt_ids"],
            "greedy_ids": chat["greedy_ids"],
            "note": "the built-in Gemma turn template (the file has none), rendered by xgrad_llm, tokenized by "
            "llama.cpp",
        },
    }
    old = json.loads((FIXTURES / "gemma3_270m_greedy.json").read_text())
    for key, new, before in (
        ("raw", raw["greedy_ids"], old["greedy_ids"]),
        ("chat", chat["greedy_ids"], old["chat"]["greedy_ids"]),
    ):
        print(f"greedy {key}: {'same as' if new == before else 'DIFFERS from'} the previous recording")
    text = re.sub(
        r"\[\s+([-\d,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", json.dumps(record, indent=2)
    )
    (FIXTURES / "gemma3_270m_greedy_llamacpp.json").write_text(text + "\n", encoding="utf-8")
    print("wrote the greedy fixture")


if __name__ == "__main__":
    main()
