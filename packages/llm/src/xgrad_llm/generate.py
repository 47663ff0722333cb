"""Generation: token ids (or chat messages) in, a stream of sampled token ids (or text) out.

`Runner` feeds tokens through a `Transformer` and keeps its KV cache. Two programs do all the work, each captured
once by TinyJit and replayed for every position, because the position is a bound Variable (`start_pos`) rather than
a Python int: `prefill` runs a chunk of `chunk` embeddings (a short last chunk is padded; its extra positions are
written to the cache but never attended to, and later overwritten) and `decode` runs one token. A new prompt reuses
the cache for its longest common prefix with what was fed before, so a chat turn only runs its new tokens.

Sampling happens on the host from the logits (numpy): repetition penalty, presence and frequency penalties, top_k,
temperature, top_p, min_p, in that order; temperature 0 is greedy (after the penalties). A seed makes the draws, and
so the text, reproducible.

`LLM` ties a GGUF file, its model, tokenizer and chat template into the Python API other programs use:
`LLM.load(path)`, `.generate(prompt_ids, params) -> Iterator[int]`, `.chat(messages, params) -> Iterator[str]`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xgrad import Device, Tensor, TinyJit, Variable
from xgrad.errors import XgradError
from xgrad_llm.gguf import GGUFFile, open_gguf
from xgrad_llm.model import Transformer
from xgrad_llm.template import ChatTemplate
from xgrad_llm.tokenizer import StreamDecoder, Tokenizer, TokenizerError

DEFAULT_CONTEXT = 4096
DEFAULT_CHUNK = 32


class GenerationError(XgradError, ValueError):
    """Bad sampling settings, or a prompt that does not fit the context."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. temperature 0 is greedy (argmax); top_k 0, top_p 1, min_p 0,
    repetition_penalty 1 and presence/frequency penalties 0 switch those off. `seed` None draws from fresh entropy.
    Generation ends at an end-of-generation token, after `max_tokens`, or where the text reaches one of the `stop`
    strings (not included).

    Penalties: `repetition_penalty` (llama.cpp's, over the last `penalty_last_n` ids, prompt included) divides a
    positive logit and multiplies a negative one; `presence_penalty` and `frequency_penalty` follow OpenAI: the
    logit of each token already generated in this reply (the prompt does not count) is lowered by
    presence_penalty + frequency_penalty * (times it was generated). Negative values favour repeats."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64  # how many of the latest tokens the repetition penalty looks at
    presence_penalty: float = 0.0  # subtracted once from the logit of every token generated so far
    frequency_penalty: float = 0.0  # subtracted per time a token was generated so far
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 0, "max_tokens must be >= 0"),
            (self.temperature >= 0 and math.isfinite(self.temperature), "temperature must be a finite number >= 0"),
            (self.top_k >= 0, "top_k must be >= 0 (0 keeps every token)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1] (1 keeps every token)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1] (0 keeps every token)"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0 (1 is none)"),
            (self.penalty_last_n >= 0, "penalty_last_n must be >= 0"),
            (math.isfinite(self.presence_penalty), "presence_penalty must be a finite number (0 is none)"),
            (math.isfinite(self.frequency_penalty), "frequency_penalty must be a finite number (0 is none)"),
            (all(self.stop), "stop strings must be non-empty (an empty one would end every reply at once)"),
        ]
        for ok, message in checks:
            if not ok:
                raise GenerationError(f"bad SamplingParams: {message}; got {self}")


