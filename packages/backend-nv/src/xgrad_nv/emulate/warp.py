"""Warp-wide instructions: shfl.sync, vote.sync, activemask, mma.sync (PTX ISA 9.7.8, 9.7.13)."""

from __future__ import annotations

from collections.abc import Callable

from xgrad_nv.emulate.parse import Instruction
from xgrad_nv.emulate.values import Decoder, Step

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}
