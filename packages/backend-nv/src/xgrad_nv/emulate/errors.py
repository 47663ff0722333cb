"""The PTX interpreter's error."""

from __future__ import annotations

from xgrad.errors import DeviceError


class EmulatorError(DeviceError):
    """PTX the interpreter cannot run: an unknown instruction (named with its PTX line), text that is not PTX, a
    launch that does not fit the kernel, or an access outside device memory (naming the address and the kernel)."""
