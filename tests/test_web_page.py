"""The chat page at GET /: served with the package's files (or not, with web=False), open without
the API key, and end to end in headless Chromium (Debian's package, driven by Playwright) with the
demo model: a streamed reply and its thinking block, the thinking toggle, the token hash against
the API's, replay, regenerate, the conversation after a reload, and a server with an API key.

`make test` installs chromium with apt-get where it can (`make browser`); without it the browser
tests are skipped. TENSORFOLD_SCREENSHOT=docs/chat.png saves the page as the README shows it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from server_harness import make_engine, metric, start_server, wait_for

from tensorfold.demo import demo_checkpoint
from tensorfold.server.serving import SamplingDefaults
from tensorfold.util import token_sha

ROOT = Path(__file__).resolve().parents[1]
KEY = "page-test-key"
STORE = "tensorfold.chat.v1"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


# -- the route, without a browser --------------------------------------------------------------


def test_the_page_and_its_files_are_served_with_a_strict_policy(live):
    with live.client() as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        for src in re.findall(r'(?:src|href)="(/web/[^"]+)"', page.text):
            asset = http.get(src)
            assert asset.status_code == 200 and asset.content, src
        assert "javascript" in http.get("/web/app.js").headers["content-type"]
        assert 'rel="icon" href="/web/favicon.svg"' in page.text  # a tab icon of its own
        assert http.get("/web/favicon.svg").headers["content-type"] == "image/svg+xml"
        assert http.get("/web/../api.py").status_code == 404
        assert http.get("/web/missing.js").status_code == 404


def test_no_web_serves_the_api_alone(hf_tiny):
    server = start_server(make_engine(hf_tiny, parallel=1), web=False)
    try:
        assert httpx.get(server.url + "/", timeout=10).status_code == 404
        assert httpx.get(server.url + "/web/app.js", timeout=10).status_code == 404
        assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 200
    finally:
        server.stop()


def test_the_serve_command_has_a_no_web_flag():
    import argparse

    from tensorfold.server.cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).web is True
    assert parser.parse_args(["serve", "--no-web"]).web is False


# -- in Chromium --------------------------------------------------------------------------------


def chromium() -> str | None:
    for name in (os.environ.get("TENSORFOLD_CHROMIUM"), "chromium", "chromium-browser"):
        found = name and shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (the test extra has it)"
    )
    exe = chromium()
    if exe is None:
        pytest.skip(
            "no chromium: `make test` installs Debian's chromium with apt-get when run "
            "as root (make browser); elsewhere install it or set TENSORFOLD_CHROMIUM"
        )
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=exe,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 860},
        )
        sync_api.expect.set_options(timeout=30_000)
        yield context
        context.close()


def demo_server(**app_kwargs):
    path = demo_checkpoint()
    engine = make_engine(path, parallel=2, context=1024, chunk=64, prompt_cache_bytes=16 << 20)
    return start_server(
        engine, "tensorfold-demo", defaults=SamplingDefaults.from_checkpoint(path), **app_kwargs
    )


@pytest.fixture(scope="module")
def demo():
    server = demo_server()
    yield server
    server.stop()


def open_page(browser, server):
    """A tab on the server's page with nothing kept from an earlier test (same origin, same
    localStorage), once the page has the model's name."""
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(server.url + "/")
    page.evaluate("localStorage.clear()")
    page.reload()
    expect(page.locator("#model")).to_contain_text(server.name)
    return page


def reply(page, n: int):
    return page.locator(".msg.assistant").nth(n)


def ask(page, text: str, n: int) -> str:
    """Sends a prompt and waits for reply n's token hash; returns it."""
    from playwright.sync_api import expect

    page.fill("#prompt", text)
    page.click("#send")
    sha = reply(page, n).locator('[data-stat="sha"]')
    expect(sha).to_have_attribute("data-sha", re.compile("^[0-9a-f]{64}$"))
    return sha.get_attribute("data-sha")


