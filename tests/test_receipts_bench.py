"""`tensorfold bench decode|concurrent|prefill` against a live tiny server, and their checks
failing on planted faults (a resumed prompt, a token that changes under concurrency)."""

from __future__ import annotations

import json

import pytest
from receipts_fakes import Plan, start_fake
from server_harness import make_engine, solo, start_server

from tensorfold.cli import main
from tensorfold.engine.request import SamplingParams
from tensorfold.receipts.prompts import CHAT, CODE, PARAGRAPH
from tensorfold.util import token_sha

MB = 1 << 20


@pytest.fixture(scope="module")
def reference(hf_tiny):
    return make_engine(hf_tiny)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def expected_sha(live, reference, prompt, tokens: int) -> str:
    if prompt.chat:
        ids = live.tokenizer.chat([{"role": "user", "content": prompt.text}], enable_thinking=False)
    else:
        ids = live.tokenizer.encode(prompt.text)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return token_sha(solo(reference, ids, params))


def test_decode_reports_rates_and_the_hash_of_the_real_tokens(live, reference, capsys, tmp_path):
    out = tmp_path / "decode.json"
    code, text = run(
        capsys,
        "bench",
        "decode",
        live.url,
        live.name,
        "--tokens",
        "8",
        "--reps",
        "2",
        "--output",
        str(out),
    )
    assert code == 0
    assert text.splitlines()[0].split()[:3] == ["prompt", "temperature", "tok/s"]
    records = json.loads(out.read_text())["records"]
    assert [(r["prompt"], r["rep"]) for r in records] == [
        ("code", 0),
        ("code", 1),
        ("chat", 0),
        ("chat", 1),
    ]
    for r in records:
        prompt = CODE if r["prompt"] == "code" else CHAT
        assert r["tokens"] == 8 and r["tok_s"] > 0 and r["hash_of"] == "ids"
        assert r["sha"] == expected_sha(live, reference, prompt, 8)
        assert r["sha"][:12] in text


def test_decode_at_depth_sends_a_prompt_of_exactly_n_tokens(live, reference, capsys, tmp_path):
    """`bench decode --context N`: one completion prompt of the paragraph's first N tokens, sent
    as ids; the reply's hash is the hash of our engine's tokens for that very prompt."""
    out = tmp_path / "depth.json"
    argv = ["bench", "decode", live.url, live.name, "--context", "300", "--tokens", "8"]
    code, text = run(capsys, *argv, "--reps", "1", "--output", str(out))
    assert code == 0
    (record,) = json.loads(out.read_text())["records"]
    ids = live.tokenizer.encode(PARAGRAPH * 8)[:300]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert record["prompt"] == "context 300" and record["usage"]["prompt_tokens"] == 300
    assert record["sha"] == token_sha(solo(reference, ids, params))
    assert "context 300" in text


def test_concurrent_alone_and_serial_cells_all_equal(live, capsys, tmp_path):
    out = tmp_path / "concurrent.json"
    code, text = run(
        capsys,
        "bench",
        "concurrent",
        live.url,
        live.name,
        "--tokens",
        "8",
        "--reps",
        "2",
        "--levels",
        "1,3",
        "--temperatures",
        "0,0.9",
        "--alone",
        "--serial",
        "--output",
        str(out),
    )
    assert code == 0
    cells = 2 * 2 * 2 * (1 + 3)  # temperatures x prompts x reps x lanes
    assert f"alone: {cells} cells, {cells} equal, 0 failed" in text
    assert f"serial: {cells} cells, {cells} equal, 0 failed" in text
    runs = json.loads(out.read_text())["runs"]
    assert {r["level"] for r in runs} == {1, 3}
    assert all(r["aggregate_tok_s"] > 0 for r in runs)
    sampled = {
        c["sha"] for r in runs if r["temperature"] > 0 and r["prompt"] == "code" for c in r["cells"]
    }
    assert len(sampled) == 2  # one hash per seed: the reps really differ


