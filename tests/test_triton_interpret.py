"""The Triton kernels' logic on the CPU, through Triton's interpreter (tiny shapes, fp16)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_kernels_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("triton_interpret_check.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match their references" in done.stdout


def test_moe_kernels_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("triton_interpret_moe.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "moe kernels match their references" in done.stdout


def test_partial_sums_under_the_triton_interpreter():
    """A product's segment sums added inside the residual add and silu · up give their bits."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("triton_interpret_partial.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "partial sums match the products' own sums" in done.stdout
