"""xgrad kernel lowering: optimizer actions, linearizer, renderer bases, and the PYTHON reference executor.

Kept tiny on purpose: the plugin registry imports this package, so it must import nothing heavy.
"""

__version__ = "0.1.0"
