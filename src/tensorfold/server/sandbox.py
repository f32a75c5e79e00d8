"""A request's own chat template (only with --trust-request-chat-template) is code from the
client: it renders in a child process (template_child.py) under jinja2's immutable sandbox, a
memory cap and a time limit at which the child is killed. Renders take turns on one child."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("template_child.py")
CHILD_MEMORY = 1 << 30  # address space of the child: a template can never take more
CHILD_START_S = 30.0  # a fresh child's start (a loaded machine), before any time limit


@dataclass(frozen=True)
class RenderJob:
    template: str
    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]
    add_generation_prompt: bool
    special: dict[str, str]  # the tokenizer's special tokens, as Hugging Face passes them


class TemplateFailed(Exception):
    """The template could not render; `kind` is syntax, render, limit, timeout or busy."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TemplateSandbox:
    def __init__(self, timeout_s: float, max_output: int) -> None:
        self.timeout_s, self.max_output = timeout_s, max_output
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def render(self, job: RenderJob) -> str:
        """The rendered text, or TemplateFailed; blocks (call it from a worker thread)."""
        if not self._lock.acquire(timeout=self.timeout_s):
            raise TemplateFailed("busy", "another request's template is rendering; retry")
        try:
            return self._render(job)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _child(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            # A clean environment: the child never sees the server's (an API key, say).
            self._proc = subprocess.Popen(
                [sys.executable, "-I", str(CHILD), str(CHILD_MEMORY), str(self.max_output)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={},
                close_fds=True,
            )
            try:
                self._read_line(self._proc.stdout.fileno(), time.monotonic() + CHILD_START_S)
            except TemplateFailed:
                self._kill()
                raise TemplateFailed("busy", "the template renderer did not start; retry") from None
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _render(self, job: RenderJob) -> str:
        proc = self._child()
        deadline = time.monotonic() + self.timeout_s
        try:
            proc.stdin.write(json.dumps(asdict(job)).encode() + b"\n")
            proc.stdin.flush()
            line = self._read_line(proc.stdout.fileno(), deadline)
        except TemplateFailed:
            self._kill()
            raise
        except OSError as exc:  # the child died under us (e.g. its memory cap)
            self._kill()
            raise TemplateFailed("limit", "the template's renderer stopped") from exc
        reply = json.loads(line)
        if "text" in reply:
            return reply["text"]
        raise TemplateFailed(reply["kind"], reply["error"])

    def _read_line(self, fd: int, deadline: float) -> bytes:
        buf = bytearray()
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TemplateFailed(
                    "timeout",
                    f"the template did not render within {self.timeout_s:g}s (--template-timeout)",
                )
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise TemplateFailed("limit", "the template's renderer stopped (memory cap)")
            buf += chunk
        return bytes(buf)
