"""Charts: `bench ... --plot` against a live tiny server (a peer beside it, the card's limit) and
the H200 charts drawn from the recorded figures. Checked from the data the axes hold, not pixels."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from receipts_fakes import Plan, start_fake

from tensorfold.cli import main
from tensorfold.receipts.plot import (
    PlotRequest,
    concurrent_panel,
    decode_panel,
    draw,
    prefill_panel,
)

pytest.importorskip("matplotlib", reason="the charts need matplotlib (the test extra has it)")

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def h200_charts():
    spec = importlib.util.spec_from_file_location(
        "h200_charts", ROOT / "benchmarks" / "h200_charts.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["h200_charts"] = module
    spec.loader.exec_module(module)
    return module


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def inside(values, lim) -> bool:
    return all(lim[0] <= v <= lim[1] for v in values if math.isfinite(v))


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_prefill_plot_draws_tok_s_against_length_with_peer_and_limit(live, capsys, tmp_path):
    ours, chart = tmp_path / "ours.json", tmp_path / "prefill.png"
    args = ["bench", "prefill", live.url, "--sizes", "32,64", "--rounds", "1", "--warmup", "32"]
    assert run(capsys, *args, "--output", str(ours))[0] == 0
    code, text = run(
        capsys,
        *args,
        "--plot",
        str(chart),
        "--peer",
        str(ours),
        "--peer-label",
        "earlier",
        "--limit",
        "1e6",
    )
    assert code == 0 and f"chart: {chart}" in text and is_png(chart)
    result = json.loads(ours.read_text())
    req = PlotRequest(tmp_path / "again.png", "now", result, "earlier", 1e6)
    drawn = draw([prefill_panel(result, req)], req.path)[0]
    xs, ys = drawn.series["now"]
    assert xs == (32.0, 64.0)
    assert ys == tuple(r["size"] / r["seconds"] for r in result["records"])
    assert drawn.series["card limit"] == ((32.0, 64.0), (1e6, 1e6))
    assert inside(xs, drawn.xlim) and inside(ys + (1e6,), drawn.ylim)
    assert drawn.xlabel == "prompt tokens" and drawn.ylabel.startswith("tok/s")


def test_concurrent_plot_draws_decode_against_lanes_with_the_limit_per_lane(live, capsys, tmp_path):
    out, chart = tmp_path / "concurrent.json", tmp_path / "concurrent.png"
    code, _ = run(
        capsys,
        "bench",
        "concurrent",
        live.url,
        live.name,
        "--tokens",
        "6",
        "--reps",
        "1",
        "--levels",
        "1,2",
        "--prompts",
        "code",
        "--output",
        str(out),
        "--plot",
        str(chart),
        "--limit",
        "5000",
    )
    assert code == 0 and is_png(chart)
    runs = json.loads(out.read_text())["runs"]
    req = PlotRequest(tmp_path / "c.png", "tiny", limit=5000.0)
    drawn = draw([concurrent_panel(runs, req)], req.path)[0]
    xs, ys = drawn.series["tiny: code"]
    assert xs == (1.0, 2.0) and all(y > 0 for y in ys)
    assert ys == tuple(r["aggregate_tok_s"] for r in runs)
    assert drawn.series["card limit (x lanes)"] == ((1.0, 2.0), (5000.0, 10000.0))
    assert inside(ys, drawn.ylim) and drawn.ylim[1] >= 10000


def test_decode_plot_puts_a_peer_beside_us(live, capsys, tmp_path):
    fake = start_fake(Plan())
    peer = tmp_path / "peer.json"
    try:
        assert (
            run(
                capsys,
                "bench",
                "decode",
                fake.url,
                "fake",
                "--tokens",
                "6",
                "--reps",
                "1",
                "--output",
                str(peer),
            )[0]
            == 0
        )
    finally:
        fake.stop()
    out, chart = tmp_path / "ours.json", tmp_path / "decode.png"
    code, _ = run(
        capsys,
        "bench",
        "decode",
        live.url,
        live.name,
        "--tokens",
        "6",
        "--reps",
        "1",
        "--output",
        str(out),
        "--plot",
        str(chart),
        "--peer",
        str(peer),
        "--peer-label",
        "fake",
        "--label",
        "tiny",
    )
    assert code == 0 and is_png(chart)
    records, peer_records = json.loads(out.read_text()), json.loads(peer.read_text())
    req = PlotRequest(tmp_path / "d.png", "tiny", peer_records, "fake")
    drawn = draw([decode_panel(records["records"], req)], req.path)[0]
    assert drawn.ticks == ("code", "chat")
    assert drawn.series["tiny"][1] == tuple(r["tok_s"] for r in records["records"])
    assert drawn.series["fake"][1] == tuple(r["tok_s"] for r in peer_records["records"])
    assert inside(drawn.series["tiny"][1] + drawn.series["fake"][1], drawn.ylim)


def test_a_peer_file_of_another_tool_is_refused_before_the_run(capsys, tmp_path):
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps({"tool": "bench decode", "records": []}))
    code = main(
        [
            "bench",
            "concurrent",
            "http://127.0.0.1:9",
            "m",
            "--plot",
            str(tmp_path / "x.png"),
            "--peer",
            str(peer),
        ]
    )
    assert code == 2
    assert "no 'runs' list" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_h200_charts_from_the_recorded_figures(tmp_path):
    charts = h200_charts()
    figures = charts.load()
    out = tmp_path / "h200.png"
    decode, prompt, peers = charts.plot(figures.rows, figures.peers, out, figures.title)
    assert is_png(out)
    rows = {(r["model"], r["what"]): r for r in figures.rows}
    xs, ys = decode.series["9b-4bit"]
    assert xs == (1.0, 4.0, 16.0, 64.0)
    assert ys == tuple(rows["9b-4bit", f"decode {n} lanes"]["tok_s"] for n in (1, 4, 16, 64))
    for panel in (decode, prompt):
        for label, (x, y) in panel.series.items():
            assert list(x) == sorted(x) and inside(x, panel.xlim) and inside(y, panel.ylim)
            if not label.startswith("limit"):
                limit = panel.series[f"limit {label}"][1]
                assert all(0 < v <= cap for v, cap in zip(y, limit))  # under the card's limit
    assert prompt.ylim[0] == 0 and prompt.series["9b-bf16"][0][0] == 2048.0
    assert len(peers.ticks) == len(figures.peers)
    ours, theirs = peers.series["TensorFold"][1], peers.series["peer"][1]
    assert all(o > t > 0 for o, t in zip(ours, theirs))


def test_the_recorded_figures_are_the_benchmarks_table():
    """Every figure the charts draw appears in docs/BENCHMARKS.md as written there."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    figures = h200_charts().load()
    for r in figures.rows:
        assert (
            f"{r['tok_s']:,} tok/s" in text
            or f"{r['tok_s']:,} /" in text
            or f"/ {r['tok_s']:,} tok/s" in text
        ), r
        assert f"{r['limit']:,}" in text or "16" in r["what"] or "64" in r["what"], r
    for p in figures.peers:
        assert f"{p['tok_s']:g}" in text, p
