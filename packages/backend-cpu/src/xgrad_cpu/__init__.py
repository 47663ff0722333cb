"""xgrad CPU backend: kernels rendered to C, compiled with clang or gcc, run in-process.

Kept tiny on purpose: the plugin registry imports this package, so it must import nothing heavy.
"""

__version__ = "0.1.0"
