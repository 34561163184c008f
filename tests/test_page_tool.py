"""The page at `/` as a daily tool, in headless Chromium (test_page.py's browser and live server):
markdown rendered with highlighted code and a copy button per block, model text that holds HTML
made inert by DOMPurify, conversations kept in localStorage across a reload (listed, switched,
deleted), the settings sent with each request, regenerate and edit-and-resend, the theme toggle,
plain decoding explained, and `--no-webui` turning the page off.

Answers with markdown come from a stubbed `fetch` (the tiny pair writes no markdown): the same
stream, chunks and marks as the server's, through the same code that shows real answers."""

from __future__ import annotations

import json

import httpx
import pytest

from live_server import live_server
from test_page import PAIR, _ask, _greedy_answer, _open_fresh, _screenshot, _text, _wait, browser, server

__all__ = ["browser", "server"]  # the fixtures, shared with test_page.py

ANSWER = (
    "Sure. A **generator** keeps its state between calls:\n\n"
    "```python\ndef count(start: int = 0):\n    n = start\n    while True:\n        yield n  # paused here\n"
    "        n += 1\n```\n\n"
    "| call | value |\n|---|---|\n| `next(c)` | 0 |\n| `next(c)` | 1 |\n\n"
    "Use `itertools.islice` to take a few, and see [the docs](https://docs.python.org/3/glossary.html)."
)
HOSTILE = (
    'Look: <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    ' <a href="javascript:window.pwned=3">click</a> <iframe src="/metrics"></iframe>'
    ' <b onclick="window.pwned = 4">bold</b>\n\n```html\n<script>window.pwned = 5</script>\n```\n'
)

# Answers the page's next chat request with `text` as the server would stream it (marks and stats).
STUB = """
const [text, chunkSize] = arguments;
window.realFetch = window.realFetch || window.fetch;
window.fetch = (url, init) => {
  if (!String(url).includes("chat/completions")) return window.realFetch(url, init);
  window.fetch = window.realFetch;  // one answer
  const events = [];
  for (let at = 0; at < text.length; at += chunkSize) {
    const piece = text.slice(at, at + chunkSize);
    const source = (at / chunkSize) % 3 ? "model" : "verifier";
    events.push({choices: [{delta: {content: piece}}], specgguf: {spans: [{text: piece, source}]}});
  }
  const stats = {n_tokens: 40, n_steps: 12, n_drafted: 36, n_accepted: 28, n_plain_steps: 0, acceptance_rate: 0.78,
                 tokens_per_step: 3.3, tokens_per_second: 50.0, seconds: {generation: 0.8}};
  events.push({choices: [{delta: {}, finish_reason: "stop"}], specgguf: {spans: [], stats}});
  const body = events.map((event) => "data: " + JSON.stringify(event) + "\\n\\n").join("") + "data: [DONE]\\n\\n";
  return Promise.resolve(new Response(body, {headers: {"Content-Type": "text/event-stream"}}));
};
"""
# Records each chat request's body (window.sent) and lets it through.
SPY = """
window.sent = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (String(url).includes("chat/completions")) window.sent.push(JSON.parse(init.body));
  return realFetch(url, init);
};
"""
# Content-Security-Policy reports, by the script that caused them. Chromium reports the inline handlers
# DOMPurify's own inert parse (DOMParser) meets; anything else would be model text trying to run.
WATCH_CSP = (
    "window.violations = [];"
    " document.addEventListener('securitypolicyviolation', (e) => violations.push(e.sourceFile));"
)


def _set(driver, element_id: str, value: str) -> None:
    element = driver.find_element("id", element_id)
    element.clear()
    element.send_keys(value)


def _n_answers(driver) -> int:
    return len(_text(driver, "#messages li.assistant .stats, #messages li.assistant .error"))


def _click(driver, css: str, index: int = -1) -> None:
    driver.execute_script(
        "const all = document.querySelectorAll(arguments[0]); all[all.length + arguments[1]].click()"
        if index < 0
        else "document.querySelectorAll(arguments[0])[arguments[1]].click()",
        css,
        index,
    )


def _stubbed_answer(driver, text: str, question: str) -> None:
    driver.execute_script(STUB, text, 7)
    n_answers = _n_answers(driver)
    _ask(driver, question, n_answers=n_answers + 1)


