"""The engine: jobs (prompt ids and sampling settings) in, streams of events (text pieces, logprobs, the finish) out.

`--parallel N` gives N slots. Each slot owns a KV cache (a `Runner` over a shallow copy of the model that shares its
weights and has its own cache tensors; with batching, row i of the batched caches of `batch.BatchDecoder`), so a
slot reuses the longest common prefix of its next prompt with what it ran before: a chat's next turn runs only its
new tokens. A new job goes to the free slot whose cache shares the longest prefix with its prompt. Jobs beyond the
slots wait in a bounded queue; a full queue refuses the job (`QueueFullError`, HTTP 503).

One worker thread does all model work, off the event loop: each round it admits waiting jobs into free slots and
runs one step of every busy slot (a decode, or up to `prefill_step` tokens of a prompt: a long prompt is fed over
several rounds), so the slots' streams interleave token by token. With `batch` (the default), when two or more slots
decode in a round, their decodes run as one batched forward over just those slots' rows (continuous batching: a
request joins or leaves between rounds).
A job whose client left (`cancel()`) or whose deadline passed is dropped before its next step, and its slot is
free at once. Events reach the HTTP side through the job's `emit` callback (thread-safe hand-off to the event loop).

Sampling is `xgrad_llm.generate.Sampler`'s, penalties included (presence/frequency over the tokens of this reply),
with a `Constraint` (JSON, tool calls) that rejects tokens it does not allow: a rejected draw is masked out and drawn
again, so the output follows the distribution restricted to the allowed tokens.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from xgrad import Tensor
from xgrad_llm.generate import LLM, Runner, Sampler, SamplingParams, _stop_prefix_len, common_prefix
from xgrad_llm.server.batch import BatchDecoder
from xgrad_llm.server.protocol import APIError


class Constraint(Protocol):
    """Which tokens may come next (structured output). `allows(tok)` must not change the state; `advance(tok)` does.
    `complete` says the output is whole (generation ends there); `forced(budget)` names the token that must come next
    when only `budget` tokens are left (so the output closes in time), or None."""

    def allows(self, tok: int) -> bool: ...

    def advance(self, tok: int) -> None: ...

    @property
    def complete(self) -> bool: ...

    def forced(self, budget: int) -> int | None: ...


@dataclass
class Event:
    """One step's news for a job: new text (with the logprobs of its tokens), or the end (`finish` set)."""

    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish: str | None = None  # "stop" | "length" | "error" | "timeout" | "cancelled"
    error: APIError | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    batched_rounds: int = 0  # decode rounds run as one batched forward


@dataclass
class Job:
    """One request for the engine."""

    prompt: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: Constraint | None = None
    timeout: float | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        """Drop the job before its next step (its client left)."""
        self.cancelled.set()


class QueueFullError(APIError):
    """Every slot is busy and the queue is full."""


@dataclass
class Stats:
    """Totals for /metrics."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    cached_tokens: int = 0
    batched_rounds: int = 0  # decode rounds run as one batched forward
    requests: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))


def batches(decoding: int, slots: int) -> bool:
    """Whether `decoding` concurrent decodes among `slots` slots run as one batched round: whenever two or more do. A
    round computes only the decoding slots' rows (`batch.py`), so it reads the weights once for k decodes where k lone
    decodes read them k times."""
    return 2 <= decoding <= slots


def slot_runner(llm: LLM) -> Runner:
    """A Runner over the model's weights with a KV cache of its own (zeros of the same shapes)."""
    model = copy.copy(llm.model)
    model.cache_k = [
        Tensor.zeros(*c.shape, dtype=c.dtype, device=model.device).contiguous().realize() for c in llm.model.cache_k
    ]
    model.cache_v = [
        Tensor.zeros(*c.shape, dtype=c.dtype, device=model.device).contiguous().realize() for c in llm.model.cache_v
    ]
    return Runner(model, llm.runner.max_context, llm.runner.chunk)


class _Slot:
    """A KV cache and the job it runs (None: free)."""

    def __init__(self, index: int, runner: Runner) -> None:
        self.index, self.runner = index, runner
        self.job: Job | None = None
        self.gen: _Generation | None = None


