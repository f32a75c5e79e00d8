"""Connections and keys: a request's headers and body must arrive in time, idle connections are
closed, past the connection cap a request gets a clear 503; the API key comes from a flag, a file
or the environment, exactly one Authorization header counts, a 401 says how to authenticate, and
the docs pages are all open alike."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest
from server_harness import CONTEXT, make_engine, metric, start_server

from tensorfold.server.auth import resolve_api_key
from tensorfold.server.limits import ConnectionLimits, Limits

TIMEOUT = 0.5
PROBE = {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def guarded(hf_tiny):
    connections = ConnectionLimits(
        header_timeout_s=TIMEOUT, body_timeout_s=TIMEOUT, keep_alive_s=TIMEOUT, max_connections=1000
    )
    server = start_server(
        make_engine(hf_tiny), limits=Limits.for_context(CONTEXT, 64, connections=connections)
    )
    yield server
    server.stop()


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    return sock


def closed_after(sock: socket.socket, since: float, got: list | None = None) -> float:
    """Seconds from `since` until the server closed the connection (what it sent into `got`)."""
    while chunk := sock.recv(65536):
        if got is not None:
            got.append(chunk)
    return time.monotonic() - since


@pytest.mark.parametrize(
    "sent,reason",
    [
        (b"", "header_timeout"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", "header_timeout"),
        (
            b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro',
            "body_timeout",
        ),
    ],
    ids=["idle", "half-sent-headers", "half-sent-body"],
)
def test_a_stalled_request_is_closed_after_its_timeout(guarded, sent, reason):
    before = metric(guarded.metrics(), "tensorfold_refusals_total", reason=reason)
    got = []
    with connect(guarded.url) as sock:
        start = time.monotonic()
        sock.sendall(sent)
        seconds = closed_after(sock, start, got)
    assert TIMEOUT * 0.9 <= seconds < TIMEOUT + 2.0
    assert metric(guarded.metrics(), "tensorfold_refusals_total", reason=reason) == before + 1
    if reason == "body_timeout":  # the request line was in: a 408 says why before the close
        head, _, body = b"".join(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ")
        assert json.loads(body)["error"]["code"] == "body_timeout"
    else:
        assert got == []


def test_trickled_headers_do_not_extend_the_deadline(guarded):
    with connect(guarded.url) as sock:
        start = time.monotonic()
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
                sock.sendall(bytes([byte]))
                time.sleep(0.05)  # a byte every 50 ms: past the timeout within 2 s
        except OSError:  # closed under us: the deadline held
            pass
        assert closed_after(sock, start) < TIMEOUT + 1.0


def test_an_idle_keep_alive_connection_is_closed(guarded):
    with connect(guarded.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert TIMEOUT * 0.9 <= closed_after(sock, start) < TIMEOUT + 2.0


def test_many_half_sent_requests_neither_block_others_nor_linger(guarded):
    socks = [connect(guarded.url) for _ in range(300)]
    try:
        start = time.monotonic()
        for i, sock in enumerate(socks):
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                if i % 2
                else b"POST /v1/completions HTTP/1.1\r\nContent-Length: 9\r\n\r\n{"
            )
        with guarded.client() as http:
            assert http.post("/v1/completions", json=PROBE).status_code == 200
        assert max(closed_after(sock, start) for sock in socks) < TIMEOUT + 5.0
    finally:
        for sock in socks:
            sock.close()


def test_a_request_with_two_framings_is_answered_then_the_connection_closes(guarded):
    """Content-Length beside Transfer-Encoding (RFC 9112 6.1): the server answers it with
    Connection: close and closes, so a request smuggled behind it is never read."""
    body = json.dumps(PROBE).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    both = head + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    got = []
    with connect(guarded.url) as sock:
        sock.sendall(both + smuggled)
        closed_after(sock, time.monotonic(), got)
    reply = b"".join(got)
    assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.1 ") == 1
    assert b"connection: close" in reply.lower()


def test_past_the_connection_cap_a_request_gets_a_503(hf_tiny):
    connections = ConnectionLimits(max_connections=3)
    server = start_server(
        make_engine(hf_tiny), limits=Limits.for_context(CONTEXT, 64, connections=connections)
    )
    try:
        idle = [connect(server.url) for _ in range(3)]
        time.sleep(0.1)  # let the server accept them
        r = httpx.post(f"{server.url}/v1/completions", json=PROBE, timeout=30)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.headers["Connection"] == "close"
        assert r.json()["error"]["code"] == "too_many_connections"
        health = httpx.get(f"{server.url}/health", timeout=30)  # alive, but takes no work
        assert health.status_code == 503 and health.headers["Connection"] == "close"
        assert health.json() == {"status": "overloaded", "reason": "more than 3 open connections"}
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 200
        assert (
            metric(server.metrics(), "tensorfold_refusals_total", reason="too_many_connections")
            == 1
        )
        for sock in idle:
            sock.close()
        time.sleep(0.1)  # let the server see them go
        assert httpx.post(f"{server.url}/v1/completions", json=PROBE, timeout=30).status_code == 200
    finally:
        server.stop()


def test_the_key_comes_from_a_flag_a_file_or_the_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    env = {"TENSORFOLD_API_KEY": "from-env"}
    assert resolve_api_key("from-flag", None, env) == "from-flag"
    assert resolve_api_key(None, str(key_file), env) == "from-file"
    assert resolve_api_key(None, None, env) == "from-env"
    assert resolve_api_key(None, None, {}) is None
    for flag, path in (("a", str(key_file)), ("has space", None), ("", None)):
        with pytest.raises(ValueError):
            resolve_api_key(flag, path, {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError):
        resolve_api_key(None, str(tmp_path / "empty"), {})


def test_serve_refuses_a_bad_key_file_before_loading(hf_tiny, tmp_path):
    code = "import sys; from tensorfold.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "serve",
            str(hf_tiny),
            "--api-key",
            "a",
            "--api-key-file",
            str(tmp_path / "key"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "not both" in out.stderr


def test_key_checks(hf_tiny):
    server = start_server(make_engine(hf_tiny), api_key="sekret")
    good = {"Authorization": "Bearer sekret"}
    try:
        with server.client() as http:
            twice = [("Authorization", "Bearer sekret")] * 2
            wrong_first = [("Authorization", "Bearer wrong"), ("Authorization", "Bearer sekret")]
            for headers in ({}, {"Authorization": "Bearer wrong"}, twice, wrong_first):
                r = http.get("/v1/models", headers=headers)
                assert r.status_code == 401, headers
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
                assert r.json()["error"]["code"] == "invalid_api_key"
            assert "exactly one" in r.json()["error"]["message"]
            assert http.get("/v1/models", headers=good).status_code == 200
            for path in ("/docs", "/redoc", "/openapi.json", "/health", "/metrics"):
                assert http.get(path).status_code == 200, path
            assert (
                metric(
                    http.get("/metrics").text, "tensorfold_refusals_total", reason="invalid_api_key"
                )
                == 4
            )
    finally:
        server.stop()
