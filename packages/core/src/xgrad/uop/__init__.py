"""The UOp IR: `ops` (the node), `pattern` (rewrite tables), `symbolic` (the simplifier), `bounds`, `sharding`, ...

`ops` is imported first, whichever module of the package is asked for: `ops` imports the modules that build on it
(bounds, sharding, symbolic) at its end, so none of them ever meets a partially initialised `ops` or `pattern`.
"""

import xgrad.uop.ops  # noqa: F401