WATCH_STREAM = """() => {
  window.seenLengths = new Set();
  new MutationObserver(() => {
    const last = [...document.querySelectorAll('.msg.assistant')].at(-1);
    if (last) window.seenLengths.add(last.querySelector('.thinking-text').textContent.length +
                                     last.querySelector('.answer').textContent.length);
  }).observe(document.getElementById('messages'),
             {subtree: true, childList: true, characterData: true});
}"""


def api_sha(server, request: dict) -> str:
    """The same request sent to the API without streaming: the hash of the ids it returns."""
    body = {**request, "stream": False}
    body.pop("stream_options", None)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 200, r.text
    return token_sha(r.json()["choices"][0]["token_ids"])


def test_chat_streams_thinks_hashes_replays_and_keeps_the_conversation(browser, demo):
    from playwright.sync_api import expect

    page = open_page(browser, demo)
    expect(page.locator("#thinking")).to_be_checked()
    expect(page.locator("#context")).not_to_be_checked()  # the demo model answers one question
    page.evaluate(WATCH_STREAM)

    sha = ask(page, "What is 17 × 23?", 0)
    first = reply(page, 0)
    assert page.evaluate("window.seenLengths.size") >= 2  # shown while it streamed
    expect(first.locator(".thinking")).to_be_visible()
    expect(first.locator(".thinking-text")).to_contain_text("17 × 20")
    expect(first.locator(".answer")).to_have_text("391")
    expect(first.locator('[data-stat="tok_s"]')).to_have_text(re.compile(r"^[\d.]+ tok/s$"))
    expect(first.locator('[data-stat="ttft"]')).to_have_text(re.compile(r"^TTFT \d+ ms$"))
    expect(first.locator('[data-stat="cached"]')).to_have_text(re.compile(r"^cached \d+$"))
    expect(first.locator('[data-stat="fingerprint"]')).to_have_text("fp –")  # none: a bare server
    stored = page.evaluate(f"JSON.parse(localStorage.getItem('{STORE}'))")
    assert api_sha(demo, stored[1]["request"]) == sha  # the page's hash is the API's

    first.locator(".replay").click()
    expect(first.locator(".replay-result")).to_have_text("match")

    page.uncheck("#thinking")
    second_sha = ask(page, "What is the capital of Japan?", 1)
    second = reply(page, 1)
    expect(second.locator(".answer")).to_have_text("Tokyo")
    expect(second.locator(".thinking")).to_be_hidden()
    stored = page.evaluate(f"JSON.parse(localStorage.getItem('{STORE}'))")
    assert stored[3]["request"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert stored[3]["request"]["messages"] == [
        {"role": "user", "content": "What is the capital of Japan?"}
    ]

    page.click("#regenerate")  # a new seed; the demo model is greedy: same tokens
    expect(page.locator(".msg.assistant")).to_have_count(2)
    expect(reply(page, 1).locator('[data-stat="sha"]')).to_have_attribute("data-sha", second_sha)
    expect(reply(page, 1).locator(".answer")).to_have_text("Tokyo")

    page.reload()
    expect(page.locator(".msg")).to_have_count(4)
    expect(reply(page, 0).locator('[data-stat="sha"]')).to_have_attribute("data-sha", sha)
    expect(reply(page, 0).locator(".replay-result")).to_have_text("match")
    expect(page.locator("#thinking")).not_to_be_checked()  # the settings stay too
    screenshot(page)
    page.close()


def screenshot(page) -> None:
    """docs/chat.png for the README, only when asked (CI leaves the tree alone)."""
    target = os.environ.get("TENSORFOLD_SCREENSHOT")
    if not target:
        return
    reply(page, 0).locator(".thinking summary").click()
    page.locator("#prompt").fill("Reverse the word planet.")
    page.set_viewport_size({"width": 1200, "height": 640})
    path = Path(target) if Path(target).is_absolute() else ROOT / target
    page.screenshot(path=str(path))


def test_a_server_with_a_key_asks_for_it_once(browser):
    from playwright.sync_api import expect

    keyed = demo_server(api_key=KEY)
    try:
        page = browser.new_page()
        page.goto(keyed.url + "/")
        expect(page.locator("#key-dialog")).to_be_visible()
        page.fill("#key-input", "not-the-key")
        page.click("#key-save")
        expect(page.locator("#key-error")).to_be_visible()  # refused: asked again
        page.fill("#key-input", KEY)
        page.click("#key-save")
        expect(page.locator("#model")).to_contain_text("tensorfold-demo")
        expect(page.locator("#key-dialog")).to_be_hidden()
        page.uncheck("#thinking")
        sha = ask(page, "What is the capital of France?", 0)
        expect(reply(page, 0).locator(".answer")).to_have_text("Paris")
        page.check("#context")
        ask(page, "Reverse the word planet.", 1)
        expect(page.locator("#key-dialog")).to_be_hidden()  # asked once, not per request
        stored = page.evaluate(f"JSON.parse(localStorage.getItem('{STORE}'))")
        roles = [m["role"] for m in stored[3]["request"]["messages"]]
        assert roles == ["user", "assistant", "user"]  # the earlier turn went too
        assert api_sha(keyed, stored[1]["request"]) == sha
        page.close()
    finally:
        keyed.stop()


def held_after(engine, steps: int) -> threading.Event:
    """Holds the engine's loop after `steps` passes until the returned event is set, so a reply
    cannot run to its end before the page acts, however slow the machine."""
    release, real, done = threading.Event(), engine.step, [0]

    def step():
        done[0] += 1
        if done[0] > steps:
            release.wait(60)
        return real()

    engine.step = step  # the instance's attribute: the serving loop calls engine.step()
    return release


def test_stop_ends_a_reply_and_frees_its_lane(browser, live):
    from playwright.sync_api import expect

    release = held_after(live.engine, 8)  # the prompt's passes and a few tokens, then held
    try:
        page = open_page(browser, live)
        page.uncheck("#thinking")
        page.fill("#max-tokens", "480")  # the tiny random model runs on to the limit
        page.fill("#seed", "11")  # a sampled end of text within the held passes would end it early
        page.fill("#prompt", "Say something long.")
        page.click("#send")
        expect(page.locator("#stop")).to_be_visible()
        expect(reply(page, 0).locator(".answer")).not_to_be_empty()
        page.click("#stop")
    finally:
        release.set()
        del live.engine.step  # the class's method again
    expect(reply(page, 0).locator(".error")).to_have_text("(stopped)")
    expect(page.locator("#send")).to_be_visible()
    tokens = reply(page, 0).locator('[data-stat="tokens"]').text_content()
    assert int(tokens.split()[0]) < 480
    wait_for(
        lambda: metric(live.metrics(), "tensorfold_requests_total", outcome="cancelled"),
        "the stopped request to be cancelled",
    )
    page.close()


def canned_stream(*deltas: dict, fingerprint: str = "fp_canned") -> str:
    """An SSE body as an OpenAI-style server would send it, one chunk per delta."""
    import json

    chunks = [
        {"choices": [{"index": 0, "delta": d, "token_ids": [i]}], "system_fingerprint": fingerprint}
        for i, d in enumerate(deltas)
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": len(deltas),
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        }
    )
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_reasoning_fields_json_replies_and_tool_calls_are_rendered(browser, live):
    """Replies the tiny model cannot give, from a canned stream: a reasoning_content field, a
    JSON reply, Qwen's <tool_call> block and the API's tool_calls, a system_fingerprint."""
    from playwright.sync_api import expect

    bodies = [
        canned_stream(
            {"reasoning_content": "The user wants JSON."},
            {"content": '{"city": '},
            {"content": '"Paris", "rank": 1}'},
        ),
        canned_stream(
            {"content": "<tool_call>\n<function=get_weather>\n<parameter=city>\n"},
            {"content": "Paris\n</parameter>\n</function>\n</tool_call>"},
            {
                "tool_calls": [
                    {"index": 0, "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}
                ]
            },
        ),
    ]
    page = open_page(browser, live)
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, content_type="text/event-stream", body=bodies.pop(0)
        ),
    )
    ask(page, "JSON please", 0)
    first = reply(page, 0)
    expect(first.locator(".thinking-text")).to_have_text("The user wants JSON.")
    expect(first.locator(".answer pre.code.json")).to_have_text(
        '{\n  "city": "Paris",\n  "rank": 1\n}'
    )
    expect(first.locator('[data-stat="fingerprint"]')).to_have_text(
        "fp_canned"
    )  # once, not "fp fp_"
    expect(first.locator('[data-stat="cached"]')).to_have_text("cached 3")
    page.uncheck("#thinking")  # else text before a </think> is the thinking trace
    ask(page, "The weather?", 1)
    tools = reply(page, 1).locator(".tool-call")
    expect(tools).to_have_count(2)
    expect(tools.nth(0).locator(".tool-name")).to_have_text("tool call: get_time")
    expect(tools.nth(0).locator("pre")).to_have_text('{\n  "tz": "CET"\n}')
    expect(tools.nth(1).locator(".tool-name")).to_have_text("tool call: get_weather")
    expect(tools.nth(1).locator("pre")).to_have_text('{\n  "city": "Paris"\n}')
    expect(reply(page, 1).locator(".answer")).to_have_text("")
    page.close()


