"""xgrad: a small deep-learning framework whose Tensor API follows tinygrad's. Backends are plugins (see xgrad.plugin).

Keep this a plain import list and keep it fast: importing xgrad must not load plugins or open devices.
"""

from xgrad.device import Device
from xgrad.helpers import Context, getenv

__version__ = "0.1.0"

__all__ = ["Context", "Device", "__version__", "getenv"]
