"""The benchmark scripts' modules, importable from tests (benchmarks/ is a folder of scripts, not a
package): `from benchmark_modules import inexact`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import inexact  # noqa: E402

__all__ = ["inexact"]
