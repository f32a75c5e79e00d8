"""`tensorfold check cancel` and `check known-answers` over HTTP: a pass against a live tiny
server where the contract holds, and a failure with the right counts where it is planted."""

from __future__ import annotations

import json

import pytest
from receipts_fakes import Plan, start_fake
from server_harness import make_engine, solo, start_server

from tensorfold.cli import main
from tensorfold.demo.data import KNOWN_ANSWERS
from tensorfold.engine.request import SamplingParams
from tensorfold.receipts.prompts import CODE
from tensorfold.util import token_sha

STEPS = [
    "reference probes",
    "stream dropped mid-decode",
    "long prompt dropped mid-prompt",
    "stream dropped beside a running probe",
    "request past the window (refused)",
]
CANCEL_ARGS = ("--probe-tokens", "16", "--long-prompt", "300", "--drop-after", "4")


@pytest.fixture(scope="module")
def live(hf_tiny):
    server = start_server(make_engine(hf_tiny))
    yield server
    server.stop()


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cancel_passes_every_step_on_our_server(live, hf_tiny, capsys, tmp_path):
    out = tmp_path / "cancel.json"
    code, text = run(
        capsys, "check", "cancel", live.url, live.name, *CANCEL_ARGS, "--output", str(out)
    )
    assert code == 0, text
    steps = json.loads(out.read_text())["steps"]
    assert [s["name"] for s in steps] == STEPS
    assert all(s["passed"] for s in steps)
    want = token_sha(
        solo(
            make_engine(hf_tiny),
            live.tokenizer.encode(CODE.text),
            SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
        )
    )
    assert {s["probes"]["code"] for s in steps} == {want}
    assert "HTTP 400" in steps[-1]["detail"]
    assert "check cancel: PASS (5/5 steps passed)" in text


def test_cancel_fails_the_steps_after_a_planted_change(capsys, tmp_path):
    # Requests 1-2 are the reference probes; from the 3rd on, every reply has one token changed.
    fake = start_fake(Plan(alter=lambda n, body: n >= 3, refuse_past_window=False))
    out = tmp_path / "cancel.json"
    try:
        code, text = run(
            capsys, "check", "cancel", fake.url, "fake", *CANCEL_ARGS, "--output", str(out)
        )
    finally:
        fake.stop()
    assert code == 1
    steps = json.loads(out.read_text())["steps"]
    assert [s["passed"] for s in steps] == [True, False, False, False, False]
    assert any(p.startswith("not refused: HTTP 200") for p in steps[-1]["problems"])
    assert "the running probe gave" in " ".join(steps[3]["problems"])
    assert "check cancel: FAIL (1/5 steps passed)" in text


def test_known_answers_on_the_tiny_model_fail_with_counts(live, capsys, tmp_path):
    out = tmp_path / "known.json"
    code, text = run(
        capsys,
        "check",
        "known-answers",
        live.url,
        live.name,
        "--max-tokens",
        "8",
        "--output",
        str(out),
    )
    records = json.loads(out.read_text())["records"]
    n = len(KNOWN_ANSWERS)
    assert code == 1
    assert [r["prompt"] for r in records] == [t.prompt for t in KNOWN_ANSWERS]
    assert sum(r["correct"] for r in records) == 0  # a random tiny model knows none of them
    assert f"check known-answers: FAIL (0/{n} passed, {n} failed)" in text


def test_known_answers_count_a_planted_wrong_answer(capsys):
    answers = {t.prompt: t.answer for t in KNOWN_ANSWERS}
    wrong = KNOWN_ANSWERS[2]
    answers[wrong.prompt] = "392"
    fake = start_fake(Plan(answers=answers))
    try:
        code, text = run(capsys, "check", "known-answers", fake.url, "fake", "--thinking", "both")
    finally:
        fake.stop()
    n = 2 * len(KNOWN_ANSWERS)
    assert code == 1
    assert f"check known-answers: FAIL ({n - 2}/{n} passed, 2 failed)" in text
    wrong_rows = [line for line in text.splitlines() if line.endswith("WRONG")]
    assert len(wrong_rows) == 2 and all(wrong.prompt[:20] in r for r in wrong_rows)


def test_known_answers_pass_when_every_reply_is_right(capsys):
    fake = start_fake(Plan(answers={t.prompt: t.answer for t in KNOWN_ANSWERS}))
    try:
        code, text = run(capsys, "check", "known-answers", fake.url, "fake", "--thinking", "on")
    finally:
        fake.stop()
    n = len(KNOWN_ANSWERS)
    assert code == 0
    assert f"check known-answers: PASS ({n}/{n} passed, 0 failed)" in text