def test_a_reply_that_ends_while_thinking_keeps_its_trace_open(browser, live):
    from playwright.sync_api import expect

    page = open_page(browser, live)
    page.check("#thinking")
    page.fill("#max-tokens", "12")
    ask(page, "Think about it.", 0)
    block = reply(page, 0).locator(".thinking")
    expect(block).to_be_visible()
    expect(block.locator("summary")).to_have_text("Thinking")
    assert block.evaluate("b => b.open") and reply(page, 0).locator(".answer").text_content() == ""
    page.close()


def test_the_hash_without_crypto_subtle_is_the_same_sha256(browser, live):
    """A page opened over plain http from another host has no crypto.subtle: its fallback."""
    page = open_page(browser, live)
    for ids in ([], [1, 2, 3], list(range(1000)), [248046] * 13):
        subtle = page.evaluate("ids => tokenSha(ids)", ids)
        fallback = page.evaluate("ids => sha256Fallback(ids.join(','))", ids)
        assert subtle == fallback == token_sha(ids)
    page.close()


# -- the API's docs pages, offline ---------------------------------------------------------------


def test_the_docs_pages_load_every_file_from_this_server(live):
    """/docs and /redoc name no other host: their scripts and styles come from the package."""
    with live.client() as http:
        for path in ("/docs", "/redoc"):
            page = http.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            urls = re.findall(r'(?:src|href)=["\']([^"\']+)["\']', page.text)
            urls += re.findall(r"url: ?['\"]([^'\"]+)['\"]", page.text)  # the spec's URL
            assert urls and all(u.startswith("/") for u in urls), (path, urls)
            for url in urls:
                assert http.get(url).status_code == 200, url


def test_the_docs_pages_render_with_no_network(browser, live):
    """In Chromium with every request to another host refused: Swagger UI and ReDoc show the
    API's title and its routes (they were blank offline, loading their scripts from a CDN)."""
    from playwright.sync_api import expect

    page = browser.new_page()
    foreign = []

    def only_here(route):
        if route.request.url.startswith(live.url):
            return route.continue_()
        foreign.append((route.request.resource_type, route.request.url))
        return route.abort()

    page.route("**/*", only_here)
    page.goto(live.url + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("TensorFold")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.goto(live.url + "/redoc")
    expect(page.locator("h1").first).to_contain_text("TensorFold")
    # nothing the pages run on came from elsewhere; ReDoc's own footer logo is its one image link
    assert [url for kind, url in foreign if kind != "image"] == []
    page.close()
