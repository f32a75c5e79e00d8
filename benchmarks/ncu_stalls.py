"""Reads Nsight Compute's raw page (`ncu --import R.ncu-rep --page raw --csv`) on stdin and prints a
line per kernel: its time, DRAM and SM throughput, occupancy, registers, cycles per issued
instruction and the reasons its warps stalled, largest first (warps stalled per issued
instruction, so the reasons add up to the cycles between two issues of a warp).

    ncu --import /tmp/p.ncu-rep --page raw --csv | python3 benchmarks/ncu_stalls.py
"""

from __future__ import annotations

import csv
import sys

COLUMNS = {
    "gpu__time_duration.sum": "µs",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram %",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "launch__registers_per_thread": "regs",
    "launch__occupancy_limit_registers": "blocks/SM by regs",
    "launch__occupancy_limit_shared_mem": "blocks/SM by smem",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue %",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles/issue",
}
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main() -> None:
    rows = list(csv.reader(sys.stdin))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    names, units, body = rows[head], rows[head + 1], rows[head + 2 :]
    for row in body:
        if len(row) != len(names):
            continue
        rec = dict(zip(names, row))
        unit = dict(zip(names, units))
        parts = [f"{rec.get('ID', '?')} {rec['Kernel Name'][:40]}"]
        for key, label in COLUMNS.items():
            value = number(rec.get(key, ""))
            if value is not None and key == "gpu__time_duration.sum":
                scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
                value *= scale.get(unit.get(key, "ns").strip(), 1e-3)
            if value is not None:
                parts.append(f"{label} {value:,.2f}")
        stalls = []
        for key, text in rec.items():
            if key.startswith(STALL[0]) and key.endswith(STALL[1]):
                value = number(text)
                if value:
                    stalls.append((value, key[len(STALL[0]) : -len(STALL[1])]))
        stalls.sort(reverse=True)
        parts.append("stalls " + ", ".join(f"{name} {v:.2f}" for v, name in stalls[:8]))
        print(" | ".join(parts))


if __name__ == "__main__":
    main()
