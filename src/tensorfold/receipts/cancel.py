"""`check cancel`: a client that leaves (mid-decode, mid-prompt, beside another request) or a
request past the window must leave nothing behind: after each, two probes give their
reference hashes again."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .client import Endpoint, Stream, Tokens
from .prefill import build_arrays
from .prompts import DECODE_PROMPTS, Prompt, RequestStyle
from .report import short, table, write_json


@dataclass(frozen=True)
class CancelConfig:
    endpoint: Endpoint
    model: str
    probe_tokens: int = 128
    long_prompt: int = 22000
    drop_after: int = 8  # tokens a dropped stream reads before it leaves
    window: int | None = None  # prompt + generation limit; default: /v1/models max_model_len
    style: RequestStyle = RequestStyle()
    probes: tuple[Prompt, ...] = DECODE_PROMPTS


@dataclass
class Step:
    name: str
    problems: list[str] = field(default_factory=list)
    probes: dict[str, str] = field(default_factory=dict)  # probe name -> sha after the step
    detail: str = ""

    @property
    def passed(self) -> bool:
        return not self.problems


class CancelCheck:
    def __init__(self, cfg: CancelConfig, tokens: Tokens) -> None:
        self.cfg, self.tokens = cfg, tokens
        self.reference: dict[str, str] = {}
        self.window = cfg.window or cfg.endpoint.window()

    def probe(self, prompt: Prompt, on_token=None) -> Stream:
        body = prompt.body(self.cfg.model, self.cfg.probe_tokens, 0.0, 0, self.cfg.style)
        return self.cfg.endpoint.stream(prompt.path, body, on_token=on_token)

    def _long_decode(self, prompt: Prompt) -> dict:
        """A body that would decode far past the point where the client leaves."""
        limit = 4 * self.cfg.probe_tokens + self.cfg.drop_after
        if self.window:
            limit = min(limit, self.window // 2)
        return prompt.body(self.cfg.model, limit, 0.0, 0, self.cfg.style)

    def check_probes(self, step: Step) -> Step:
        for prompt in self.cfg.probes:
            s = self.probe(prompt)
            step.probes[prompt.name] = s.sha
            if not s.ok:
                step.problems.append(f"probe {prompt.name}: HTTP {s.status} {s.error}")
            elif s.sha != self.reference[prompt.name]:
                step.problems.append(
                    f"probe {prompt.name}: {short(s.sha)}, reference "
                    f"{short(self.reference[prompt.name])}"
                )
        return step

    def references(self) -> Step:
        step = Step("reference probes")
        for prompt in self.cfg.probes:
            s = self.probe(prompt)
            self.reference[prompt.name] = step.probes[prompt.name] = s.sha
            if not s.ok or s.tokens == 0:
                step.problems.append(f"probe {prompt.name}: HTTP {s.status} {s.error}")
        return step

    def drop_mid_decode(self) -> Step:
        prompt = self.cfg.probes[0]
        s = self.cfg.endpoint.stream(
            prompt.path, self._long_decode(prompt), stop_after=self.cfg.drop_after
        )
        step = Step("stream dropped mid-decode", detail=f"left after {s.tokens} tokens")
        if not (s.status == 200 and s.dropped):
            step.problems.append(f"the stream ended before the drop: HTTP {s.status} {s.error}")
        return self.check_probes(step)

    def drop_mid_prompt(self) -> Step:
        size = self.cfg.long_prompt
        if self.window:
            size = min(size, self.window - 64)
        ids = build_arrays(self.tokens, (size,), 0)[:size]
        body = {"model": self.cfg.model, "prompt": ids, "max_tokens": 16, "temperature": 0}
        s = self.cfg.endpoint.stream("/v1/completions", body, stop_after=0)
        step = Step("long prompt dropped mid-prompt", detail=f"{size} tokens, left at the headers")
        if s.status != 200:
            step.problems.append(f"the long prompt was refused: HTTP {s.status} {s.error}")
        return self.check_probes(step)

    def drop_beside_probe(self) -> Step:
        probe, other = self.cfg.probes[0], self.cfg.probes[-1]
        decoding = threading.Event()

        def run_probe() -> Stream:
            try:
                return self.probe(probe, lambda _s: decoding.set())
            finally:
                decoding.set()  # a probe that fails early must not hang the step

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_probe)
            decoding.wait()
            dropped = self.cfg.endpoint.stream(
                other.path, self._long_decode(other), stop_after=self.cfg.drop_after
            )
            beside = running.result()
        overlap = "yes" if beside.end > dropped.end else "no"
        step = Step(
            "stream dropped beside a running probe",
            detail=f"left after {dropped.tokens} tokens; probe still running at the drop: "
            f"{overlap}",
        )
        if not (dropped.status == 200 and dropped.dropped):
            step.problems.append(f"the dropped stream ended first: HTTP {dropped.status}")
        if beside.sha != self.reference[probe.name]:
            step.problems.append(
                f"the running probe gave {short(beside.sha)}, reference "
                f"{short(self.reference[probe.name])}"
            )
        return self.check_probes(step)

    def past_window(self) -> Step:
        step = Step("request past the window (refused)")
        if not self.window:
            step.problems.append("the window is unknown: pass --window N")
            return step
        ids = build_arrays(self.tokens, (self.window + 1,), 0)[: self.window + 1]
        body = {"model": self.cfg.model, "prompt": ids, "max_tokens": 16, "temperature": 0}
        reply = self.cfg.endpoint.post("/v1/completions", body)
        step.detail = (
            f"{len(ids)} prompt tokens over a window of {self.window}: HTTP {reply.status}"
        )
        if not 400 <= reply.status < 500:
            step.problems.append(f"not refused: HTTP {reply.status}")
        return self.check_probes(step)

    def run(self) -> list[Step]:
        steps = [self.references()]
        if steps[0].passed:
            steps += [
                self.drop_mid_decode(),
                self.drop_mid_prompt(),
                self.drop_beside_probe(),
                self.past_window(),
            ]
        return steps


def cancel_command(cfg: CancelConfig, tokens: Tokens, output: str | None) -> int:
    steps = CancelCheck(cfg, tokens).run()
    names = [p.name for p in cfg.probes]
    rows = [
        [
            s.name,
            *(short(s.probes.get(n)) for n in names),
            "pass" if s.passed else "FAIL",
            "; ".join(s.problems) or s.detail,
        ]
        for s in steps
    ]
    print(table(["step", *names, "result", "detail"], rows))
    failed = sum(not s.passed for s in steps)
    write_json(
        output,
        {
            "tool": "check cancel",
            "url": cfg.endpoint.url,
            "model": cfg.model,
            "probe_tokens": cfg.probe_tokens,
            "steps": [
                {
                    "name": s.name,
                    "passed": s.passed,
                    "problems": s.problems,
                    "probes": s.probes,
                    "detail": s.detail,
                }
                for s in steps
            ],
        },
    )
    print(
        f"check cancel: {'PASS' if not failed else 'FAIL'} "
        f"({len(steps) - failed}/{len(steps)} steps passed)"
    )
    return 1 if failed else 0