def test_markdown_is_rendered_with_highlighted_code_and_a_copy_button(server, browser):
    _open_fresh(browser, server.base_url + "/")
    _stubbed_answer(browser, ANSWER, "How do generators work?")
    assert _text(browser, "#messages li.assistant .md strong") == ["generator"]
    assert _text(browser, "#messages .md .code-bar span") == ["python"]
    assert len(_text(browser, "#messages .md .code button.copy")) == 1
    assert "yield" in _text(browser, "#messages .md .code code .hljs-keyword")
    assert _text(browser, "#messages .md td code")[0] == "next(c)"
    assert "```" not in _text(browser, "#messages li.assistant .md")[0]  # no raw markdown left
    code = _text(browser, "#messages .md .code code")[0]
    assert code.startswith("def count(start: int = 0):\n") and code.endswith("n += 1\n")
    link = browser.execute_script("const a = document.querySelector('#messages .md a'); return [a.target, a.rel]")
    assert link == ["_blank", "noopener noreferrer"]
    _click(browser, "#messages .md .code button.copy")
    _wait(browser, lambda: _text(browser, "#messages .md .code button.copy") == ["copied"], timeout=5)
    _screenshot(browser, "page-light.png")
    browser.find_element("id", "theme").click()
    assert browser.execute_script("return document.documentElement.dataset.theme") == "dark"
    background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(13, 17, 23)"  # page.css's dark --bg
    _screenshot(browser, "page-dark.png")
    browser.refresh()  # the theme is kept
    _wait(browser, lambda: _text(browser, "#messages li.assistant .md strong") == ["generator"])
    assert browser.execute_script("return document.documentElement.dataset.theme") == "dark"
    browser.find_element("id", "theme").click()
    assert browser.execute_script("return getComputedStyle(document.body).backgroundColor") == "rgb(253, 253, 252)"


def test_html_in_model_output_is_inert_streamed_and_after_a_reload(server, browser):
    _open_fresh(browser, server.base_url + "/")
    browser.execute_script(WATCH_CSP)
    _stubbed_answer(browser, HOSTILE, "say something nasty")
    for reloaded in (False, True):
        if reloaded:
            browser.refresh()
            browser.execute_script(WATCH_CSP)
            _wait(browser, lambda: len(_text(browser, "#messages li.assistant .md")) == 1)
        found = browser.execute_script(
            "const m = document.getElementById('messages');"
            "return [m.querySelectorAll('script, iframe, img, [onerror], [onclick], a[href^=\"javascript\"]').length,"
            " window.pwned === undefined, window.violations.filter((file) => !file.endsWith('/purify.min.js'))]"
        )
        assert found == [0, True, []], found  # removed by DOMPurify: nothing left for the CSP to block
        assert _text(browser, "#messages .md b") == ["bold"]
        assert "<script>window.pwned = 5</script>" in _text(browser, "#messages .md .code code")[0]  # code is text
    raw = _text(browser, "#messages li.assistant .text")[0]
    assert raw == HOSTILE  # the drafts view: the same text, as text


def test_conversations_survive_a_reload_and_are_listed_switched_and_deleted(server, browser):
    _open_fresh(browser, server.base_url + "/")
    _set(browser, "temperature", "0")
    _ask(browser, "hello the cat", n_answers=1)
    first = _text(browser, "#messages li .text")
    browser.refresh()
    _wait(browser, lambda: _text(browser, "#messages li .text") == first)
    assert _text(browser, "#conversations .open") == ["hello the cat"]
    assert browser.find_element("id", "temperature").get_attribute("value") == "0"  # settings kept too
    browser.find_element("id", "new-chat").click()
    assert _text(browser, "#messages li") == []
    _ask(browser, "the dog", n_answers=1)
    assert _text(browser, "#conversations .open") == ["the dog", "hello the cat"]  # newest first
    _click(browser, "#conversations .open", 1)
    _wait(browser, lambda: _text(browser, "#messages li .text") == first)
    assert _text(browser, "#conversations li.current .open") == ["hello the cat"]
    _click(browser, "#conversations [data-action=delete]", 0)  # "the dog", not the one shown
    assert _text(browser, "#conversations .open") == ["hello the cat"]
    assert _text(browser, "#messages li .text") == first
    _click(browser, "#conversations [data-action=delete]", 0)  # the one shown: an empty chat takes its place
    assert _text(browser, "#conversations .open") == [] and _text(browser, "#messages li") == []
    browser.refresh()
    _wait(browser, lambda: "verifier" in _text(browser, "#model")[0])
    assert _text(browser, "#conversations .open") == [] and _text(browser, "#messages li") == []
    stored = [{"id": "bad", "messages": [{"role": "user", "content": 5}]}, "junk", {"id": "x", "messages": {}}]
    stored.append({"id": "ok", "title": "kept", "messages": [{"role": "assistant", "content": "*hi*", "pieces": 7}]})
    browser.execute_script("localStorage.setItem('specgguf-conversations', arguments[0])", json.dumps(stored))
    browser.refresh()  # what is stored is checked, not trusted: the well-formed one is listed
    _wait(browser, lambda: _text(browser, "#conversations .open") == ["kept"])
    _click(browser, "#conversations .open", 0)
    assert _text(browser, "#messages .md em") == ["hi"] and _text(browser, "#messages li .text") == ["*hi*"]