class _Generation:
    """The state of one job in a slot: ids so far, the sampler, the text decoder and what it holds back."""

    def __init__(self, engine: Engine, slot: _Slot, job: Job) -> None:
        self.engine, self.slot, self.job = engine, slot, job
        self.ids = list(job.prompt)
        self.generated: list[int] = []
        self.sampler = Sampler(job.params)
        self.decoder = engine.llm.stream_decoder()
        self.pending = ""  # decoded text not sent yet (it may begin a stop string)
        self.pending_logprobs: list[dict[str, Any]] = []
        # whether a step needs the logits (else the greedy token alone: a batched round computes it, see batch.Round)
        self.needs_logits = bool(
            job.constraint is not None or job.logprobs or job.params.temperature > 0 or self.sampler.penalizes
        )
        self.cached = -1  # prompt tokens the slot's cache held (-1: not looked yet)
        self.fed = 0  # prompt tokens in the cache so far
        self.started = False

    def step(self) -> Event | None:
        """Run one prefill or decode and sample one token; the Event to send (None: nothing new), finish included."""
        runner, stats = self.slot.runner, self.engine.stats
        t0 = time.perf_counter()
        if not self.started:
            if self.cached < 0:
                self.cached = self.fed = min(common_prefix(runner.cached, self.ids), len(self.ids) - 1)
            if len(self.ids) - self.fed > self.engine.prefill_step:  # a long prompt: a part now, the rest later,
                self.fed += self.engine.prefill_step  # so the other slots' streams go on in between
                runner.feed(self.ids[: self.fed])
                stats.prompt_seconds += time.perf_counter() - t0
                return None
        logits = runner.feed(self.ids)
        dt = time.perf_counter() - t0
        if not self.started:
            self.started = True
            stats.prompt_tokens += len(self.ids) - self.cached
            stats.cached_tokens += self.cached
            stats.prompt_seconds += dt
        else:
            stats.generate_seconds += dt
        return self.take(logits)

    def decode_input(self) -> tuple[int, int] | None:
        """(token, position) when this step is one decode (the cache holds every id but the last), else None."""
        if self.started and len(self.slot.runner.cached) == len(self.ids) - 1:
            return self.ids[-1], len(self.ids) - 1
        return None

    def take(self, logits: np.ndarray | None, best: int | None = None) -> Event | None:
        """Sample the next token from `logits` (of the position after `ids`) and decide what to send. Without
        `needs_logits`, `best` (the logits' argmax) may stand for them (logits None)."""
        job, llm, runner, stats = self.job, self.engine.llm, self.slot.runner, self.engine.stats
        budget = job.params.max_tokens - len(self.generated)
        if budget <= 0:
            return self._finish("length")
        if job.constraint is not None and job.constraint.complete:
            return self._finish("stop")
        if logits is None:
            assert best is not None and not self.needs_logits
            tok: int | None = best
        else:
            tok = self._sample(logits, budget)
        if tok is None or llm.is_eog(tok):
            return self._finish("stop")
        self.generated.append(tok)
        stats.generated_tokens += 1
        self.ids.append(tok)
        if job.constraint is not None:
            job.constraint.advance(tok)
        if job.logprobs:
            assert logits is not None
            self.pending_logprobs.append(self._logprob_entry(logits, tok))
        self.pending += self.decoder.push(tok)
        stops = job.params.stop
        cut = min((i for s in stops if (i := self.pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.pending = self.pending[:cut]
            return self._finish("stop", flush=False)
        if len(self.generated) >= job.params.max_tokens or len(self.ids) >= runner.max_context:
            return self._finish("length")
        if job.constraint is not None and job.constraint.complete:
            return self._finish("stop")
        hold = _stop_prefix_len(self.pending, stops)
        if len(self.pending) > hold:
            ev = Event(text=self.pending[: len(self.pending) - hold], logprobs=self.pending_logprobs)
            self.pending = self.pending[len(self.pending) - hold :]
            self.pending_logprobs = []
            return ev
        return None

    def _sample(self, logits: np.ndarray, budget: int) -> int | None:
        """The next token: the sampler's draw (its penalties see the prompt and this reply's tokens), within what the
        constraint allows."""
        c = self.job.constraint
        if c is None:
            return self.sampler(logits, self.ids, self.generated)
        if (tok := c.forced(budget)) is not None:
            return tok
        x = np.asarray(logits, dtype=np.float64).copy()
        for _ in range(32):  # draw; mask out a token the constraint refuses and draw again
            tok = self.sampler(x, self.ids, self.generated)
            if c.allows(tok):
                return tok
            x[tok] = -np.inf  # stays -inf under every penalty
        x = self.sampler.penalize(x, self.ids, self.generated)
        for tok in np.argsort(-x, kind="stable"):  # many refusals: the likeliest allowed token after the penalties
            if np.isfinite(x[tok]) and c.allows(int(tok)):
                return int(tok)
        return None

    def _logprob_entry(self, logits: np.ndarray, tok: int) -> dict[str, Any]:
        x = np.asarray(logits, dtype=np.float64)
        logp = x - (np.max(x) + np.log(np.sum(np.exp(x - np.max(x)))))
        entry = self.engine.token_logprob(tok, float(logp[tok]))
        top = []
        if self.job.top_logprobs:
            for t in np.argsort(-logp, kind="stable")[: self.job.top_logprobs]:
                top.append(self.engine.token_logprob(int(t), float(logp[t])))
        entry["top_logprobs"] = top
        return entry

    def _finish(self, reason: str, flush: bool = True) -> Event:
        if flush:  # the bytes of an unfinished character, then the text held back for a stop string that never came
            self.pending += self.decoder.flush()
            cut = min((i for s in self.job.params.stop if (i := self.pending.find(s)) >= 0), default=-1)
            if cut >= 0:
                self.pending = self.pending[:cut]
        return Event(
            text=self.pending,
            logprobs=self.pending_logprobs,
            finish=reason,
            prompt_tokens=len(self.job.prompt),
            completion_tokens=len(self.generated),
            cached_tokens=self.cached,
        )


class Engine:
    """Slots, a bounded queue and the worker thread that runs them. `submit(job)` queues a job (or raises
    QueueFullError); the job's `emit` receives its Events, the last one with `finish` set."""

    def __init__(
        self, llm: LLM, parallel: int = 1, max_queue: int = 64, timeout: float | None = 600.0, batch: bool = True
    ) -> None:
        if parallel < 1:
            raise APIError(f"--parallel must be >= 1, got {parallel}")
        self.llm, self.max_queue, self.timeout = llm, max_queue, timeout
        self.prefill_step = 4 * llm.runner.chunk  # prompt tokens a slot runs per round before the others step
        # with `batch` and several slots, their caches are rows of one batch and concurrent decodes run as one forward
        self.batch = BatchDecoder(llm, parallel) if parallel > 1 and batch else None
        if self.batch is not None:
            self.slots = [_Slot(i, self.batch.runner(i)) for i in range(parallel)]
        else:
            self.slots = [_Slot(0, llm.runner)] + [_Slot(i, slot_runner(llm)) for i in range(1, parallel)]
        self.waiting: collections.deque[Job] = collections.deque()
        self.stats = Stats()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="xgrad-llm-engine", daemon=True)
        self._token_text: dict[int, tuple[str, list[int]]] = {}
        self.model_lock = threading.Lock()  # held while the worker runs the model; other model users take it too

    def warm(self) -> None:
        """Capture every program the worker replays before any request comes: each slot's prefill and lone decode
        (one set for all slots with batching) and a batched round of every size. A TinyJit program runs unjitted on
        its first call and is captured on its second, so without this the first requests (and the first round of
        each new number of busy slots) stall every stream for about a second each (Gemma 3 270M). The caches are
        written with filler tokens and then forgotten (every slot's `cached` is emptied)."""
        with self.model_lock:
            slots = self.slots[:1] if self.batch is not None else self.slots
            for slot in slots:
                runner = slot.runner
                # a prefill of a whole chunk, then of 3 tokens (the capture), then lone decodes: unjitted, captured,
                # replayed (as far as the context allows)
                ids = [1] * max(1, min(runner.chunk + 3, runner.max_context - 3))
                runner.cached = []
                runner.feed(ids)
                for _ in range(min(3, runner.max_context - len(ids))):
                    ids.append(1)
                    runner.feed(ids)
                runner.cached = []
            if self.batch is not None:
                for k in range(2, len(self.slots) + 1):
                    for _ in range(3):
                        self.batch.step([1] * k, list(range(k)), list(range(k))).best(0)
                for slot in self.slots:
                    slot.runner.cached = []

    # ---- the HTTP side ----
    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker after its current step; waiting and running jobs end with finish 'cancelled'."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        """Queue `job`; QueueFullError when the jobs waiting already fill the free slots and `max_queue` more."""
        if job.timeout is None:
            job.timeout = self.timeout
        with self._cv:
            free = sum(s.job is None for s in self.slots)
            if len(self.waiting) >= self.max_queue + free:
                self.stats.requests["rejected"] += 1
                raise QueueFullError(
                    f"the server is busy: {len(self.slots)} slots running and {len(self.waiting)} requests queued; "
                    "retry later",
                    status=503,
                    type="server_error",
                    code="server_busy",
                    headers={"Retry-After": "1"},
                )
            self.waiting.append(job)
            self._cv.notify_all()

    def busy_slots(self) -> int:
        """How many slots run a job now."""
        return sum(s.job is not None for s in self.slots)

    def queued(self) -> int:
        """How many jobs wait for a slot."""
        return len(self.waiting)

    def wake(self) -> None:
        """Let the worker notice a cancelled job now (it also checks every step)."""
        with self._cv:
            self._cv.notify_all()

    def token_logprob(self, tok: int, logprob: float) -> dict[str, Any]:
        """OpenAI's logprob entry for one token: its text, logprob and UTF-8 bytes."""
        if tok not in self._token_text:
            raw = self.llm.tokenizer.token_bytes(tok)
            self._token_text[tok] = (raw.decode("utf-8", errors="replace"), list(raw))
        text, raw_list = self._token_text[tok]
        return {"token": text, "logprob": logprob, "bytes": raw_list}

    # ---- the worker ----
    def _admit(self) -> None:
        while self.waiting:
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            job = self.waiting.popleft()
            if job.cancelled.is_set():
                self.stats.requests["cancelled"] += 1
                continue
            slot = max(free, key=lambda s: (common_prefix(s.runner.cached, job.prompt), -s.index))
            slot.job, slot.gen = job, _Generation(self, slot, job)

    def _free(self, slot: _Slot, outcome: str) -> None:
        self.stats.requests[outcome] += 1
        slot.job, slot.gen = None, None

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self.waiting and all(s.job is None for s in self.slots):
                    self._cv.wait()
                if self._stop:
                    break
                self._admit()
                busy = [s for s in self.slots if s.job is not None]
            busy = [s for s in busy if self._alive(s)]
            rows = {s.index: inp for s in busy if s.gen is not None and (inp := s.gen.decode_input()) is not None}
            if self.batch is not None and batches(len(rows), len(self.slots)):  # continuous batching: one forward
                self._decode_round(rows)
                busy = [s for s in busy if s.index not in rows]
            for slot in busy:
                self._step(slot)
        for slot in self.slots:
            if slot.job is not None:
                slot.job.emit(Event(finish="cancelled"))
                self._free(slot, "cancelled")
        with self._cv:
            while self.waiting:
                self.waiting.popleft().emit(Event(finish="cancelled"))

    def _alive(self, slot: _Slot) -> bool:
        """False (and the slot freed) when its job was cancelled or ran past its deadline."""
        job, gen = slot.job, slot.gen
        assert job is not None and gen is not None
        if job.cancelled.is_set():
            self._free(slot, "cancelled")
            return False
        if job.timeout is not None and time.monotonic() - job.submitted > job.timeout:
            job.emit(Event(finish="timeout", completion_tokens=len(gen.generated)))
            self._free(slot, "timeout")
            return False
        return True

    def _failed(self, slot: _Slot, e: Exception) -> None:
        """A failure inside the model: this request fails, the server keeps serving."""
        assert slot.job is not None
        slot.runner.cached = []
        err = APIError(f"generation failed: {type(e).__name__}: {e}", status=500, type="server_error")
        slot.job.emit(Event(finish="error", error=err))
        self._free(slot, "error")

    def _emit(self, slot: _Slot, ev: Event | None) -> None:
        assert slot.job is not None
        if ev is not None:
            slot.job.emit(ev)
            if ev.finish is not None:
                self._free(slot, "ok")

    def _step(self, slot: _Slot) -> None:
        assert slot.gen is not None
        try:
            with self.model_lock:
                ev = slot.gen.step()
        except Exception as e:
            self._failed(slot, e)
            return
        self._emit(slot, ev)

    def _decode_round(self, rows: dict[int, tuple[int, int]]) -> None:
        """One batched forward for the slots in `rows` ({slot: (token, position)}), computing only their rows."""
        assert self.batch is not None
        order = sorted(rows)
        t0 = time.perf_counter()
        try:
            with self.model_lock:
                out = self.batch.step([rows[i][0] for i in order], [rows[i][1] for i in order], order)
        except Exception as e:
            for slot in self.slots:
                if slot.index in rows:
                    self._failed(slot, e)
            return
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.batched_rounds += 1
        for b, index in enumerate(order):
            slot = self.slots[index]
            if slot.gen is not None:
                slot.runner.cached = list(slot.gen.ids)
                try:
                    gen = slot.gen
                    ev = gen.take(out.logits(b)) if gen.needs_logits else gen.take(None, out.best(b))
                except Exception as e:
                    self._failed(slot, e)
                    continue
                self._emit(slot, ev)