class Sampler:
    """Picks token ids from logits by `params`, drawing from its own seeded generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        # whether `penalize` changes any logit (else it is a copy)
        self.penalizes = bool(
            (params.repetition_penalty != 1.0 and params.penalty_last_n)
            or params.presence_penalty
            or params.frequency_penalty
        )

    def penalize(
        self, logits: np.ndarray, history: Sequence[int] = (), generated: Sequence[int] | None = None
    ) -> np.ndarray:
        """The logits (float64, a copy) after the repetition penalty (over the last `penalty_last_n` of `history`)
        and the presence/frequency penalties (over `generated`, the ids generated so far in this reply; None: over
        `history`)."""
        p = self.params
        x = np.asarray(logits, dtype=np.float64).reshape(-1).copy()
        if p.repetition_penalty != 1.0 and p.penalty_last_n and history:
            seen = np.unique(np.asarray(history[-p.penalty_last_n :], dtype=np.int64))
            seen = seen[(seen >= 0) & (seen < x.size)]
            x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty, x[seen] * p.repetition_penalty)
        window = history if generated is None else generated
        if (p.presence_penalty or p.frequency_penalty) and len(window):
            toks, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
            ok = (toks >= 0) & (toks < x.size)
            x[toks[ok]] -= p.presence_penalty + p.frequency_penalty * counts[ok]
        return x

    def __call__(self, logits: np.ndarray, history: Sequence[int] = (), generated: Sequence[int] | None = None) -> int:
        """The next token id: `history` is every id so far (prompt included), `generated` the ids of this reply
        (the window of the presence/frequency penalties; None: all of `history`)."""
        p = self.params
        if p.temperature == 0 and not self.penalizes:  # greedy: the logits as they are (a float64 copy of a 262k
            return int(np.argmax(logits))  # vocabulary costs 10x the argmax, per token of every stream)
        x = self.penalize(logits, history, generated)
        if p.temperature == 0:
            return int(np.argmax(x))
        if 0 < p.top_k < x.size:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            x[x < kth] = -np.inf
        x = x / p.temperature
        probs = np.exp(x - np.max(x))
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ranked above each one
            probs[order[before >= p.top_p]] = 0.0  # keep the smallest top set reaching top_p
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0.0
        probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Runner:
    """Feeds token ids through `model`, keeping its KV cache; `feed(ids)` returns the logits after the last id."""

    def __init__(self, model: Transformer, max_context: int, chunk: int = DEFAULT_CHUNK) -> None:
        if model.cache_len < max_context + chunk - 1:
            raise GenerationError(
                f"the model's cache holds {model.cache_len} positions; needs {max_context + chunk - 1}"
            )
        self.model, self.max_context, self.chunk = model, max_context, chunk
        dim, vocab = model.cfg.dim, model.cfg.vocab_size
        self.pos = Variable("start_pos", 0, max_context - 1)
        self.tok = Variable("tok", 0, vocab - 1)
        self.row = Variable("row", 0, chunk - 1)
        self.last = Variable("last", 0, chunk - 1)
        self.rows = Tensor.zeros(chunk, dim, device=model.device).contiguous().realize()
        self._write_row = TinyJit(self._write_row_impl)
        self._prefill = TinyJit(self._prefill_impl)
        self._decode = TinyJit(self._decode_impl)
        self.cached: list[int] = []  # the ids whose keys and values are in the cache, from position 0

    def _write_row_impl(self, tok: Any, row: Any) -> Tensor:
        return self.rows.shrink(((row, row + 1), None)).assign(self.model.embed_token(tok)).realize()

    def _prefill_impl(self, pos: Any, last: Any) -> Tensor:
        return self.model.forward(self.rows.reshape(1, self.chunk, -1), pos, last).realize()

    def _decode_impl(self, tok: Any, pos: Any) -> Tensor:
        return self.model.forward(self.model.embed_token(tok).reshape(1, 1, -1), pos, 0).realize()

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Logits (vocab,) of the next token after `ids`, running only what the cache does not hold yet."""
        if not ids:
            raise GenerationError("nothing to feed: the prompt has no tokens")
        if len(ids) > self.max_context:
            raise GenerationError(
                f"{len(ids)} tokens do not fit the context of {self.max_context}; raise max_context (--max-context)"
            )
        vocab = self.model.cfg.vocab_size
        if bad := [i for i in ids if not 0 <= i < vocab]:
            raise GenerationError(f"token ids {bad[:5]} are outside the vocabulary of {vocab}")
        start = min(common_prefix(self.cached, ids), len(ids) - 1)
        self.cached = list(ids[:start])
        logits: Tensor | None = None
        while start < len(ids):
            todo = ids[start : start + self.chunk]
            if len(todo) == 1:
                logits = self._decode(self.tok.bind(todo[0]), self.pos.bind(start))
            else:
                for r, t in enumerate(todo):
                    self._write_row(self.tok.bind(t), self.row.bind(r))
                logits = self._prefill(self.pos.bind(start), self.last.bind(len(todo) - 1))
            start += len(todo)
            self.cached = list(ids[:start])
        assert logits is not None
        return logits.numpy().reshape(-1)  # the JIT reuses its output buffer: copy out now


