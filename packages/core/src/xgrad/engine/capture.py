"""Capture state: while a TinyJit captures, the realize engine records here every schedule it runs.

In: the schedules `run_schedule` runs (`record`). Out: the list a capture reads back when its function returns. A
module of its own so that the engine (below `Tensor`) and TinyJit (above it) share it without importing each other.
"""

from __future__ import annotations

from collections import defaultdict

from xgrad.buffer import Buffer
from xgrad.engine.schedule import ScheduleItem

Recorded = list[tuple[list[ScheduleItem], dict[str, int]]]


class _Capture:
    """Set while a TinyJit captures: the engine records every schedule it runs here, and the memory planner keeps the
    intermediates of the schedules that ran (dead, but held by the recording) for later ones to reuse."""

    active: Recorded | None = None
    pool: dict[tuple[str, int], list[Buffer]] | None = None


def record(items: list[ScheduleItem], var_vals: dict[str, int]) -> None:
    """Keep `items` (run with `var_vals`) for the TinyJit capturing now; nothing when none is."""
    if _Capture.active is not None:
        _Capture.active.append((items, var_vals))


def capturing() -> bool:
    """Whether a TinyJit is capturing now."""
    return _Capture.active is not None


def capture_pool() -> dict[tuple[str, int], list[Buffer]] | None:
    """The intermediates, by (device, bytes), of the schedules the capture in progress ran; None when none is."""
    return _Capture.pool


def start_capture() -> Recorded:
    """Begin a capture: the schedules run from now on are appended to the returned list until `stop_capture`."""
    recorded: Recorded = []
    _Capture.active = recorded
    _Capture.pool = defaultdict(list)
    return recorded


def stop_capture() -> None:
    """End the capture in progress."""
    _Capture.active = _Capture.pool = None


__all__ = ["Recorded", "capture_pool", "capturing", "record", "start_capture", "stop_capture"]
