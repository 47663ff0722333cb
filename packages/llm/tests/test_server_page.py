"""The web chat page: its files ship in the package and load nothing from the internet; its markdown renderer
(run with node where it is installed) escapes every character of the reply and highlights code."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

import xgrad_llm.server.app as server_app

STATIC = pathlib.Path(server_app.__file__).parent / "static"


def test_page_files_reference_only_the_package() -> None:
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all((STATIC / r.removeprefix("static/")).is_file() for r in refs), refs
    for f in STATIC.iterdir():
        text = f.read_text()
        assert not re.search(r'(?:src|href)\s*=\s*["\']?(?:https?:)?//', text), f.name
        assert not re.search(r"(?:url\(|import\s+|fetch\()\s*[\"']?(?:https?:)?//", text), f.name


def render(markdown: str) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the renderer runs in the browser; node runs it here)")
    script = f"process.stdout.write(require({json.dumps(str(STATIC / 'markdown.js'))}).render({json.dumps(markdown)}))"
    return subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60).stdout


def test_markdown_escapes_html_and_only_links_http() -> None:
    html = render('<img src=x onerror=alert(1)> **b** [x](javascript:alert(1)) [ok](https://e.org/?a="b")\n')
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<strong>b</strong>" in html and "javascript:" in html and 'href="javascript' not in html
    assert '<a href="https://e.org/?a=&quot;b&quot;"' in html


def test_markdown_blocks_and_highlighted_code() -> None:
    md = "# T\n- a\n- b\n\n1. x\n\n| h | i |\n|---|---|\n| 1 | 2 |\n\n> q\n\n"
    md += "```python\ndef f():  # c\n    return 'a<b' + 1\n```\n"
    html = render(md)
    for part in (
        "<h1>T</h1>",
        "<ul><li>a</li><li>b</li></ul>",
        "<ol><li>x</li></ol>",
        "<th>h</th>",
        "<td>2</td>",
        "<blockquote><p>q</p></blockquote>",
        '<span class="tok-kw">def</span>',
        '<span class="tok-com"># c</span>',
        '<span class="tok-str">&#39;a&lt;b&#39;</span>',
        '<span class="tok-num">1</span>',
    ):
        assert part in html, part
    streaming = render("text\n```js\nlet x = 1")  # a fence not closed yet: already a code block
    assert '<pre><span class="lang">js</span><code><span class="tok-kw">let</span>' in streaming
