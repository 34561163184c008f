"""The page at `/` (serve/page/) in a real browser: Debian's Chromium, driven by selenium through
Debian's chromedriver, against a live `specgguf serve` of the tiny pair. It loads the page, sends a
message, and sees the answer appear with the accepted drafts coloured, the step statistics and the
/metrics panel; with `--api-key` it asks for the key and then works. The daily tool: answers rendered as
markdown (code highlighted, a copy button per block) with model text sanitised (a `<script>` or an
`<img onerror>` in an answer is inert), conversations kept in localStorage across a reload, listed,
switched and deleted, settings (system prompt, temperature, top-p, max tokens) sent with each request,
regenerate and edit-and-resend, the theme toggle, plain decoding explained, and `--no-webui`. Also the
stream marks the page reads (`speculative.mark_drafts`) through plain HTTP.

SPECGGUF_PAGE_SCREENSHOTS=docs/screenshots keeps pictures of the page (the ones in docs/ were made so).

Where the browser is missing the browser tests skip, saying how to install it, except in CI
(CI=true), where they fail: `make browser` (called by .ci/run) installs it there."""

from __future__ import annotations

import json
import os
import re
import shutil

import httpx
import pytest

from live_server import live_server
from openai_schema import assert_conforms

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
PAIR = ["-c", "512", "-t", "1", "-n", "24", "-k", "3", "--drafter", "model"]
GREEN = "rgb(26, 127, 55)"  # page.css --model, the terminal's green
STATS = re.compile(
    r"^\d+ tokens in [\d.]+ s · [\d.]+ tok/s · acceptance \d+% \(\d+/\d+\) · [\d.]+ tokens/step · prompt \d+ tokens"
)
KEY = "page-s3cret"


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    with live_server("-m", tiny_verifier, "-md", tiny_draft, *PAIR) as live:
        yield live


def _need_browser() -> None:
    missing = []
    if CHROMIUM is None or CHROMEDRIVER is None:
        missing.append("Debian's chromium and chromium-driver (`make browser` installs them)")
    try:
        import selenium  # noqa: F401 - only whether it is there
    except ImportError:
        missing.append("selenium (in the test extra: `make install`)")
    if missing:
        reason = f"the page's browser test needs {' and '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI must run it: .ci/run calls `make browser`)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # Debian's; selenium downloads nothing when both paths are given
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(argument)  # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _open_fresh(driver, url: str) -> None:
    """The page with nothing kept from an earlier test (conversations, settings, theme)."""
    driver.get(url)
    driver.execute_script("localStorage.clear()")
    driver.refresh()
    _wait(driver, lambda: "verifier" in _text(driver, "#model")[0])


def _wait(driver, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda _: condition())


def _text(driver, css: str) -> list[str]:
    """textContent of each element matching `css` (what the page put there, not how it wraps)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((element) => element.textContent)", css
    )


def _ask(driver, message: str, *, n_answers: int) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "prompt").send_keys(message)
    driver.find_element(By.ID, "send").click()
    _wait(
        driver, lambda: len(_text(driver, "#messages li.assistant .stats, #messages li.assistant .error")) >= n_answers
    )


def _last_answer(driver) -> tuple[str, list[tuple[str, str]]]:
    """The last answer's text, and its pieces as (writer, text)."""
    pieces = driver.execute_script(
        "const answers = document.querySelectorAll('#messages li.assistant .text');"
        "return [...answers[answers.length - 1].childNodes].map("
        "  (node) => [node.dataset ? node.dataset.writer : 'plain', node.textContent])"
    )
    return "".join(text for _, text in pieces), [tuple(piece) for piece in pieces]


def _greedy_answer(server, messages: list[dict], **headers) -> str:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"messages": messages, "temperature": 0}, headers=headers)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def _figures(driver) -> dict[str, str]:
    terms, details = _text(driver, "#figures dt"), _text(driver, "#figures dd")
    return dict(zip(terms, details))


def _screenshot(driver, name: str) -> None:
    """SPECGGUF_PAGE_SCREENSHOTS=folder keeps a picture of the page, to look at."""
    if folder := os.environ.get("SPECGGUF_PAGE_SCREENSHOTS"):
        driver.save_screenshot(os.path.join(folder, name))


def test_the_page_and_its_files_are_served_with_a_strict_policy_and_nothing_else_of_the_folder(server):
    with httpx.Client(base_url=server.base_url) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert '<script src="page/page.js">' in page.text
        assert http.get("/page/page.js").headers["content-type"] == "text/javascript; charset=utf-8"
        assert http.get("/page/page.css").headers["content-type"] == "text/css; charset=utf-8"
        assert http.get("/?content=<b>x</b>").content == page.content  # no parameter reaches the answer
        for other in ("/page/routes.py", "/page/__init__.py", "/page/", "/index.html"):
            assert http.get(other).status_code == 404, other


