"""A plugin whose import is interrupted (as by Ctrl-C): the registry must let KeyboardInterrupt through."""

raise KeyboardInterrupt