def test_the_settings_are_sent_with_each_request(server, browser):
    _open_fresh(browser, server.base_url + "/")
    system = "You answer in few words."
    for element_id, value in (("system", system), ("temperature", "0"), ("top-p", "0.9"), ("max-tokens", "5")):
        _set(browser, element_id, value)
    browser.execute_script(SPY)
    _ask(browser, "hello the cat", n_answers=1)
    sent = browser.execute_script("return window.sent")
    assert len(sent) == 1
    assert sent[0]["messages"] == [{"role": "system", "content": system}, {"role": "user", "content": "hello the cat"}]
    assert (sent[0]["temperature"], sent[0]["top_p"], sent[0]["max_tokens"]) == (0, 0.9, 5)
    stats = _text(browser, "#messages li.assistant .stats")[0]
    assert stats.startswith("5 tokens in ") and stats.endswith("cut at max tokens"), stats
    with server.http() as http:  # the server answered exactly that request
        body = {"messages": sent[0]["messages"], "temperature": 0, "max_tokens": 5}
        expected = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert _text(browser, "#messages li.assistant .text")[0] == expected


def test_regenerate_replaces_the_answer_and_edit_resends_the_question(server, browser):
    _open_fresh(browser, server.base_url + "/")
    _set(browser, "temperature", "1.5")  # T > 0: a fresh seed per request, a new answer
    _set(browser, "max-tokens", "16")
    browser.execute_script(SPY)
    _ask(browser, "hello the cat", n_answers=1)
    answers = [_text(browser, "#messages li.assistant .text")[0]]
    for _ in range(3):  # three tries: a 16-token answer at T = 1.5 repeating itself thrice is not plausible
        _click(browser, "#messages li.assistant [data-action=regenerate]")
        _wait(
            browser,
            lambda: (
                not browser.execute_script("return document.body.classList.contains('busy')")
                and _n_answers(browser) == 1
            ),
        )
        answers.append(_text(browser, "#messages li.assistant .text")[0])
        if answers[-1] != answers[0]:
            break
    assert answers[-1] != answers[0], answers
    sent = browser.execute_script("return window.sent")
    assert len(sent) == len(answers) and all(body["messages"] == sent[0]["messages"] for body in sent)
    assert len(_text(browser, "#messages li")) == 2  # replaced, not added
    _set(browser, "temperature", "0")
    _click(browser, "#messages li.user [data-action=edit]")
    editor = browser.find_element("css selector", "#messages li.user textarea.editor")
    editor.clear()
    editor.send_keys("hello the dog")
    _click(browser, "#messages li.user [data-action=resend]")
    _wait(
        browser,
        lambda: (
            len(browser.execute_script("return window.sent")) == len(answers) + 1
            and _n_answers(browser) == 1
            and not browser.execute_script("return document.body.classList.contains('busy')")
        ),
    )
    assert _text(browser, "#messages li.user .text") == ["hello the dog"]
    last = browser.execute_script("return window.sent")[-1]
    assert last["messages"] == [{"role": "user", "content": "hello the dog"}]
    expected = _greedy_answer(server, [{"role": "user", "content": "hello the dog"}])
    assert expected.startswith(_text(browser, "#messages li.assistant .text")[0])  # cut at 16 tokens


def test_plain_decoding_is_shown_with_why(server, browser):
    """A request the server decodes plain (here: asked for K = 0) says so, and why, under the answer."""
    _open_fresh(browser, server.base_url + "/")
    browser.execute_script(
        "const realFetch = window.fetch; window.fetch = (url, init) => {"
        " if (String(url).includes('chat/completions')) {"
        "  const body = JSON.parse(init.body); body.speculative.k = 0; init = {...init, body: JSON.stringify(body)}; }"
        " return realFetch(url, init); };"
    )
    _set(browser, "temperature", "0")
    _ask(browser, "hello the cat", n_answers=1)
    stats = _text(browser, "#messages li.assistant .stats")[0]
    assert "plain decoding (the server drafted in none of its 24 steps: its K policy drafts only where" in stats
    assert "1.00 tokens/step" in stats
    _screenshot(browser, "page-plain.png")


def test_no_webui_turns_the_page_off_and_leaves_the_apis(tiny_verifier, tiny_draft):
    with (
        live_server("-m", tiny_verifier, "-md", tiny_draft, *PAIR, "--no-webui") as off,
        httpx.Client(base_url=off.base_url) as http,
    ):
        for path in ("/", "/page/page.js", "/page/vendor/purify.min.js"):
            assert http.get(path).status_code == 404, path
        assert http.get("/v1/models").json()["data"][0]["object"] == "model"
        assert http.get("/health").status_code == 200
        answer = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "path",
    [
        "/page/vendor/marked.min.js",
        "/page/vendor/purify.min.js",
        "/page/vendor/highlight.min.js",
        "/page/store.js",
        "/page/render.js",
    ],
)
def test_the_vendored_scripts_are_served_under_the_policy(server, path):
    with httpx.Client(base_url=server.base_url) as http:
        reply = http.get(path)
    assert reply.status_code == 200 and reply.headers["content-type"] == "text/javascript; charset=utf-8"
    assert "script-src 'self'" in reply.headers["content-security-policy"]
