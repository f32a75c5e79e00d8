"""`tensorfold verify`: replay a saved request and check the token ids bit for bit.

A saved exchange is the request body (REQUEST.json) and the server's non-streamed response
(RESPONSE.json, with `return_token_ids: true` so each choice carries its ids). The replay sends
the same body again (to a server, or to this package serving the checkpoint in-process) and
compares every choice's ids; docs/RECEIPTS.md says what a match proves."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..util import token_sha

Post = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


@dataclass
class Verdict:
    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def fail(self, line: str) -> None:
        self.ok = False
        self.lines.append(f"FAIL {line}")

    def note(self, line: str) -> None:
        self.lines.append(line)


def load(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def endpoint(request: dict[str, Any]) -> str:
    return "/v1/chat/completions" if "messages" in request else "/v1/completions"


def replay_body(request: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The same request, answered whole with its token ids."""
    body = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
    body["return_token_ids"] = True
    if model is not None:
        body["model"] = model
    return body


def _ids(response: dict[str, Any]) -> dict[int, list[int] | None]:
    return {c["index"]: c.get("token_ids") for c in response.get("choices", [])}


def compare(request: dict[str, Any], saved: dict[str, Any], replay: dict[str, Any]) -> Verdict:
    v = Verdict()
    fp_saved, fp_now = saved.get("system_fingerprint"), replay.get("system_fingerprint")
    if fp_saved != fp_now:
        v.note(f"note: system_fingerprint differs ({fp_saved} saved, {fp_now} now): "
               "the same bytes are not promised")  # fmt: skip
    else:
        v.note(f"system_fingerprint {fp_now}")
    want, got = _ids(saved), _ids(replay)
    if not want:
        v.fail("the saved response has no choices")
    for index, ids in sorted(want.items()):
        if ids is None:
            v.fail(f"choice {index}: the saved response has no token_ids (send return_token_ids)")
            continue
        again = got.get(index)
        if again == ids:
            v.note(f"choice {index}: {len(ids)} token ids equal (sha256 {token_sha(ids)[:16]})")
            continue
        if again is None:
            v.fail(f"choice {index}: missing from the replay")
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again))
        )
        v.fail(f"choice {index}: token ids differ at position {at} "
               f"({len(ids)} saved, {len(again)} replayed)")  # fmt: skip
    _seed_note(request, v)
    return v


def _seed_note(request: dict[str, Any], v: Verdict) -> None:
    """A missing seed explains a sampled request's difference. A request that sets no
    temperature takes the server's default, greedy for many checkpoints: it is noted only
    when its replay differs."""
    if request.get("seed") is not None or request.get("temperature") in (0, 0.0):
        return
    if request.get("temperature") is not None or not v.ok:
        v.note("note: the request has no seed; a sampled reply cannot be replayed exactly")


def verify(
    request: dict[str, Any], saved: dict[str, Any], post: Post, model: str | None = None
) -> Verdict:
    status, replay = post(endpoint(request), replay_body(request, model))
    if status != 200:
        v = Verdict()
        v.fail(f"the replay was refused: HTTP {status} {json.dumps(replay)[:300]}")
        return v
    return compare(request, saved, replay)
