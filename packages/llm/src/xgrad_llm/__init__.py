"""xgrad LLM tools: GGUF/safetensors loading, tokenizers, chat templates, Transformer models, sampling, CLI, server.

Uses only the public `xgrad` API."""

__version__ = "0.1.0"
