"""The first look at a request body, before FastAPI parses it: size caps (413 at once, from
Content-Length when there is one, else as soon as the count passes the cap) and text the JSON
parser would take but nothing after it can handle (invalid UTF-8, lone surrogates, integers of
thousands of digits), each refused with a 400 naming its field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .connections import closing
from .errors import APIError
from .limits import Limits
from .logsafe import clip

# The routes whose body is a prompt (or token ids), and the field a size refusal names.
PROMPT_PARAMS = {
    "/v1/completions": "prompt",
    "/v1/chat/completions": "messages",
    "/tokenize": "prompt",
    "/detokenize": "tokens",
}
BODY_METHODS = ("POST", "PUT", "PATCH")
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
BAD_TEXT = re.compile("[\ud800-\udfff]")  # lone surrogates; invalid bytes land here too
MAX_INT_DIGITS = 4000  # Python refuses to parse past 4300
MAX_PARAM = 200


@dataclass(frozen=True)
class Cap:
    limit: int
    param: str | None
    code: str
    flag: str


@dataclass(frozen=True)
class _LongInt:
    """An integer the body spells with more digits than any field can take."""

    digits: int


class _TooLarge(Exception):
    pass


Refuse = Callable[[APIError, Scope, Receive, Send], Awaitable[None]]


class BodyGuard:
    def __init__(self, app: ASGIApp, limits: Limits, refuse: Refuse, routes=()) -> None:
        """`routes`: the app's routes (read at the first request, when all are added)."""
        self.app, self.limits, self.refuse = app, limits, refuse
        self.routes, self._posts = routes, None

    def takes_body(self, path: str) -> bool:
        """Whether a route reads a body at `path`; any other body is never read or parsed
        (the router answers 404 or 405, and the connection closes with the body unread)."""
        if self._posts is None:
            methods = {r.path: getattr(r, "methods", None) or () for r in self.routes}
            self._posts = {p for p, m in methods.items() if set(m) & set(BODY_METHODS)}
        return path in self._posts

    def cap(self, path: str) -> Cap:
        body = Cap(self.limits.max_body_bytes, None, "body_too_large", "--max-body-bytes")
        if path in PROMPT_PARAMS and self.limits.max_prompt_bytes < body.limit:
            return Cap(
                self.limits.max_prompt_bytes,
                PROMPT_PARAMS[path],
                "prompt_too_large",
                "--max-prompt-bytes",
            )
        return body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _both_framings(scope):  # RFC 9112 6.1: answer, then close (no request may follow)
            send = closing(send)
        cap = self.cap(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > cap.limit:  # refused before a byte is read
            return await self.refuse(_too_large(cap, f"{declared} bytes"), scope, receive, send)
        if scope["method"] not in BODY_METHODS or not self.takes_body(scope["path"]):
            return await self.app(scope, receive, send)
        try:
            body = await _read(receive, cap.limit)
        except _TooLarge:
            return await self.refuse(
                _too_large(cap, f"more than {cap.limit} bytes"), scope, receive, send
            )
        if body is None:  # the client left (or a read timeout closed it)
            return
        err = check_json(body, cap, self.limits.max_json_objects)
        if err is not None:
            return await self.refuse(err, scope, receive, send)
        await self.app(scope, _replay(body, receive), send)


def _both_framings(scope: Scope) -> bool:
    """A request with both Content-Length and Transfer-Encoding: a smuggling attempt or a broken
    proxy, whose next bytes on the connection cannot be trusted."""
    names = {name.lower() for name, _ in scope.get("headers", ())}
    return b"content-length" in names and b"transfer-encoding" in names


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value)  # h11 has checked it is digits and not contradicted
    return None


def _too_large(cap: Cap, size: str) -> APIError:
    what = "a request with a prompt" if cap.param else "a request body"
    return APIError(
        413,
        f"the request body is {size}; {what} may have at most {cap.limit} bytes ({cap.flag})",
        cap.param,
        code=cap.code,
    )


async def _read(receive: Receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, then the real channel (so a disconnect is still seen)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def check_json(raw: bytes, cap: Cap, max_objects: int) -> APIError | None:
    """A refusal naming the field for what no later stage can take (invalid text, an integer
    of thousands of digits, more objects than a prompt can need: pydantic pays per object, on
    the event loop); None when FastAPI may parse it (it names malformed JSON itself)."""
    try:
        text, utf8 = raw.decode("utf-8"), True
    except UnicodeDecodeError:
        text, utf8 = raw.decode("utf-8", "surrogateescape"), False
    suspect = not utf8 or SURROGATE_ESCAPE.search(raw) is not None
    # braces inside strings count too: an upper bound, so most bodies skip the exact count
    count = _ObjectCount(max_objects) if raw.count(b"{") > max_objects else None
    try:
        obj = json.loads(text, object_hook=count)
    except _TooManyObjects:
        return APIError(
            413,
            f"the body holds more than {max_objects} JSON objects, more than "
            "a prompt of --context tokens can need",
            cap.param,
            code="too_many_objects",
        )
    except json.JSONDecodeError:
        return None if utf8 else _not_utf8()
    except RecursionError:  # nesting past the parser's depth: no later stage could take it
        return APIError(400, "the body nests JSON too deeply", code="invalid_json")
    except ValueError:  # an integer past Python's digit limit
        obj, suspect = json.loads(text, parse_int=_bounded_int), True
    if not suspect:
        return None
    found = find_bad(obj)
    if found is None:
        return None
    param, why = found
    return APIError(400, f"{param or 'the body'} {why}", param, code="invalid_encoding")


class _TooManyObjects(Exception):
    pass


class _ObjectCount:
    def __init__(self, limit: int) -> None:
        self.limit, self.seen = limit, 0

    def __call__(self, obj: dict) -> dict:
        self.seen += 1
        if self.seen > self.limit:
            raise _TooManyObjects
        return obj


def _not_utf8() -> APIError:
    return APIError(400, "the body is not valid UTF-8 JSON", code="invalid_json")


def _bounded_int(digits: str) -> int | _LongInt:
    return _LongInt(len(digits)) if len(digits) > MAX_INT_DIGITS else int(digits)


def find_bad(obj: Any) -> tuple[str | None, str] | None:
    """(param, what is wrong) for the first string that is not valid text or integer too long."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        value, where = stack.pop()
        param = clip(where, MAX_PARAM) or None
        if isinstance(value, str) and BAD_TEXT.search(value):
            return param, "is not valid UTF-8 text (invalid bytes or a lone surrogate)"
        if isinstance(value, _LongInt):
            return param, f"is an integer of {value.digits} digits"
        if isinstance(value, dict):
            for key, item in value.items():
                if BAD_TEXT.search(key):
                    return param, "has a field name that is not valid UTF-8 text"
                stack.append((item, f"{where}.{key}" if where else key))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
    return None
