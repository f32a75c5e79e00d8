"""Charts of the receipts (`bench ... --plot FILE.png`, `benchmarks/h200.py --plot`): tok/s against
lanes or prompt length, a peer beside us, the card's limit as a dashed line.

matplotlib is imported only when a chart is drawn, through its object API (no pyplot state), on
the Agg canvas. `draw` returns what each panel drew, read back from its axes, so tests check the
data and the axes, not pixels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .report import median

OURS, PEER, LIMIT = "#2f6fdf", "#e07b39", "#555555"
PALETTE = ("#2f6fdf", "#1a9c6b", "#9b59b6", "#c0392b", "#e07b39", "#7f8c8d")


@dataclass(frozen=True)
class Series:
    label: str
    x: tuple[float, ...]  # numbers, or category positions 0, 1, ... for bars
    y: tuple[float, ...]
    color: str | None = None


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: tuple[Series, ...]
    limits: tuple[Series, ...] = ()  # the card's limits, drawn dashed (markers over bars)
    bars: bool = False  # x are category positions named by `categories`
    categories: tuple[str, ...] = ()
    log_x: bool = False
    log_y: bool = False


@dataclass(frozen=True)
class Drawn:
    """One panel as drawn: every series' points and the axes' ranges, read from the artists."""

    title: str
    xlabel: str
    ylabel: str
    xlim: tuple[float, float]
    ylim: tuple[float, float]
    series: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    ticks: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlotRequest:
    """What `--plot` asked for: the file, our label, a peer's record, the card's limit."""

    path: Path
    label: str = "this server"
    peer: dict | None = None  # the peer's `--output` JSON from the same tool
    peer_label: str = "peer"
    limit: float | None = None  # tok/s; per lane for decode (the line is limit x lanes)

    @staticmethod
    def of(
        path: str, label: str, peer: str | None, peer_label: str, limit: float | None, key: str
    ) -> PlotRequest:
        """`key`: the field the tool's --output holds its results in ("records" or "runs")."""
        data = json.loads(Path(peer).read_text()) if peer else None
        if data is not None and not isinstance(data.get(key), list):
            raise ValueError(f"--peer {peer}: no {key!r} list; give this tool's --output file")
        return PlotRequest(Path(path), label, data, peer_label, limit)


def require_matplotlib() -> None:
    """Fails before a long benchmark, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'tensorfold[plot]'") from exc


def draw(panels: list[Panel], path: str | Path, title: str = "") -> list[Drawn]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    if title:
        fig.suptitle(title, fontsize=11)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    drawn = [_panel(ax, p) for ax, p in zip(axes, panels)]
    fig.savefig(path, dpi=110)
    return drawn


def _panel(ax, p: Panel) -> Drawn:
    if p.bars:
        _bars(ax, p)
    else:
        for i, s in enumerate(p.series):
            ax.plot(s.x, s.y, marker="o", label=s.label, color=s.color or PALETTE[i % 6])
    for s in p.limits:
        style = (
            {"linestyle": "none", "marker": "_", "markersize": 26}
            if p.bars
            else {"linestyle": "--", "linewidth": 1.2}
        )
        ax.plot(s.x, s.y, label=s.label, color=s.color or LIMIT, alpha=0.8, **style)
    _axes(ax, p)
    return _read_back(ax, p)


def _bars(ax, p: Panel) -> None:
    width = 0.8 / max(1, len(p.series))
    for i, s in enumerate(p.series):
        xs = [x + (i - (len(p.series) - 1) / 2) * width for x in s.x]
        bars = ax.bar(xs, s.y, width, label=s.label, color=s.color or PALETTE[i % 6])
        ax.bar_label(bars, labels=[_short(v) for v in s.y], fontsize=7, padding=2)
    ax.set_xticks(range(len(p.categories)), p.categories, fontsize=8)


def _axes(ax, p: Panel) -> None:
    ax.set_title(p.title, fontsize=10)
    ax.set_xlabel(p.xlabel)
    ax.set_ylabel(p.ylabel)
    if p.log_x:
        ax.set_xscale("log", base=2)
        xs = sorted({x for s in p.series for x in s.x})
        ax.set_xticks(xs, [f"{x:,.0f}" for x in xs])
        ax.minorticks_off()
    if p.log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def _read_back(ax, p: Panel) -> Drawn:
    series = {
        line.get_label(): (tuple(map(float, line.get_xdata())), tuple(map(float, line.get_ydata())))
        for line in ax.get_lines()
    }
    for container in ax.containers:
        patches = list(container)
        series[container.get_label()] = (
            tuple(round(b.get_x() + b.get_width() / 2, 6) for b in patches),
            tuple(float(b.get_height()) for b in patches),
        )
    return Drawn(
        p.title,
        ax.get_xlabel(),
        ax.get_ylabel(),
        tuple(ax.get_xlim()),
        tuple(ax.get_ylim()),
        series,
        tuple(t.get_text() for t in ax.get_xticklabels()),
    )


def _short(v: float) -> str:
    if not math.isfinite(v):
        return ""
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


# -- the served benches ------------------------------------------------------------------------


def _decode_medians(records: list[dict]) -> dict[str, float]:
    temps = {r["temperature"] for r in records}
    out: dict[str, float] = {}
    for key in dict.fromkeys((r["prompt"], r["temperature"]) for r in records):
        rates = [r["tok_s"] for r in records if (r["prompt"], r["temperature"]) == key]
        name = key[0] if len(temps) == 1 else f"{key[0]} t={key[1]:g}"
        out[name] = median(rates) or 0.0
    return out


def decode_panel(records: list[dict], req: PlotRequest) -> Panel:
    """Median per-request tok/s by prompt: bars, the peer's beside ours, the one-lane limit."""
    ours = _decode_medians(records)
    names = list(ours)
    theirs = _decode_medians(req.peer["records"]) if req.peer else {}
    series = [Series(req.label, tuple(range(len(names))), tuple(ours[n] for n in names), OURS)]
    if req.peer:
        series.append(
            Series(
                req.peer_label,
                tuple(range(len(names))),
                tuple(theirs.get(n, math.nan) for n in names),
                PEER,
            )
        )
    limits = (
        (Series("card limit", tuple(range(len(names))), (req.limit,) * len(names)),)
        if req.limit
        else ()
    )
    return Panel(
        "decode, one request at a time",
        "prompt",
        "tok/s (median)",
        tuple(series),
        limits,
        bars=True,
        categories=tuple(names),
    )


