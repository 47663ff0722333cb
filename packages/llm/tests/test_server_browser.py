"""The web chat in a real browser: Debian's chromium, headless, driven by Playwright. It types a message, sees the
streamed answer rendered, presses stop mid-answer (the server frees the slot), reloads and finds the conversation in
local storage, sends a short message and sees its tokens/s, and saves a screenshot. Skipped where Playwright or
chromium is missing (`.ci/run` installs chromium with apt; Playwright is a pinned test dependency)."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("uvicorn")
pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import serve_helpers as sh  # noqa: E402

from xgrad_llm.generate import LLM  # noqa: E402
from xgrad_llm.server import ServerConfig, create_app  # noqa: E402

CHROMIUM = next((p for name in ("chromium", "chromium-browser") if (p := shutil.which(name))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_chat_page_streams_stops_and_keeps_the_conversation(tmp_path: pathlib.Path) -> None:
    _, path = sh.write_model(tmp_path)
    llm = LLM.load(path, max_context=512, chunk=16)
    app = create_app(ServerConfig(model_name="tiny"), llm=llm)
    feed = llm.runner.feed
    llm.runner.feed = lambda ids: (time.sleep(0.03), feed(ids))[1]  # slow steps: a reply takes seconds to stream
    shot = pathlib.Path(os.environ.get("XGRAD_SCREENSHOTS", tmp_path)) / "xgrad-llm-chat.png"
    with sh.running(app) as url, sync_api.sync_playwright() as pw:
        engine = app.state.xgrad.engine
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(url + "/")
            page.click("#settings summary")  # open the settings
            page.fill("#set-max-tokens", "300")
            page.dispatch_event("#set-max-tokens", "change")
            page.fill("#input", "hello there")
            page.press("#input", "Enter")
            reply = page.locator(".msg.assistant .body").last
            page.wait_for_function(
                "() => document.querySelector('.msg.assistant .body')?.textContent.length > 3", timeout=180_000
            )
            assert page.is_visible("#stop") and engine.busy_slots() == 1  # streaming, not done
            streamed = reply.text_content() or ""
            page.click("#stop")
            page.wait_for_selector("#send", state="visible")
            assert "[stopped]" in (page.locator(".msg.assistant .stats").last.text_content() or "")
            deadline = time.monotonic() + 5
            while engine.busy_slots():
                assert time.monotonic() < deadline, "the stopped request kept its slot"
                time.sleep(0.05)
            kept = reply.text_content() or ""
            assert kept.startswith(streamed[:3]) and len(kept) < 300 * 4
            page.reload()
            assert page.locator("#conversations li").count() == 1
            assert page.locator("#conversations li span").first.text_content() == "hello there"
            assert page.locator(".msg.user .body").first.text_content() == "hello there"
            assert page.locator(".msg.assistant .body").last.text_content() == kept
            page.click("#settings summary")
            assert page.input_value("#set-max-tokens") == "300"  # settings survive the reload too
            page.fill("#set-max-tokens", "5")
            page.dispatch_event("#set-max-tokens", "change")
            page.fill("#input", "again")
            page.press("#input", "Enter")
            page.wait_for_function(
                "() => { const s = document.querySelectorAll('.msg.assistant .stats');"
                " return s.length === 2 && s[1].textContent.includes('tokens/s'); }",
                timeout=180_000,
            )
            assert page.locator(".msg").count() == 4 and page.is_visible("#send")
            assert "[stopped]" not in (page.locator(".msg.assistant .stats").last.text_content() or "")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
