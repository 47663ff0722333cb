"""/metrics: the engine's counters in, Prometheus' text exposition format (version 0.0.4) out."""

from __future__ import annotations

from xgrad_llm.server.engine import Engine

PREFIX = "xgrad_llm"


def render_metrics(engine: Engine) -> str:
    """Token totals and throughput, requests running and queued, busy slots, requests by outcome."""
    s = engine.stats
    rows: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        (
            "prompt_tokens_total",
            "counter",
            "Prompt tokens run through the model (cached ones excluded).",
            [("", s.prompt_tokens)],
        ),
        (
            "prompt_cached_tokens_total",
            "counter",
            "Prompt tokens reused from a slot's KV cache.",
            [("", s.cached_tokens)],
        ),
        ("prompt_seconds_total", "counter", "Seconds spent on prompt prefill.", [("", s.prompt_seconds)]),
        ("tokens_predicted_total", "counter", "Tokens generated.", [("", s.generated_tokens)]),
        ("tokens_predicted_seconds_total", "counter", "Seconds spent on decode steps.", [("", s.generate_seconds)]),
        (
            "prompt_tokens_per_second",
            "gauge",
            "Average prefill throughput.",
            [("", s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0)],
        ),
        (
            "predicted_tokens_per_second",
            "gauge",
            "Average decode throughput of one slot.",
            [("", s.generated_tokens / s.generate_seconds if s.generate_seconds else 0.0)],
        ),
        (
            "batched_decode_rounds_total",
            "counter",
            "Decode rounds run as one batched forward over several slots.",
            [("", s.batched_rounds)],
        ),
        ("requests_processing", "gauge", "Requests running in a slot.", [("", engine.busy_slots())]),
        ("requests_deferred", "gauge", "Requests waiting for a slot.", [("", engine.queued())]),
        ("slots_busy", "gauge", "Slots running a request.", [("", engine.busy_slots())]),
        ("slots_total", "gauge", "Slots (--parallel).", [("", len(engine.slots))]),
        (
            "requests_total",
            "counter",
            "Requests by outcome.",
            [(f'{{outcome="{k}"}}', v) for k, v in sorted(s.requests.items())],
        ),
    ]
    lines = []
    for name, kind, help_text, samples in rows:
        full = f"{PREFIX}_{name}"
        lines.append(f"# HELP {full} {help_text}")
        lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            lines.append(
                f"{full}{labels} {float(value):.6g}" if isinstance(value, float) else f"{full}{labels} {value}"
            )
    return "\n".join(lines) + "\n"
