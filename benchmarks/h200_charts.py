"""The H200 charts: decode tok/s against lanes, prompt tok/s against length, and a side-by-side
against the peers, each with the card's limit dashed. `h200.py --plot` draws them from its own
run; this script draws the recorded figures of docs/BENCHMARKS.md (h200_figures.json) for the
docs and the README:

    PYTHONPATH=src python3 benchmarks/h200_charts.py [--data benchmarks/h200_figures.json]
                                                     [--out docs/h200.png]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from tensorfold.receipts.plot import PALETTE, Drawn, Panel, Series, draw

DATA = Path(__file__).with_name("h200_figures.json")


@dataclass(frozen=True)
class Figures:
    rows: list[dict]  # as h200.py prints them: model, what, tok_s, limit
    peers: list[dict]  # model, what, peer, tok_s: a peer's figure beside one of ours
    title: str


def load(path: Path = DATA) -> Figures:
    data = json.loads(Path(path).read_text())
    commits = " / ".join(sorted({r["commit"] for r in data["rows"]}))
    title = f"TensorFold on one {data['card']}: recorded {data['date']}, commits {commits}"
    return Figures(data["rows"], data.get("peers", []), title)


def _points(rows: list[dict], model: str, kind: str) -> list[tuple[int, dict]]:
    """(lanes or prompt length, row) of one model's decode or prompt rows, in order."""
    out = [
        (int(r["what"].split()[1]), r)
        for r in rows
        if r["model"] == model and r["what"].split()[0] == kind and "tok_s" in r
    ]
    return sorted(out, key=lambda p: p[0])


def _against(rows: list[dict], kind: str, title: str, xlabel: str, log_y: bool) -> Panel:
    series, limits = [], []
    models = [m for m in dict.fromkeys(r["model"] for r in rows) if _points(rows, m, kind)]
    for i, model in enumerate(models):
        pts, color = _points(rows, model, kind), PALETTE[i % len(PALETTE)]
        xs = tuple(x for x, _ in pts)
        series.append(Series(model, xs, tuple(r["tok_s"] for _, r in pts), color))
        limits.append(Series(f"limit {model}", xs, tuple(r["limit"] for _, r in pts), color))
    return Panel(title, xlabel, "tok/s", tuple(series), tuple(limits), log_x=True, log_y=log_y)


def _name(row: dict) -> str:
    kind, n = row["what"].split()[:2]
    what = "decode, 1 stream" if kind == "decode" else f"prompt {int(n):,}"
    return f"{row['model']}\n{what}\nvs {row['peer']}"


def side_by_side(rows: list[dict], peers: list[dict]) -> Panel:
    """Each peer figure beside ours for the same model and figure; the card's limit above both."""
    ours = {(r["model"], r["what"]): r for r in rows}
    pairs = [(p, ours[p["model"], p["what"]]) for p in peers if (p["model"], p["what"]) in ours]
    xs = tuple(range(len(pairs)))
    return Panel(
        "against the peers (same card)",
        "",
        "tok/s (log)",
        (
            Series("TensorFold", xs, tuple(r["tok_s"] for _, r in pairs), PALETTE[0]),
            Series("peer", xs, tuple(p["tok_s"] for p, _ in pairs), "#e07b39"),
        ),
        (Series("card limit", xs, tuple(r["limit"] for _, r in pairs)),),
        bars=True,
        categories=tuple(_name(p) for p, _ in pairs),
        log_y=True,
    )


def panels(rows: list[dict], peers: list[dict]) -> list[Panel]:
    out = [
        _against(rows, "decode", "decode against lanes (aggregate)", "lanes", True),
        _against(rows, "prompt", "prompt processing against length", "prompt tokens", False),
    ]
    if any((p["model"], p["what"]) in {(r["model"], r["what"]) for r in rows} for p in peers):
        out.append(side_by_side(rows, peers))
    return [p for p in out if p.series and p.series[0].x]


def plot(rows: list[dict], peers: list[dict], out: str | Path, title: str) -> list[Drawn]:
    return draw(panels(rows, peers), out, title)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--out", default="docs/h200.png")
    args = p.parse_args()
    figures = load(Path(args.data))
    for d in plot(figures.rows, figures.peers, args.out, figures.title):
        print(f"{d.title}: {', '.join(d.series)}")
    print(args.out)


if __name__ == "__main__":
    main()
