"""What the fuzz tests share (imported by test_fuzz_loaders.py and test_fuzz_ops.py; not a test module): hypothesis
settings that run a fixed, derandomized number of examples in CI and, with XGRAD_FUZZ_EXAMPLES=N set, N random ones
(the longer run the core README documents)."""

from __future__ import annotations

import os
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")

LONG_RUN = "XGRAD_FUZZ_EXAMPLES" in os.environ


def fuzz_settings(ci_examples: int) -> Any:
    """`ci_examples` derandomized examples per test, or XGRAD_FUZZ_EXAMPLES random ones when that is set."""
    return hypothesis.settings(
        max_examples=int(os.environ.get("XGRAD_FUZZ_EXAMPLES", str(ci_examples))),
        deadline=None,
        derandomize=not LONG_RUN,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