def test_stream_marks_split_each_chunk_by_writer_and_end_with_the_stats(server):
    """What the page reads: spans that spell each chunk's text, drafts and verifier both, and the
    whole stats on the last chunk; OpenAI's schema still holds, and a stream not asking has none."""
    body = {"messages": [{"role": "user", "content": "hello the cat"}], "temperature": 0, "stream": True}
    with server.http() as http:
        with http.stream("POST", "/v1/chat/completions", json={**body, "speculative": {"mark_drafts": True}}) as reply:
            chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
        with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            plain = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
        refused = http.post(
            "/v1/chat/completions", json={**body, "stream": False, "speculative": {"mark_drafts": True}}
        )
        text_body = {"prompt": "the cat was", "temperature": 0, "stream": True, "speculative": {"mark_drafts": True}}
        with http.stream("POST", "/v1/completions", json=text_body) as reply:
            text_chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    for chunk in chunks:
        assert_conforms(chunk, "CreateChatCompletionStreamResponse")
    first, running, last = chunks[0], chunks[1:-1], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["specgguf"] == {"spans": []}
    for chunk in running:
        spans = chunk["specgguf"]["spans"]
        assert "".join(span["text"] for span in spans) == chunk["choices"][0]["delta"]["content"]
    writers = {span["source"] for chunk in running for span in chunk["specgguf"]["spans"]}
    assert writers == {"model", "verifier"}  # -k 3 --drafter model: the tiny draft mostly agrees, not always
    stats = last["specgguf"]["stats"]
    assert stats["n_accepted"] == last["timings"]["draft_n_accepted"] > 0 and stats["n_tokens"] == 24
    n_verifier_runs = sum(span["source"] == "verifier" for chunk in running for span in chunk["specgguf"]["spans"])
    assert n_verifier_runs <= stats["n_steps"]  # one verifier token per step at most
    assert not any("specgguf" in chunk for chunk in plain)
    plain_text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in plain if chunk["choices"])
    assert plain_text == "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "speculative.mark_drafts"
    for chunk in text_chunks[:-1]:  # text completions too (the first, empty, has empty spans)
        assert "".join(span["text"] for span in chunk["specgguf"]["spans"]) == chunk["choices"][0]["text"]
    assert text_chunks[-1]["specgguf"]["stats"]["n_tokens"] == 24


def test_a_chat_in_the_browser_streams_coloured_drafts_stats_and_metrics(server, browser):
    _open_fresh(browser, server.base_url + "/")
    browser.find_element("id", "temperature").send_keys("0")
    question = "<b>hello</b> the cat"  # shown as typed: text, never markup
    _ask(browser, question, n_answers=1)
    text, pieces = _last_answer(browser)
    assert text == _greedy_answer(server, [{"role": "user", "content": question}])  # the verifier's answer
    writers = {writer for writer, _ in pieces}
    assert writers == {"model", "verifier"}, pieces
    colours = browser.execute_script(
        "return ['model', 'verifier'].map((w) => getComputedStyle("
        "  document.querySelector(`#messages .text span[data-writer=${w}]`)).color)"
    )
    assert colours[0] == GREEN and colours[1] != GREEN
    assert _text(browser, "#messages li.user .text") == [question]
    assert browser.execute_script("return document.querySelectorAll('#messages b').length") == 0
    stats = _text(browser, "#messages li.assistant .stats")[0]
    assert STATS.match(stats), stats
    # /metrics at a glance: fetched again after the answer, it counts that answer's tokens too.
    generated = str(int(server.metric("specgguf_tokens_generated_total")))
    _wait(browser, lambda: _figures(browser).get("tokens generated") == generated)
    figures = _figures(browser)
    assert figures["draft acceptance"].endswith("%") and figures["mean tok/s"] != "–"
    # A second turn carries the conversation: the same answer as the API gives for it.
    _ask(browser, "and the dog?", n_answers=2)
    conversation = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "and the dog?"},
    ]
    assert _last_answer(browser)[0] == _greedy_answer(server, conversation)
    browser.find_element("id", "drafts").click()  # the raw text, coloured by writer, instead of markdown
    assert browser.execute_script("return getComputedStyle(document.querySelector('#messages .md')).display") == "none"
    _screenshot(browser, "page-drafts.png")
    browser.find_element("id", "drafts").click()


def test_with_an_api_key_the_page_asks_for_it_and_then_answers(tiny_verifier, tiny_draft, browser):
    from selenium.webdriver.common.by import By

    with live_server("-m", tiny_verifier, "-md", tiny_draft, *PAIR, api_key=KEY) as server:
        browser.get(f"http://localhost:{server.port}/")  # a name, not the address: the Host guard lets it by
        browser.execute_script("localStorage.clear()")
        browser.refresh()
        _wait(browser, lambda: "API key" in _text(browser, "#notice")[0])
        assert "missing or wrong API key" in _text(browser, "#metrics-note")[0]
        # Typing elsewhere while the refused page load comes back keeps the cursor where it is (it once
        # moved to the key field between a click and the keys, and "0" went into the key).
        browser.find_element(By.ID, "temperature").click()
        browser.execute_async_script("loadModel().then(arguments[0])")
        assert browser.execute_script("return document.activeElement.id") == "temperature"
        browser.find_element(By.ID, "temperature").send_keys("0")
        for key, n_answers in (("wrong", 1), (KEY, 2)):
            browser.find_element(By.ID, "key").send_keys(key)
            browser.find_element(By.ID, "key-form").submit()
            _ask(browser, "hello the cat", n_answers=n_answers)
        assert "missing or wrong API key" in _text(browser, "#messages li.assistant .error")[0]
        text, pieces = _last_answer(browser)
        assert text and text == _greedy_answer(server, [{"role": "user", "content": "hello the cat"}])
        assert {writer for writer, _ in pieces} == {"model", "verifier"}
        assert STATS.match(_text(browser, "#messages li.assistant .stats")[0])
        assert "verifier" in _text(browser, "#model")[0]
        _wait(browser, lambda: int(_figures(browser).get("requests", "0")) > 0)
