"""`xgrad-llm serve`: an OpenAI-compatible HTTP server and web chat over a loaded model.

`create_app(config, llm)` builds the ASGI app (`app.py`); `serve(config, loader, host, port)` runs it on uvicorn.
Needs the `serve` extra: `pip install 'xgrad-llm[serve]'`.
"""

from __future__ import annotations

from xgrad_llm.server.app import ServerConfig, create_app
from xgrad_llm.server.engine import Engine, Job

__all__ = ["Engine", "Job", "ServerConfig", "create_app"]
