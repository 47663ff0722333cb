"""Helpers of the server tests: a tiny random-weight llama GGUF (written by tiny_models' writer from numpy weights, no
transformers needed), a numpy forward pass of the same weights (the oracle of logits, greedy ids, embeddings), and a
uvicorn server run in-process on a free loopback port.

Imported by the test_server*.py modules (`sys.path` gets this folder); not a test module itself.
"""

from __future__ import annotations

import contextlib
import pathlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tiny_models as tm  # noqa: E402

SPEC = tm.Spec("llama", n_layers=2, dim=32, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64, tied=True)
CHATML_TOOLS = (  # a Hermes-style template that renders tools itself (like Qwen's)
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{%- endif %}{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


class _Array:
    """What tiny_models.write_gguf reads from a state dict's values (a torch tensor's detach/float/numpy)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def detach(self) -> _Array:
        return self

    def float(self) -> _Array:
        return self

    def numpy(self) -> np.ndarray:
        return self.x


class NumpyLlama:
    """Random llama weights (Hugging Face names and layout) and their forward pass in float64 numpy."""

    def __init__(self, spec: tm.Spec, seed: int = 0) -> None:
        self.spec = spec
        rng = np.random.default_rng(seed)
        d, hd = spec.dim, spec.head_dim

        def mat(rows: int, cols: int) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

        def norm() -> np.ndarray:
            return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

        w = {"model.embed_tokens.weight": 2.0 * mat(spec.vocab_size, d)}
        for i in range(spec.n_layers):
            p = f"model.layers.{i}."
            w[p + "input_layernorm.weight"] = norm()
            w[p + "self_attn.q_proj.weight"] = mat(spec.n_heads * hd, d)
            w[p + "self_attn.k_proj.weight"] = mat(spec.n_kv_heads * hd, d)
            w[p + "self_attn.v_proj.weight"] = mat(spec.n_kv_heads * hd, d)
            w[p + "self_attn.o_proj.weight"] = mat(d, spec.n_heads * hd)
            w[p + "post_attention_layernorm.weight"] = norm()
            w[p + "mlp.gate_proj.weight"] = mat(spec.ffn_dim, d)
            w[p + "mlp.up_proj.weight"] = mat(spec.ffn_dim, d)
            w[p + "mlp.down_proj.weight"] = mat(d, spec.ffn_dim)
        w["model.norm.weight"] = norm()
        self.w = w

    def state_dict(self) -> dict[str, _Array]:
        return {k: _Array(v) for k, v in self.w.items()}

    def hidden(self, ids: list[int]) -> np.ndarray:
        """The final-normed hidden states (T, dim)."""
        s, w = self.spec, {k: v.astype(np.float64) for k, v in self.w.items()}

        def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

        def rope(x: np.ndarray) -> np.ndarray:  # (T, H, hd), Hugging Face's rotate-half
            half = s.head_dim // 2
            inv = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2) / s.head_dim))
            ang = np.arange(x.shape[0])[:, None] * inv[None, :]
            cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
            sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
            rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
            return x * cos + rot * sin

        t = len(ids)
        h = w["model.embed_tokens.weight"][ids]
        mask = np.triu(np.full((t, t), -np.inf), 1)
        for i in range(s.n_layers):
            p = f"model.layers.{i}."
            x = rms(h, w[p + "input_layernorm.weight"])
            q = rope((x @ w[p + "self_attn.q_proj.weight"].T).reshape(t, s.n_heads, s.head_dim))
            k = rope((x @ w[p + "self_attn.k_proj.weight"].T).reshape(t, s.n_kv_heads, s.head_dim))
            v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(t, s.n_kv_heads, s.head_dim)
            rep = s.n_heads // s.n_kv_heads
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(s.head_dim) + mask
            att = np.exp(scores - scores.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            out = np.einsum("hts,shd->thd", att, v).reshape(t, -1)
            h = h + out @ w[p + "self_attn.o_proj.weight"].T
            x = rms(h, w[p + "post_attention_layernorm.weight"])
            gate = x @ w[p + "mlp.gate_proj.weight"].T
            h = (
                h
                + ((gate / (1 + np.exp(-gate))) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
            )
        return rms(h, w["model.norm.weight"])

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits (vocab,) of the token after `ids` (tied output head)."""
        return self.hidden(ids)[-1] @ self.w["model.embed_tokens.weight"].astype(np.float64).T

    def greedy(self, ids: list[int], n: int, eog: int = 1) -> list[int]:
        """Up to `n` greedy ids after `ids`, ending before the end-of-generation id."""
        ids, out = list(ids), []
        for _ in range(n):
            tok = int(np.argmax(self.logits(ids)))
            if tok == eog:
                break
            out.append(tok)
            ids.append(tok)
        return out


def write_model(folder: pathlib.Path, template: str | None = None) -> tuple[NumpyLlama, pathlib.Path]:
    """The numpy reference and its GGUF file (optionally with a chat template)."""
    spec = SPEC if template is None else tm.Spec(**{**SPEC.__dict__, "extra": {"tokenizer.chat_template": template}})
    ref = NumpyLlama(spec)
    return ref, tm.write_gguf(spec, ref, folder / "tiny-llama.gguf")


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on a free loopback port in a thread; yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
