"""xgrad AMD backend: HIP renderer, clang amdgcn compile, HIP/KFD runtime.

Kept tiny on purpose: the plugin registry imports this package, so it must import nothing heavy.
"""

__version__ = "0.1.0"
