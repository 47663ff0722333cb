"""A plugin that calls sys.exit() at import: recorded as failed, the program goes on."""

import sys

sys.exit("xgrad_exit_import exits on purpose")