def _eog_ids(md: dict[str, Any]) -> set[int]:
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    return {int(md[k]) for k in keys if isinstance(md.get(k), int)}


ProgressFn = Callable[[str, int, int], None]  # (what, done, total)


class LLM:
    """A loaded model ready to generate: its GGUF file, Transformer, KV-cache runner, tokenizer and chat template.

    >>> llm = LLM.load("model.gguf")  # doctest: +SKIP
    >>> ids = llm.encode("The capital of France is")  # doctest: +SKIP
    >>> print(llm.decode(list(llm.generate(ids, SamplingParams(max_tokens=8)))))  # doctest: +SKIP
    """

    def __init__(self, file: GGUFFile, model: Transformer, runner: Runner) -> None:
        self.file, self.model, self.runner = file, model, runner
        self.metadata = file.metadata
        self.eog = _eog_ids(file.metadata)
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        max_context: int | None = None,
        quantized: bool = True,
        device: str | None = None,
        chunk: int = DEFAULT_CHUNK,
        progress: ProgressFn | None = None,
        numerics: str = "xgrad",
    ) -> LLM:
        """Open a GGUF model. `max_context` (default: the model's, at most 4096) sizes the KV cache; `quantized`
        (default) keeps the quantised weights packed and dequantises them in the kernels; False makes float32
        copies (see `Transformer`). `numerics="llama.cpp-avx2"` / `"llama.cpp-avx512"` / `"llama.cpp"` (this
        machine's width) computes as llama.cpp's CPU backend built for that width (8-bit activations into quantised
        matrices, a float16 KV cache, its summation orders: `xgrad_llm.numerics`, `xgrad_llm.ggml_x86`), so that
        greedy decoding gives that build's tokens; the default "xgrad" computes in float32."""
        f = open_gguf(path)
        arch = f.metadata.get("general.architecture")
        trained = int(f.metadata.get(f"{arch}.context_length", DEFAULT_CONTEXT))
        ctx = max_context if max_context is not None else min(trained, DEFAULT_CONTEXT)
        if ctx < 1:
            raise GenerationError(f"max_context must be >= 1, got {ctx}")
        dev = device or Device.DEFAULT
        model = Transformer(
            f, cache_len=ctx + chunk - 1, quantized=quantized, device=dev, progress=progress, numerics=numerics
        )
        return cls(f, model, Runner(model, ctx, chunk))

    # ---- text ----
    @property
    def tokenizer(self) -> Tokenizer:
        """The file's tokenizer, built on first use."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_gguf(self.metadata)
        return self._tokenizer

    @property
    def template(self) -> ChatTemplate:
        """The chat template: the file's, or a built-in one that fits its vocabulary."""
        if self._template is None:
            self._template = ChatTemplate.from_gguf(self.metadata)
        return self._template

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; BOS as the file says unless `add_bos` says otherwise."""
        return list(self.tokenizer.encode(text, add_bos=add_bos))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))

    def stream_decoder(self) -> Any:
        """A fresh incremental decoder: `.push(id) -> str`, UTF-8 safe."""
        return StreamDecoder(self.tokenizer)

    def is_eog(self, tok: int) -> bool:
        if tok in self.eog:
            return True
        try:
            return self.tokenizer.is_eog(tok)
        except TokenizerError:  # no usable vocabulary in the file: the metadata's ids only
            return False

    # ---- generation ----
    def _tokens(self, prompt_ids: Sequence[int], params: SamplingParams) -> Iterator[int]:
        """Sampled ids until end-of-generation, max_tokens or the context's end; no stop strings."""
        sampler = Sampler(params)
        ids = list(prompt_ids)
        for _ in range(params.max_tokens):
            logits = self.runner.feed(ids)
            tok = sampler(logits, ids, ids[len(prompt_ids) :])
            if self.is_eog(tok):
                return
            yield tok
            ids.append(tok)
            if len(ids) >= self.runner.max_context:
                return

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Iterator[int]:
        """Stream the ids sampled after `prompt_ids`. With stop strings, it ends before the token whose text
        completes one (the text needs the tokenizer)."""
        params = params or SamplingParams()
        if not params.stop:
            yield from self._tokens(prompt_ids, params)
            return
        decoder = self.stream_decoder()
        text = ""
        for tok in self._tokens(prompt_ids, params):
            text += decoder.push(tok)
            if any(s in text for s in params.stop):
                return
            yield tok

    def stream_text(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Stream the text generated after `prompt_ids`, in UTF-8-safe pieces, cut exactly before a stop string."""
        params = params or SamplingParams()
        decoder = self.stream_decoder()
        pending = ""
        for tok in self._tokens(prompt_ids, params):
            pending += decoder.push(tok)
            cut = min((i for s in params.stop if (i := pending.find(s)) >= 0), default=-1)
            if cut >= 0:
                if pending[:cut]:
                    yield pending[:cut]
                return
            hold = _stop_prefix_len(pending, params.stop)
            if len(pending) > hold:
                yield pending[: len(pending) - hold]
                pending = pending[len(pending) - hold :]
        pending += decoder.flush()
        cut = min((i for s in params.stop if (i := pending.find(s)) >= 0), default=len(pending))
        if pending[:cut]:
            yield pending[:cut]

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The prompt ids of a conversation: the chat template rendered with the assistant's turn opened (it drops
        a leading BOS text) and tokenized with BOS as the file says."""
        return self.encode(self.template.render(list(messages), add_generation_prompt=True))

    def chat(self, messages: Sequence[dict[str, str]], params: SamplingParams | None = None) -> Iterator[str]:
        """Stream the assistant's reply to `messages` ([{"role": ..., "content": ...}, ...]) as text."""
        return self.stream_text(self.chat_ids(messages), params)

    def benchmark(self, n_prompt: int = 128, n_gen: int = 128, seed: int = 0) -> dict[str, float]:
        """Prefill of `n_prompt` random tokens and greedy decode of `n_gen` tokens, timed after a warm-up that
        compiles and captures both programs: {"prefill_tok_s", "decode_tok_s", ...}."""
        rng = np.random.default_rng(seed)
        vocab = self.model.cfg.vocab_size
        n_prompt = max(2, min(n_prompt, self.runner.max_context - n_gen - 1))
        warm = [int(x) for x in rng.integers(0, vocab, self.runner.chunk + 3)]
        self.runner.cached = []
        logits = self.runner.feed(warm)  # two prefill calls: the JIT runs one eagerly and captures the next
        for _ in range(3):  # and decode's: eager, capture, first replay
            warm.append(int(np.argmax(logits)))
            logits = self.runner.feed(warm)
        prompt = [int(x) for x in rng.integers(0, vocab, n_prompt)]
        self.runner.cached = []
        t0 = time.perf_counter()
        logits = self.runner.feed(prompt)
        t1 = time.perf_counter()
        ids = list(prompt)
        for _ in range(n_gen):
            ids.append(int(np.argmax(logits)))
            logits = self.runner.feed(ids)
        t2 = time.perf_counter()
        return {
            "prompt_tokens": float(n_prompt),
            "prefill_s": t1 - t0,
            "prefill_tok_s": n_prompt / (t1 - t0),
            "gen_tokens": float(n_gen),
            "decode_s": t2 - t1,
            "decode_tok_s": n_gen / (t2 - t1),
        }


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that begins some stop string (held back until it is decided)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
