"""`xgrad-llm serve` as a command (binds 127.0.0.1, prints the chat URL, loads in the background), /health while the
model loads or after it failed to load, and CORS only when asked for."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import serve_helpers as sh  # noqa: E402

from xgrad_llm.generate import LLM  # noqa: E402
from xgrad_llm.server import ServerConfig, create_app  # noqa: E402


def request(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, headers, data = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, headers, data = e.code, dict(e.headers), e.read()
    headers = {k.lower(): v for k, v in headers.items()}
    try:
        return status, headers, json.loads(data)
    except json.JSONDecodeError:
        return status, headers, data.decode()


def test_health_is_503_while_loading_then_ready_and_cors_when_asked(tmp_path: pathlib.Path) -> None:
    _, path = sh.write_model(tmp_path)
    go = threading.Event()

    def loader() -> LLM:
        go.wait(30)
        return LLM.load(path, max_context=64, chunk=8)

    app = create_app(ServerConfig(model_name="tiny", cors=["http://example.com"]), loader=loader)
    with sh.running(app) as url:
        status, headers, body = request(url + "/health")
        assert status == 503 and body["status"] == "loading"
        status, headers, body = request(url + "/v1/models")
        assert status == 503 and body["error"]["code"] == "model_loading" and headers["retry-after"] == "2"
        go.set()
        deadline = time.monotonic() + 60
        while request(url + "/health")[0] != 200:
            assert time.monotonic() < deadline, "the model never finished loading"
            time.sleep(0.1)
        preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
        status, headers, _ = request(url + "/v1/chat/completions", "OPTIONS", preflight)
        assert status == 200 and headers["access-control-allow-origin"] == "http://example.com"
        status, headers, _ = request(url + "/v1/models", headers={"Origin": "http://example.com"})
        assert status == 200 and headers["access-control-allow-origin"] == "http://example.com"
        _, headers, _ = request(url + "/v1/models", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in headers


def test_failed_load_is_reported_and_no_cors_by_default(tmp_path: pathlib.Path) -> None:
    def loader() -> LLM:
        raise FileNotFoundError("no such model file: 'missing.gguf'")

    with sh.running(create_app(ServerConfig(), loader=loader)) as url:
        time.sleep(0.2)
        status, headers, body = request(url + "/health", headers={"Origin": "http://example.com"})
        assert status == 503 and body["status"] == "error" and "missing.gguf" in body["error"]
        assert "access-control-allow-origin" not in headers
        status, _, body = request(url + "/v1/models")
        assert status == 503 and "missing.gguf" in body["error"]["message"]


def test_serve_command_binds_loopback_and_prints_the_chat_url(tmp_path: pathlib.Path) -> None:
    _, path = sh.write_model(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "xgrad_llm", "serve", "--model", str(path), "--port", str(port), "--max-context", "64"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line, line
        deadline = time.monotonic() + 120
        while True:
            try:
                if request(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        assert request(f"http://127.0.0.1:{port}/v1/models")[2]["data"][0]["id"] == path.name
        listening = [ln for ln in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:] if ln.split()[3] == "0A"]
        ours = [ln.split()[1] for ln in listening if int(ln.split()[1].split(":")[1], 16) == port]
        assert ours == ["0100007F:" + f"{port:04X}"]  # 127.0.0.1 only
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run([*cmd[:3], "serve", "--parallel", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--parallel" in bad.stderr


def test_serve_passes_penalty_and_batch_flags(tmp_path: pathlib.Path, monkeypatch: Any, capsys: Any) -> None:
    """`serve --presence-penalty P --frequency-penalty F` gives the app those defaults (what they do to a reply:
    test_server.py); a value outside OpenAI's [-2, 2] is refused in one line before anything loads."""
    import uvicorn

    from xgrad_llm.server.run import main as serve

    _, path = sh.write_model(tmp_path)
    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    assert serve(["--model", str(path), "--presence-penalty", "0.5", "--frequency-penalty", "-1.25"]) == 0
    config = apps[0].state.xgrad.config
    assert (config.presence_penalty, config.frequency_penalty) == (0.5, -1.25)
    assert serve(["--model", str(path)]) == 0
    assert (apps[1].state.xgrad.config.presence_penalty, apps[1].state.xgrad.config.frequency_penalty) == (0.0, 0.0)
    assert config.batch and apps[1].state.xgrad.config.batch  # continuous batching is the default
    assert serve(["--model", str(path), "--no-batch"]) == 0 and not apps[2].state.xgrad.config.batch
    capsys.readouterr()
    assert serve(["--model", str(path), "--frequency-penalty", "3"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--frequency-penalty must be in [-2, 2], got 3.0" in err
    assert len(apps) == 3
