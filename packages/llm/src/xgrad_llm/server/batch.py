"""Continuous batching: the decode steps of several slots, each at its own position, in one forward pass.

The slots' KV caches are rows of one batched cache per layer, (N, kv_heads, cache_len, head_dim). Each slot runs its
prompt through its own `Runner` over a shallow copy of the model whose caches are its row (a view), so prefill and
prefix reuse work as for one sequence. A decode round takes one token and one position per row and runs the model
once for all rows: the matrix products read each weight once for the whole batch, which is where decoding spends its
time. The model's `forward` gives every row the same start position, so the batched copy of the model gets its own
attention (`_attention` below, set on the copy): RoPE angles, the cache write and the causal mask per row.

A round computes only the slots that decode: with k of N slots busy, it runs a batch of k rows whose cache rows are
gathered by slot index (bound Variables, so one program serves every choice of k slots), one TinyJit program per k
(1..N, each captured on first use). With all N busy the rows are the caches as they are (no gather). Padding to a
power of two would instead compute up to twice the busy rows; a round of k rows costs about what the k-row matrix
products cost, so a batched round of k >= 2 slots is never more work than their k lone decodes.

In: token ids, positions and slot indices, one per busy slot. Out: logits (k, vocab) and each row's argmax.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from xgrad import Tensor, TinyJit, Variable
from xgrad.dtype import dtypes
from xgrad_llm.generate import LLM, GenerationError, Runner
from xgrad_llm.model import LayerWeights, Transformer, apply_rope, dot_lanes_of, lane_dot, softcap


class BatchDecoder:
    """N slots' caches as rows of one batch, and the decode round over any k of them (one program per k)."""

    def __init__(self, llm: LLM, n: int) -> None:
        src = llm.model
        self.n, self.llm = n, llm
        self.max_context, self.chunk = llm.runner.max_context, llm.runner.chunk
        self.cache_len = src.cache_len
        model = copy.copy(src)
        model.cache_k = [
            Tensor.zeros(n, *c.shape[1:], dtype=c.dtype, device=src.device).contiguous().realize() for c in src.cache_k
        ]
        model.cache_v = [
            Tensor.zeros(n, *c.shape[1:], dtype=c.dtype, device=src.device).contiguous().realize() for c in src.cache_v
        ]
        model._attention = self._attention  # type: ignore[method-assign, assignment]  # per-row positions (see the module doc)
        self.model = model
        self.toks = [Variable(f"tok{b}", 0, src.cfg.vocab_size - 1) for b in range(n)]
        self.pos = [Variable(f"pos{b}", 0, self.cache_len - 1) for b in range(n)]
        self.slots = [Variable(f"slot{b}", 0, n - 1) for b in range(n)]  # the cache row of each batch row (k < N)
        self.end = Variable("end", 1, self.cache_len)  # positions the round attends to: the latest row's, plus one
        self._span: Any = self.cache_len  # the bound `end` while a round is traced
        self._rows: tuple[Any, ...] = tuple(range(n))  # the cache rows while a round is traced
        self._rounds = [TinyJit(self._round_impl) for _ in range(n)]  # _rounds[k - 1]: a round of k busy slots
        self._row_runner = _RowRunner(self)

    def runner(self, b: int) -> Runner:
        """Slot b's Runner: its prefill and lone decodes write row b of the batched caches, with the programs that
        every slot shares (`_RowRunner`)."""
        return SlotRunner(self._row_runner, b)

    def _round_impl(self, *bound: Any) -> tuple[Tensor, Tensor]:
        k = len(bound) // 3
        toks, pos, self._span = bound[:k], bound[k : 2 * k], bound[3 * k]
        self._rows = tuple(range(self.n)) if k == self.n else bound[2 * k : 3 * k]
        x = Tensor.cat(*(self.model.embed_token(t) for t in toks)).reshape(k, 1, -1)
        logits = self.model.forward(x, tuple(pos)).reshape(k, -1).realize()
        return logits, logits.argmax(-1).realize()  # each row's greedy token, read without copying the logits out

    def step(self, toks: Sequence[int], positions: Sequence[int], slots: Sequence[int] | None = None) -> Round:
        """Feed token toks[b] at position positions[b] of cache row slots[b] (default: every row in order), for k
        distinct slots: the round's output (each row's logits and greedy token), valid until the next round."""
        rows = list(range(self.n)) if slots is None else [int(s) for s in slots]
        k = len(rows)
        if not 1 <= k <= self.n or len(set(rows)) != k or not all(0 <= s < self.n for s in rows):
            raise GenerationError(f"a round needs 1..{self.n} distinct slots of 0..{self.n - 1}, got {rows}")
        if len(toks) != k or len(positions) != k:
            raise GenerationError(
                f"a round of {k} slots needs {k} tokens and positions, got {len(toks)}, {len(positions)}"
            )
        order = list(range(k))
        if k == self.n:
            order = sorted(range(k), key=lambda b: rows[b])  # all rows: the caches in their own order
            toks, positions, rows = [toks[b] for b in order], [positions[b] for b in order], sorted(rows)
        bound = [v.bind(int(t)) for v, t in zip(self.toks, toks)]
        bound += [v.bind(int(p)) for v, p in zip(self.pos, positions)]
        bound += [v.bind(s) for v, s in zip(self.slots, rows)]
        bound.append(self.end.bind(max(int(p) for p in positions) + 1))
        logits, best = self._rounds[k - 1](*bound)
        return Round(logits, best, order)

    def decode(self, toks: Sequence[int], positions: Sequence[int], slots: Sequence[int] | None = None) -> np.ndarray:
        """Logits (k, vocab) after feeding token toks[b] at position positions[b] of cache row slots[b] (default:
        every row in order), for k distinct slots."""
        return self.step(toks, positions, slots).all_logits()

    def _attention(self, i: int, w: LayerWeights, x: Tensor, positions: tuple[Any, ...]) -> Tensor:
        """The model's attention for one new token per row, row b at position positions[b]."""
        m: Transformer = self.model
        cfg = m.cfg
        n = x.shape[0]
        hd, vd, kv = cfg.head_dim, cfg.value_dim, cfg.n_kv_heads
        group = cfg.n_heads // kv
        # x and the new keys and values are realized once: each row's cache write below is its own kernel, and a lazy
        # input would be recomputed in every one of them (the norm 9 times and the k projection 4 times per layer)
        x = x.contiguous().realize()
        q, k, v = m._qkv(w, x)  # (N, 1, heads, hd), (N, 1, kv, hd), (N, 1, kv, vd): the model's own projections
        sliding = cfg.sliding_layers[i]
        table = m.rope_local if sliding else m.rope_global
        rows = Tensor.cat(*(table.shrink((None, (p, p + 1), None)) for p in positions), dim=1)  # (2, N, rot/2)
        # apply_rope rotates (B, T, heads, hd) by angles per T: the rows are put on the T axis
        q = apply_rope(q.reshape(1, n, cfg.n_heads, hd), rows[0], rows[1], cfg.rope_style).reshape(n, 1, -1, hd)
        k = apply_rope(k.reshape(1, n, kv, hd), rows[0], rows[1], cfg.rope_style).reshape(n, 1, kv, hd)
        ck, cv = m.cache_k[i], m.cache_v[i]
        new_k = k.transpose(1, 2).cast(ck.dtype).contiguous()  # (N, kv, 1, hd)
        new_v = v.transpose(1, 2).cast(cv.dtype).contiguous()
        Tensor.realize(new_k, new_v)
        writes = []
        for b, (r, p) in enumerate(zip(self._rows, positions)):
            writes.append(ck.shrink(((r, r + 1), None, (p, p + 1), None)).assign(new_k[b : b + 1]))
            writes.append(cv.shrink(((r, r + 1), None, (p, p + 1), None)).assign(new_v[b : b + 1]))
        Tensor.realize(*writes)
        end = self._span  # keys past the latest row's position are masked for every row: not read at all
        lanes = dot_lanes_of(hd)
        ck = ck.reshape(*ck.shape[:3], hd // lanes, lanes)  # split before the shrink to `end` (see lane_dot)
        if n == m.cache_k[i].shape[0]:
            ck, cv = ck.shrink((None, None, (0, end), None, None)), cv.shrink((None, None, (0, end), None))
        else:  # the busy slots' rows only
            ck = Tensor.cat(*(ck.shrink(((r, r + 1), None, (0, end), None, None)) for r in self._rows))
            cv = Tensor.cat(*(cv.shrink(((r, r + 1), None, (0, end), None)) for r in self._rows))
        keys = ck.unsqueeze(2).cast(dtypes.float32)  # (N, KV, 1, end, hd / lanes, lanes)
        values = cv.unsqueeze(2).cast(dtypes.float32)
        qg = m._f16(q).reshape(n, 1, kv, group, hd // lanes, lanes).permute(0, 2, 3, 1, 4, 5)  # (N, KV, G, 1, ., .)
        # products as broadcast multiply + sum: `@` reshapes the keys' view, and with a row axis beside the symbolic
        # `end` its index needs a division by `end` per element (scalar kernels, 13x the one-row time for 4 rows)
        scores = lane_dot(qg, keys).unsqueeze(3)  # (N, KV, G, 1, end)
        scores = softcap(scores * cfg.attn_scale, cfg.attn_softcap)
        at = Tensor.cat(*(Tensor.arange(p, p + 1, device=m.device) for p in positions)).reshape(n, 1, 1, 1, 1)
        cols = Tensor.arange(end, device=m.device).reshape(1, 1, 1, 1, -1)
        keep = cols <= at
        if sliding and cfg.sliding_window:
            keep = keep & (cols > at - cfg.sliding_window)
        # realized: else each output lane of the product below recomputes its row's exponentials
        probs = m._f16(keep.where(scores, -math.inf).softmax(-1)).contiguous()  # (N, KV, G, 1, end)
        out = (probs.transpose(-1, -2) * values).sum(-2).unsqueeze(3)  # (N, KV, G, 1, vd)
        out = out.permute(0, 3, 1, 2, 4).reshape(n, 1, cfg.n_heads * vd)
        return m._project(w, "attn_output", out)


class Round:
    """A round's output, read on demand (the round's program reuses its buffers: read before the next round). Rows
    in the order the round was given its slots. A greedy request needs only its row's token (`best`); the logits
    (1 MB a row for a 262k vocabulary) are copied out only when some row samples, penalises or reports logprobs."""

    def __init__(self, logits: Tensor, best: Tensor, order: list[int]) -> None:
        self._logits_t, self._best_t = logits, best
        self._pos = [0] * len(order)  # given row b -> row of the program's output
        for i, b in enumerate(order):
            self._pos[b] = i
        self._logits: np.ndarray | None = None
        self._best: np.ndarray | None = None

    def best(self, b: int) -> int:
        """Row b's greedy token: its logits' first largest (numpy's argmax), computed in the round."""
        if self._best is None:
            self._best = self._best_t.numpy()
        return int(self._best[self._pos[b]])

    def logits(self, b: int) -> np.ndarray:
        """Row b's logits (vocab,); the first call copies every row's out."""
        if self._logits is None:
            self._logits = self._logits_t.numpy()
        row: np.ndarray = self._logits[self._pos[b]]
        return row

    def all_logits(self) -> np.ndarray:
        """Every row's logits (k, vocab), in the order given."""
        if self._logits is None:
            self._logits = self._logits_t.numpy()
        if self._pos == sorted(self._pos):
            return self._logits
        return self._logits[self._pos]


class _RowRunner(Runner):
    """The prefill and decode programs of all slots' Runners: the cache row they use is a bound Variable (`slot`), so
    one captured program serves every slot. With a program per slot, each slot's first prompt and first lone decode
    ran unjitted (scheduling and lowering every kernel: ~1 s for Gemma 3 270M) and its second was captured, so a
    request that landed on a fresh slot stalled every other stream for that long; N slots also kept N copies of the
    programs' intermediate buffers."""

    def __init__(self, decoder: BatchDecoder) -> None:
        super().__init__(copy.copy(decoder.llm.model), decoder.max_context, decoder.chunk)
        self.decoder = decoder
        self.slot = Variable("slot", 0, decoder.n - 1)

    def _use_row(self, slot: Any) -> None:
        """Point the model's caches at cache row `slot` (a bound Variable) of the decoder's batched caches."""
        batched = self.decoder.model
        self.model.cache_k = [c.shrink(((slot, slot + 1), None, None, None)) for c in batched.cache_k]
        self.model.cache_v = [c.shrink(((slot, slot + 1), None, None, None)) for c in batched.cache_v]

    def _prefill_impl(self, pos: Any, last: Any, slot: Any = None) -> Tensor:
        self._use_row(slot)
        return super()._prefill_impl(pos, last)

    def _decode_impl(self, tok: Any, pos: Any, slot: Any = None) -> Tensor:
        self._use_row(slot)
        return super()._decode_impl(tok, pos)


class SlotRunner(Runner):
    """Slot b's Runner: `feed` as `Runner`'s, its own `cached` ids, and the shared `_RowRunner`'s staging rows and
    programs, called with the slot bound to b."""

    def __init__(self, shared: _RowRunner, b: int) -> None:  # not Runner.__init__: nothing of its own to build
        self.model, self.max_context, self.chunk = shared.model, shared.max_context, shared.chunk
        self.pos, self.tok, self.row, self.last, self.rows = (
            shared.pos,
            shared.tok,
            shared.row,
            shared.last,
            shared.rows,
        )
        self.index = b
        self._write_row = shared._write_row
        slot = shared.slot.bind(b)
        self._prefill = lambda pos, last: shared._prefill(pos, last, slot)  # type: ignore[assignment]
        self._decode = lambda tok, pos: shared._decode(tok, pos, slot)  # type: ignore[assignment]
        self.cached: list[int] = []
