"""xgrad NVIDIA backend: CUDA C and PTX renderers, NVRTC/nvcc/ptxas compile, CUDA driver runtime.

Kept tiny on purpose: the plugin registry imports this package, so it must import nothing heavy.
"""

__version__ = "0.1.0"
