"""What the fuzz tests share (imported by test_fuzz_loaders.py and test_fuzz_ops.py; not a test module): hypothesis
settings that run a fixed, derandomized number of examples in CI and, with XGRAD_FUZZ_EXAMPLES=N set, N random ones
(the longer run the core README documents). The settings live in `xgrad.testing`, so other packages' fuzzers
(xgrad-llm's GGUF fuzzer) use the same ones."""

from __future__ import annotations

import pytest

from xgrad.testing import fuzz_long_run, fuzz_settings

hypothesis = pytest.importorskip("hypothesis")

LONG_RUN = fuzz_long_run()

__all__ = ["LONG_RUN", "fuzz_settings"]
