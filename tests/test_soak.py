"""The soak (benchmarks/soak.py) in a half-minute form: good, hostile and cancelled requests and
half-sent connections from six clients, with no unexpected answer, the probe's tokens and
logprobs unchanged and memory flat. Half a minute runs every hostile case a dozen times or more."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from server_harness import make_engine, start_server

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
DURATION_S = 30


@pytest.mark.slow
def test_soak(hf_tiny, tmp_path):
    server = start_server(make_engine(hf_tiny))
    try:
        out = tmp_path / "soak.json"
        run = subprocess.run(
            [
                sys.executable,
                str(SOAK),
                "--url",
                server.url,
                "--duration",
                str(DURATION_S),
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=DURATION_S + 120,
        )
        assert out.exists(), run.stderr[-3000:]
        figures = json.loads(out.read_text())
    finally:
        server.stop()
    print(json.dumps(figures))
    assert figures["errors"] == 0, figures["failures"]
    assert figures["probe_changes"] == 0 and figures["probes"] >= DURATION_S // 3
    assert figures["requests"] >= 10 * DURATION_S
    assert all(
        figures["by_case"].get(case, 0) > 0
        for case in ("good", "stream", "hostile", "cancel", "unknown_fields", "half_sent")
    )
    assert figures["rss_end_mib"] - figures["rss_start_mib"] < 200
    assert run.returncode == 0
