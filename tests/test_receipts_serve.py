"""`tensorfold bench serve` against a live tiny server: every report field, the same tokens at
every concurrency (an exact server), failures counted and named (a peer that refuses)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from receipts_fakes import Plan, start_fake

from tensorfold.cli import main
from tensorfold.receipts.serve import percentile

FIELDS = ("ttft", "tpot", "itl", "e2e")


def serve(capsys, url: str, model: str, out, *more: str) -> tuple[int, str, dict]:
    argv = ["bench", "serve", url, model, "--output", str(out), *more]
    code = main(argv)
    return code, capsys.readouterr().out, json.loads(out.read_text())


def test_serve_reports_every_figure_and_the_same_tokens_at_every_level(live, capsys, tmp_path):
    code, text, data = serve(
        capsys,
        live.url,
        live.name,
        tmp_path / "serve.json",
        "--concurrency",
        "1,3",
        "--input-len",
        "24",
        "--output-len",
        "6",
        "--num-prompts",
        "6",
    )
    assert code == 0, text
    assert text.splitlines()[0].split()[:4] == ["conc", "rate", "req", "failed"]
    runs = data["runs"]
    assert [r["concurrency"] for r in runs] == [1, 3]
    for r in runs:
        assert (r["requests"], r["completed"], r["failed"], r["short"]) == (6, 6, 0, 0)
        assert r["output_tok_s"] > 0 and r["total_tok_s"] > r["output_tok_s"]
        assert r["request_throughput"] == pytest.approx(6 / r["duration_s"])
        for name in FIELDS:
            p50, p90, p99 = (r[f"{name}_p{q}_ms"] for q in (50, 90, 99))
            assert 0 <= p50 <= p90 <= p99, name
    for level, records in data["records"].items():
        assert [(x["prompt_tokens"], x["output_tokens"]) for x in records] == [(24, 6)] * 6
        assert all(len(x["itl_s"]) == 5 for x in records), level  # one token a chunk
    assert data["same_tokens"] is True
    shas = {level: [x["sha"] for x in recs] for level, recs in data["records"].items()}
    assert shas["1"] == shas["3"] and len(set(shas["1"])) == 6  # six prompts, six replies


def test_serve_sampled_gives_each_prompt_its_tokens_at_every_level(live, capsys, tmp_path):
    """--temperature: every prompt sampled with its own seed; the exact server's replies are the
    same at both levels, and they are not the greedy ones."""
    args = ["--concurrency", "1,3", "--input-len", "12", "--output-len", "8", "--num-prompts", "4"]
    code, _, data = serve(
        capsys, live.url, live.name, tmp_path / "t.json", *args, "--temperature", "1.5"
    )
    assert code == 0 and data["same_tokens"] is True and data["temperature"] == 1.5
    assert all(r["completed"] == 4 for r in data["runs"])
    _, _, greedy = serve(capsys, live.url, live.name, tmp_path / "g.json", *args)
    sampled = [x["sha"] for x in data["records"]["1"]]
    assert sampled != [x["sha"] for x in greedy["records"]["1"]]


def test_serve_at_a_request_rate_and_as_text(live, capsys, tmp_path):
    code, _, data = serve(
        capsys,
        live.url,
        live.name,
        tmp_path / "rate.json",
        "--concurrency",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "3",
        "--num-prompts",
        "4",
        "--request-rate",
        "500",
        "--dataset",
        "text",
    )
    assert code == 0
    (run,) = data["runs"]
    assert run["request_rate"] == 500 and run["completed"] == 4
    sent = sorted(x["sent"] for x in data["records"]["2"])
    assert sent == sorted(set(sent))  # sent one after another, not all at once


def test_serve_counts_and_names_failed_requests(capsys, tmp_path):
    peer = start_fake(Plan(window=20))  # every 16 + 8 token request is past its window
    try:
        code, text, data = serve(
            capsys,
            peer.url,
            "fake",
            tmp_path / "fail.json",
            "--concurrency",
            "1",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--num-prompts",
            "3",
        )
    finally:
        peer.stop()
    assert code == 1
    (run,) = data["runs"]
    assert (run["completed"], run["failed"]) == (0, 3)
    assert "request failed at concurrency 1: 400" in text


def test_bad_levels_are_refused_before_any_request(live, capsys, tmp_path):
    code = main(["bench", "serve", live.url, live.name, "--concurrency", "0"])
    assert code == 2
    assert "--concurrency must be each >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentiles_are_numpys(q):
    values = [0.3, 5.0, 1.25, 9.5, 2.0, 2.0, 7.75]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], q) is None and math.isclose(percentile([4.0], q), 4.0)


def test_tokens_that_change_with_the_level_are_reported(capsys, tmp_path):
    """Planted: a peer whose reply to the first prompt changes when it is sent again."""
    peer = start_fake(Plan(window=4096, alter=lambda n, body: n == 3))  # level 2's first prompt
    try:
        code, text, data = serve(
            capsys,
            peer.url,
            "fake",
            tmp_path / "alter.json",
            "--concurrency",
            "1,2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--num-prompts",
            "2",
        )
    finally:
        peer.stop()
    assert code == 0 and data["same_tokens"] is False
    assert "same tokens at every concurrency: NO" in text


def test_the_serve_chart_draws_ours_and_the_peers(tmp_path):
    from tensorfold.receipts.plot import PlotRequest, draw, serve_panels

    def runs(scale: float) -> list[dict]:
        return [
            {"concurrency": c, "output_tok_s": scale * c, "tpot_p50_ms": 10.0, "tpot_p99_ms": 12.0}
            for c in (1, 16, 64)
        ]

    req = PlotRequest(tmp_path / "serve.png", "ours", {"runs": runs(0.5)}, "peer")
    rate, tpot = draw(serve_panels(runs(1.0), req), req.path)
    assert rate.series["ours"] == ((1.0, 16.0, 64.0), (1.0, 16.0, 64.0))
    assert rate.series["peer"] == ((1.0, 16.0, 64.0), (0.5, 8.0, 32.0))
    assert tpot.series["ours p99"][1] == (12.0,) * 3 and set(tpot.series) >= {"peer p50"}
    assert req.path.stat().st_size > 0