def test_concurrent_flags_a_planted_hash_difference(capsys):
    # Requests: 1 alone reference, 2 the lane at level 1, 3-4 the lanes at level 2.
    fake = start_fake(Plan(alter=lambda n, body: n == 4))
    try:
        code, text = run(
            capsys,
            "bench",
            "concurrent",
            fake.url,
            "fake",
            "--tokens",
            "8",
            "--reps",
            "1",
            "--levels",
            "1,2",
            "--prompts",
            "code",
            "--alone",
        )
    finally:
        fake.stop()
    assert code == 1
    assert "alone: 3 cells, 2 equal, 1 failed" in text


def test_serial_flags_a_server_whose_draft_false_tokens_differ(capsys):
    fake = start_fake(Plan(alter=lambda n, body: body.get("draft") is False))
    try:
        code, text = run(
            capsys,
            "bench",
            "concurrent",
            fake.url,
            "fake",
            "--tokens",
            "8",
            "--reps",
            "1",
            "--levels",
            "2",
            "--alone",
            "--serial",
        )
    finally:
        fake.stop()
    assert code == 1
    assert "alone: 4 cells, 4 equal, 0 failed" in text
    assert "serial: 4 cells, 0 equal, 4 failed" in text


def test_prefill_on_exact_arrays_with_every_record_checked(live, capsys, tmp_path):
    out = tmp_path / "prefill.json"
    code, text = run(
        capsys,
        "bench",
        "prefill",
        live.url,
        "--sizes",
        "64,128",
        "--rounds",
        "2",
        "--warmup",
        "64",
        "--output",
        str(out),
    )
    assert code == 0
    result = json.loads(out.read_text())
    stream = live.tokenizer.encode(PARAGRAPH * 8)
    records = result["records"]
    assert [(r["round"], r["size"], r["offset"]) for r in records] == [
        (0, 64, 1),
        (0, 128, 2),
        (1, 64, 3),
        (1, 128, 4),
    ]  # offset 0 is the warm-up's
    for r in records:  # each round sent its own array: no prompt shares another's start
        assert r["sha"] == token_sha(stream[r["offset"] : r["offset"] + r["size"]])
        assert r["sha"][:12] in text
    assert all(r["prompt_tokens"] == r["size"] and r["cached_tokens"] == 0 for r in records)
    assert [line.split()[0] for line in text.splitlines()[2:4]] == ["64", "128"]


def test_prefill_measures_cold_prompts_against_a_server_with_its_prompt_cache_on(hf_tiny, capsys):
    """Our own server keeps its prompt cache on by default: repeated rounds must not resume."""
    cached = start_server(make_engine(hf_tiny, prompt_cache_bytes=8 * MB))
    try:
        code, text = run(
            capsys,
            "bench",
            "prefill",
            cached.url,
            "--sizes",
            "64,128",
            "--rounds",
            "3",
            "--warmup",
            "64",
        )
    finally:
        cached.stop()
    assert code == 0, text
    assert "check failed" not in text


@pytest.mark.parametrize(
    "plan, problem",
    [
        (Plan(cached_tokens=3), "cached_tokens 3, not 0"),
        (Plan(extra_prompt_tokens=1), "prompt_tokens 41, not 40"),
    ],
)
def test_prefill_flags_a_peer_reporting_cached_or_other_prompt_tokens(plan, problem, capsys):
    fake = start_fake(plan)
    try:
        code, text = run(
            capsys, "bench", "prefill", fake.url, "--sizes", "40", "--rounds", "1", "--warmup", "40"
        )
    finally:
        fake.stop()
    assert code == 1
    assert f"check failed at 40 tokens: {problem}" in text


def test_an_unreachable_server_is_exit_2(capsys):
    fake = start_fake(Plan())
    url = fake.url
    fake.stop()
    assert main(["bench", "decode", url, "fake", "--tokens", "4", "--reps", "1"]) == 2
    assert "error:" in capsys.readouterr().err
