"""`check known-answers`: the demo model's fixed prompts over HTTP, greedy, each reply compared
with its one right answer (thinking off, on, or both)."""

from __future__ import annotations

from dataclasses import dataclass

from .client import Endpoint
from .report import table, verdict, write_json

THINK_CLOSE = "</think>"
MODES = {"off": (False,), "on": (True,), "both": (False, True)}


@dataclass(frozen=True)
class KnownConfig:
    endpoint: Endpoint
    model: str
    thinking: tuple[bool, ...] = (False,)
    max_tokens: int = 256


def final_answer(text: str) -> str:
    """The reply after any thinking block, without surrounding space."""
    return text.rsplit(THINK_CLOSE, 1)[-1].strip()


def ask(cfg: KnownConfig, prompt: str, thinking: bool) -> dict:
    body = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": cfg.max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": thinking},
    }
    reply = cfg.endpoint.post("/v1/chat/completions", body)
    choices = reply.body.get("choices") or [{}]
    text = (choices[0].get("message") or {}).get("content") or ""
    return {
        "status": reply.status,
        "text": text,
        "reply": final_answer(text),
        "finish_reason": choices[0].get("finish_reason"),
    }


def run_known(cfg: KnownConfig) -> list[dict]:
    from ..demo.data import KNOWN_ANSWERS

    records = []
    for thinking in cfg.thinking:
        for task in KNOWN_ANSWERS:
            got = ask(cfg, task.prompt, thinking)
            records.append(
                {
                    "prompt": task.prompt,
                    "answer": task.answer,
                    "thinking": thinking,
                    **got,
                    "correct": got["status"] == 200 and got["reply"] == task.answer,
                }
            )
    return records


def _clip(text: str, n: int = 40) -> str:
    one_line = "".join(c if c.isprintable() else "?" for c in text.replace("\n", "\\n"))
    return one_line if len(one_line) <= n else one_line[: n - 1] + "…"


def known_command(cfg: KnownConfig, output: str | None) -> int:
    records = run_known(cfg)
    rows = [
        [
            _clip(r["prompt"], 48),
            "on" if r["thinking"] else "off",
            r["answer"],
            _clip(r["reply"]) if r["status"] == 200 else f"HTTP {r['status']}",
            "ok" if r["correct"] else "WRONG",
        ]
        for r in records
    ]
    print(table(["prompt", "thinking", "answer", "reply", "result"], rows))
    write_json(
        output,
        {
            "tool": "check known-answers",
            "url": cfg.endpoint.url,
            "model": cfg.model,
            "records": records,
        },
    )
    return verdict("check known-answers", sum(not r["correct"] for r in records), len(records))
