"""xgrad WebGPU backend: WGSL renderer on the wgpu runtime.

Kept tiny on purpose: the plugin registry imports this package, so it must import nothing heavy.
"""

__version__ = "0.1.0"