def _run_name(run: dict) -> str:
    return run["prompt"] + (f" t={run['temperature']:g}" if run["temperature"] else "")


def _concurrent_medians(runs: list[dict]) -> dict[str, dict[int, float]]:
    groups: dict[str, dict[int, list]] = {}
    for r in runs:
        groups.setdefault(_run_name(r), {}).setdefault(r["level"], []).append(r["aggregate_tok_s"])
    return {
        name: {level: median(rates) or 0.0 for level, rates in by.items()}
        for name, by in groups.items()
    }


def concurrent_panel(runs: list[dict], req: PlotRequest) -> Panel:
    """Aggregate decode tok/s against concurrent requests (lanes), per prompt; the peer's dashed."""
    series = [
        Series(f"{req.label}: {name}", tuple(by), tuple(by.values()))
        for name, by in _concurrent_medians(runs).items()
    ]
    if req.peer:
        series += [
            Series(f"{req.peer_label}: {name}", tuple(by), tuple(by.values()))
            for name, by in _concurrent_medians(req.peer["runs"]).items()
        ]
    levels = sorted({r["level"] for r in runs})
    limits = ()
    if req.limit:
        limits = (
            Series("card limit (x lanes)", tuple(levels), tuple(req.limit * n for n in levels)),
        )
    return Panel(
        "decode against lanes",
        "concurrent requests",
        "aggregate tok/s (median)",
        tuple(series),
        limits,
        log_x=True,
        log_y=bool(req.limit),
    )


def _prefill_medians(result: dict) -> dict[int, float]:
    out = {}
    for size in dict.fromkeys(r["size"] for r in result["records"]):
        secs = median([r["seconds"] for r in result["records"] if r["size"] == size])
        out[int(size)] = size / secs if secs else 0.0
    return out


def prefill_panel(result: dict, req: PlotRequest) -> Panel:
    """Prompt tok/s against prompt length (median of the rounds); the peer's; the card's limit."""
    ours = _prefill_medians(result)
    series = [Series(req.label, tuple(ours), tuple(ours.values()), OURS)]
    if req.peer:
        theirs = _prefill_medians(req.peer)
        series.append(Series(req.peer_label, tuple(theirs), tuple(theirs.values()), PEER))
    limits = (Series("card limit", tuple(ours), (req.limit,) * len(ours)),) if req.limit else ()
    peer_far = req.peer is not None and min(series[-1].y or (1,)) * 20 < max(ours.values())
    return Panel(
        "prompt processing against length",
        "prompt tokens",
        "tok/s (median)",
        tuple(series),
        limits,
        log_x=True,
        log_y=peer_far,
    )


def plot_one(panel: Panel, req: PlotRequest, title: str) -> Drawn:
    drawn = draw([panel], req.path, title)[0]
    print(f"chart: {req.path}")
    return drawn


def _serve_series(runs: list[dict], key: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    xs = tuple(float(r["concurrency"]) for r in runs)
    return xs, tuple(float(r[key]) if r.get(key) is not None else math.nan for r in runs)


def serve_panels(runs: list[dict], req: PlotRequest) -> list[Panel]:
    """`bench serve`: output tok/s, and time per output token at p50 and p99, against the
    concurrency; the peer's beside ours."""
    sides = [(req.label, runs, OURS)]
    if req.peer:
        sides.append((req.peer_label, req.peer["runs"], PEER))
    rate = [Series(label, *_serve_series(r, "output_tok_s"), color) for label, r, color in sides]
    tpot = []
    for label, r, color in sides:
        tpot.append(Series(f"{label} p50", *_serve_series(r, "tpot_p50_ms"), color))
        tpot.append(Series(f"{label} p99", *_serve_series(r, "tpot_p99_ms")))
    return [
        Panel("served output", "concurrent requests", "output tok/s", tuple(rate), log_x=True),
        Panel("time per output token", "concurrent requests", "ms", tuple(tpot), log_x=True),
    ]
