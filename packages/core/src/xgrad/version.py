"""The version of xgrad-core: one place that every module reads it from (the package root re-exports it)."""

from __future__ import annotations

__version__ = "0.1.0"
