"""The chat page's reading and writing aids, in headless Chromium: replies rendered as markdown
(as DOM nodes, so a reply's markup never runs), copy buttons, editing a message to ask again,
several conversations, and the settings folding away on a phone. Replies come from canned
streams: the page is under test, not the model."""

from __future__ import annotations

import pytest
from test_web_page import STORE, ask, browser, canned_stream, open_page, reply  # noqa: F401

MARKDOWN = (
    "### Steps\n\nUse **bold**, `code` and *care*.\nA second line.\n\n- one\n- two\n\n"
    '1. first\n2. second\n\n```python\nprint(1)\n```\n<img src=x onerror="window.hacked=1">'
)


def canned(page, *texts: str) -> None:
    """The page's chat requests answered by these replies, in order."""
    bodies = [canned_stream({"content": t}) for t in texts]
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, content_type="text/event-stream", body=bodies.pop(0)
        ),
    )


@pytest.fixture
def page(browser, live):  # noqa: F811
    tab = open_page(browser, live)
    tab.uncheck("#thinking")  # else a reply without </think> is all trace
    yield tab
    tab.close()


def test_replies_render_markdown_as_nodes_with_copy_buttons(browser, live, page):  # noqa: F811
    from playwright.sync_api import expect

    browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=live.url)
    canned(page, MARKDOWN)
    ask(page, "Markdown, please", 0)
    answer = reply(page, 0).locator(".answer")
    expect(answer.locator("h5")).to_have_text("Steps")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("p code")).to_have_text("code")
    expect(answer.locator("em")).to_have_text("care")
    expect(answer.locator("p br")).to_have_count(1)  # a line break inside a paragraph
    expect(answer.locator("ul li")).to_have_text(["one", "two"])
    expect(answer.locator("ol li")).to_have_text(["first", "second"])
    expect(answer.locator("pre.code.python")).to_have_text("print(1)")
    assert answer.locator("img").count() == 0 and page.evaluate("window.hacked") is None
    expect(answer).to_contain_text('<img src=x onerror="window.hacked=1">')  # shown as text
    answer.locator(".copy-code").click()
    expect(answer.locator(".copy-code")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "print(1)"
    reply(page, 0).locator(".copy-msg").click()
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN
    page.locator(".msg.user .copy-msg").click()
    assert page.evaluate("navigator.clipboard.readText()") == "Markdown, please"


def test_edit_puts_a_message_back_and_asks_again_from_there(page):
    from playwright.sync_api import expect

    canned(page, "first", "second", "again")
    ask(page, "one", 0)
    ask(page, "two", 1)
    expect(page.locator(".msg.assistant .edit:visible")).to_have_count(0)  # replies: no edit
    page.locator(".msg.user").nth(0).locator(".edit").click()
    expect(page.locator("#prompt")).to_have_value("one")
    expect(page.locator(".msg")).to_have_count(0)  # it and everything after it
    page.fill("#prompt", "one, edited")
    page.click("#send")
    expect(reply(page, 0).locator(".answer")).to_have_text("again")
    stored = page.evaluate(f"JSON.parse(localStorage.getItem('{STORE}'))")
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "one, edited"),
        ("assistant", "again"),
    ]


def test_several_conversations_are_kept_and_reopened(page):
    from playwright.sync_api import expect

    canned(page, "A", "B")
    ask(page, "alpha", 0)
    expect(page.locator("#chats .chat-open")).to_have_count(0)  # the open one is not listed
    page.click("#new-chat")
    expect(page.locator(".msg")).to_have_count(0)
    expect(page.locator("#chats .chat-open")).to_have_text(["alpha"])
    ask(page, "beta", 0)
    page.locator("#chats .chat-open").first.click()
    expect(page.locator(".msg.user .answer")).to_have_text(["alpha"])
    expect(reply(page, 0).locator(".answer")).to_have_text("A")
    expect(page.locator("#chats .chat-open")).to_have_text(["beta"])
    page.reload()  # both survive a reload, the same one open
    expect(page.locator(".msg.user .answer")).to_have_text(["alpha"])
    expect(page.locator("#chats .chat-open")).to_have_text(["beta"])
    page.locator("#chats .chat-delete").click()
    expect(page.locator("#chats li")).to_have_count(0)
    expect(page.locator(".msg.user .answer")).to_have_text(["alpha"])  # the open one stays


def test_the_settings_fold_away_on_a_phone(page):
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 390, "height": 800})
    expect(page.locator("#settings")).to_be_hidden()
    expect(page.locator("#prompt")).to_be_visible()
    page.click("#settings-toggle")
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator("#thinking")).to_be_visible()
    page.click("#settings-toggle")
    expect(page.locator("#settings")).to_be_hidden()
    page.set_viewport_size({"width": 1280, "height": 860})
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator("#settings-toggle")).to_be_hidden()
