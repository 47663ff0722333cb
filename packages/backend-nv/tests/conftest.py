"""The NV tests' shared helper module (nv_ops.py): --import-mode=importlib leaves this directory off sys.path."""

from __future__ import annotations

import pathlib
import sys

if str(pathlib.Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
