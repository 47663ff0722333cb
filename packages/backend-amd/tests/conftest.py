"""The AMD tests' shared helper module (amd_arch_check.py, also a pytest plugin of the op suite's child run):
--import-mode=importlib leaves this directory off sys.path."""

from __future__ import annotations

import pathlib
import sys

if str(pathlib.Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
