"""The person waiting sees the swap, in a real browser (docs/operations.md, "Load progress"): a
chat page that streams with the openai SDK for JavaScript (from npm, imported by the page as
it is) shows the progress lines swapgate sends as ``reasoning_content`` while a swap runs, then
the answer. nginx serves the page and the SDK and proxies ``/v1`` to swapgate: one origin, as a
chat UI's own server would be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from bench.procs import NGINX_MAIN
from swapgate.drivers.children import die_with_parent
from testbed.engines import ensure_openai_js
from tests.e2e.processes import free_port, gateway, instance, simulator, wait_until_serving

pytestmark = pytest.mark.e2e
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PAGE = """<!doctype html>
<meta charset="utf-8"><title>chat</title>
<pre id="thinking"></pre><p id="answer"></p><p id="error"></p>
<script type="module">
import OpenAI from "/sdk/index.mjs";
const client = new OpenAI({
  baseURL: location.origin + "/v1", apiKey: "unused", dangerouslyAllowBrowser: true,
  defaultHeaders: {"x-swapgate-progress": "reasoning"},
});
try {
  const stream = await client.chat.completions.create({
    model: "a", stream: true, max_tokens: 8, messages: [{role: "user", content: "Hi."}],
  });
  for await (const chunk of stream) {
    const delta = chunk.choices[0] ? chunk.choices[0].delta : {};
    if (delta.reasoning_content) {
      document.getElementById("thinking").textContent += delta.reasoning_content;
    }
    if (delta.content) document.getElementById("answer").textContent += delta.content;
  }
} catch (error) {
  document.getElementById("error").textContent = String(error);
}
</script>
"""
SERVER = """
  server {{
    listen 127.0.0.1:{port};
    location = / {{ root {page}; try_files /chat.html =404; }}
    location /sdk/ {{ alias {sdk}/; types {{ text/javascript mjs js; }} }}
    location /v1/ {{
      proxy_pass {gateway};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
"""


@contextmanager
def chat_site(gateway_url: str) -> Iterator[str]:
    sdk = ensure_openai_js()
    port = free_port()
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "chat.html").write_text(PAGE)
        server = SERVER.format(port=port, page=root, sdk=sdk, gateway=gateway_url)
        config = Path(root) / "nginx.conf"
        # Its workers read the page and the SDK where they lie (a folder of root's, 0700)
        user = "user root;\n" if os.geteuid() == 0 else ""
        config.write_text(user + NGINX_MAIN.format(root=root, servers=server))
        process = subprocess.Popen(
            [NGINX, "-c", str(config), "-p", root], preexec_fn=die_with_parent
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(f"{url}/", process)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_a_chat_page_shows_the_load_progress_while_the_swap_runs(browser: WebDriver) -> None:
    with simulator(models=("a", "b"), load_time=4.0) as sim:
        config = {
            "routing": {"expected_swap": "4s"},
            "keepalive": {"early_headers_after": "200ms"},
            "instances": [instance("gpu", sim, capacity=1)],
        }
        with gateway(config) as gw, chat_site(gw.url) as site:
            browser.get(site + "/")
            shown: list[str] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                thinking = browser.find_element(By.ID, "thinking").text
                answer = browser.find_element(By.ID, "answer").text
                error = browser.find_element(By.ID, "error").text
                assert not error, error
                if thinking and not answer and thinking not in shown:
                    shown.append(thinking)
                if answer:
                    break
                time.sleep(0.2)
    print(f"\nthe page showed, while it waited: {shown}")
    assert answer, "the answer came"
    assert len(shown) >= 2, f"the lines grew while the swap ran: {shown}"
    assert "Loading a on gpu" in shown[0]
    assert "s left" in shown[-1], shown
    assert "a answers after" in browser.find_element(By.ID, "thinking").text
