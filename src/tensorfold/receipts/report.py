"""Output shared by the receipts: aligned text tables, medians, JSON records, verdict lines."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    numeric = [all(_is_number(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or v is None


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4e}" if v and (abs(v) < 1e-2 or abs(v) >= 1e6) else f"{v:.2f}"
    return str(v)


def progress(total: int, desc: str):
    """A bar on stderr for long runs, shown on a terminal only (the tables go to stdout)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", disable=None, leave=False)


def median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")


def verdict(name: str, failures: int, total: int) -> int:
    """Prints the last line of a check and returns its exit code (0 pass, 1 fail)."""
    word = "PASS" if failures == 0 else "FAIL"
    print(f"{name}: {word} ({total - failures}/{total} passed, {failures} failed)")
    return 0 if failures == 0 else 1
