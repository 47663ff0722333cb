"""/v1/embeddings: token ids in, one vector per input out: the model's last hidden states (after its final norm),
mean-pooled over the positions and L2-normalised.

The vectors come from `Transformer.with_identity_head`, a shallow copy of the model that shares its weights and has
its own KV cache, so `forward` returns hidden states instead of logits. Inputs
run in chunks of the runner's chunk size at a bound position, one JIT-captured program for every chunk; the padded
end of the last chunk is left out of the mean (attention is causal: it changes no earlier position).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from xgrad import Tensor, TinyJit, Variable
from xgrad_llm.generate import LLM


class Embedder:
    """Embeds token-id sequences with `llm`'s weights; `lock` is held while the model runs."""

    def __init__(self, llm: LLM, lock: threading.Lock) -> None:
        self.llm, self.lock = llm, lock
        self.chunk = llm.runner.chunk
        self.max_context = llm.runner.max_context
        self._model: Any = None

    def _build(self) -> None:
        src = self.llm.model
        m = src.with_identity_head()
        dim = src.cfg.dim
        self._model = m
        self.rows = Tensor.zeros(self.chunk, dim, device=src.device).contiguous().realize()
        self.pos = Variable("start_pos", 0, self.max_context - 1)
        self.tok = Variable("tok", 0, src.cfg.vocab_size - 1)
        self.row = Variable("row", 0, self.chunk - 1)
        self._write = TinyJit(
            lambda tok, row: self.rows.shrink(((row, row + 1), None)).assign(m.embed_token(tok)).realize()
        )
        self._run = TinyJit(lambda pos: m.forward(self.rows.reshape(1, self.chunk, -1), pos).realize())

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """The normalised mean hidden state of `ids` (float32, shape (dim,))."""
        if self._model is None:
            self._build()
        states = []
        for start in range(0, len(ids), self.chunk):
            todo = ids[start : start + self.chunk]
            for r in range(self.chunk):
                self._write(self.tok.bind(todo[r] if r < len(todo) else todo[-1]), self.row.bind(r))
            h = self._run(self.pos.bind(start)).numpy().reshape(self.chunk, -1)
            states.append(h[: len(todo)].astype(np.float64))
        mean = np.concatenate(states).mean(axis=0)
        norm = np.linalg.norm(mean)
        out: np.ndarray = (mean / norm if norm > 0 else mean).astype(np.float32)
        return out

    def embed_many(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """`embed` of each input, holding the model lock."""
        with self.lock:
            return [self.embed(x) for x in inputs]
