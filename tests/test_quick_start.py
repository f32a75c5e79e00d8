"""The README's quick start as printed: `make serve` takes PORT and HOST for its address and ARGS
that do not name a drafter keep `--draft auto` (an `ARGS="--port ..."` used to turn drafting off
silently), and the demo is served as `tensorfold-demo` however its folder is named on the
command line (`serve src/tensorfold/demo/bf16` answered to "bf16", so the tour's receipts 404'd)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "PORT", "HOST", "DRAFT")


def serve_command(*assignments: str) -> str:
    """The command `make serve` would run, as a user's shell would see it: not the variables of a
    `make test` that runs this test (MAKEFLAGS carries its command line to every sub-make)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "serve", *assignments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return next(line for line in done.stdout.splitlines() if "tensorfold serve" in line).strip()


def test_make_serve_keeps_draft_auto_unless_args_name_a_drafter():
    assert serve_command().endswith("--port 8080 --draft auto")
    assert "--draft auto" in serve_command("ARGS=--parallel 8")
    chosen = serve_command("ARGS=--draft ngram")
    assert "--draft ngram" in chosen and "--draft auto" not in chosen
    assert "--host 0.0.0.0 --port 8081" in serve_command("PORT=8081", "HOST=0.0.0.0")


def test_the_demo_is_served_as_tensorfold_demo_however_it_is_named(tmp_path):
    from tensorfold.demo import demo_checkpoint
    from tensorfold.server.cli import served_name

    assert served_name(demo_checkpoint()) == "tensorfold-demo"
    assert served_name(ROOT / "src/tensorfold/demo/bf16") == "tensorfold-demo"
    assert served_name(demo_checkpoint("mlx-4bit")) == "tensorfold-demo"
    assert served_name(tmp_path / "9b-4bit") == "9b-4bit"
