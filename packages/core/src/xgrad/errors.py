"""The one error hierarchy of xgrad: every user-facing failure is an `XgradError` that says what went wrong and how
to fix it. Where tinygrad raises a builtin type for the same failure, the xgrad error also derives from it, so
tinygrad code's `except RuntimeError:` (devices, compiling, the JIT, optimizers), `except ValueError:` (shapes),
`except TypeError:` (dtypes, a tensor's truth value) and `except IndexError:` keep working."""

from __future__ import annotations


class XgradError(Exception):
    """Base of every error xgrad raises on purpose."""


class DeviceError(XgradError, RuntimeError):
    """A device name is unknown, unavailable, or failed to open."""


class OutOfMemoryError(DeviceError, MemoryError):
    """A device could not allocate a buffer (the size and the device are in the message)."""


class PluginError(XgradError):
    """A backend plugin failed to load, raised in a hook, or targets another plugin API version."""


class CompileError(XgradError, RuntimeError):
    """A generated kernel failed to compile; carries the source and the compiler's log."""

    def __init__(self, message: str, source: str = "", log: str = "") -> None:
        super().__init__(
            f"{message}\n--- compiler log ---\n{log}\n--- source ---\n{source}" if (source or log) else message
        )
        self.source = source
        self.log = log


class ShapeError(XgradError, ValueError, RuntimeError):
    """Shapes do not fit together (broadcast, reshape, pad, matmul, ...); the message names both. A `ValueError`, and
    a `RuntimeError` as tinygrad's for matmul, permute, gather and the like."""


class ShardingError(ShapeError, RuntimeError):
    """A tensor cannot be split as asked (the axis does not divide evenly over the devices)."""


class DTypeError(XgradError, TypeError, RuntimeError):
    """A dtype is unknown or not supported by this operation or device. A `TypeError`, and a `RuntimeError` as
    tinygrad's for data it cannot make a Tensor of, assign/setitem/scatter dtype mismatches and the like."""


class IndexingError(XgradError, IndexError):
    """An index is out of range or of an unsupported kind."""


class JitError(XgradError, RuntimeError):
    """A TinyJit call does not match what was captured, or cannot be captured."""


class TensorUsageError(XgradError, TypeError):
    """A tensor was used where Python needs a plain value it does not have: `len()` of a 0-d tensor, `bool(t)`."""


class ArgumentError(XgradError, ValueError, RuntimeError):
    """An argument has a value the function does not take (an unknown mode or reduction name, a probability outside
    [0, 1], arguments that exclude each other): a `ValueError`, and a `RuntimeError` where tinygrad raises that."""


class DeviceMismatchError(XgradError, RuntimeError):
    """Tensors an operation combines are on different devices (a `RuntimeError`, as tinygrad's)."""


class KnobError(XgradError, ValueError):
    """An environment knob has a value that cannot be parsed."""


class GradientError(XgradError, RuntimeError):
    """A gradient was asked for where there is none: with respect to a bare constant such as `Tensor(2.0)` (equal
    constants are one graph node), or of or for a tensor that is not floating-point (a `GradientDTypeError`)."""


class GradientDTypeError(GradientError, DTypeError):
    """A gradient of or for a tensor that is not floating-point: a `RuntimeError` as tinygrad's, and a `DTypeError`."""


class GradientShapeError(ShapeError, AssertionError):
    """`gradient()` of a non-scalar tensor without `gradient=`: a `ShapeError`, and an `AssertionError` (tinygrad's)."""
