"""The Triton kernels' logic on the CPU, through Triton's interpreter (tiny shapes, fp16): each
script runs in a process of its own with TRITON_INTERPRET=1 and prints its line when every
check in it passed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPTS = {
    # the products, norms, attention, conv, gates, recurrence and sampling kernels
    "triton_interpret_check.py": "match their references",
    # the grouped expert kernels, routing and the weighted sum
    "triton_interpret_moe.py": "moe kernels match their references",
    # a product's segment sums added inside the residual add + norm and silu · up
    "triton_interpret_partial.py": "partial sums match the products' own sums",
    # a GDN layer's in-projection sums added by the conv, the gates, the recurrence and the gated
    # norm; an MoE block's router and shared gate sums by the routing and the weighted sum
    "triton_interpret_sum_readers.py": "segment sums read where they are used",
    # the interpreter's bounds check (used by the grid checks) catches stray addresses
    "triton_interpret_bounds.py": "bounds checked",
    # the grid form's one-launch chunk kernel: its reference, cuts, lanes, graph layout, controls
    "triton_interpret_grid.py": "grid form matches its reference and itself",
    # a tiny model's engine with the grid kernel in its GDN layers: decode, chunks, lanes
    "triton_interpret_grid_engine.py": "grid engine equals itself across passes and lanes",
    # the rows form's kernel (a pass's new rows only): its reference, cuts, lanes, graph layout
    "triton_interpret_rows.py": "rows form matches its reference and itself",
    # and in a tiny model's engine
    "triton_interpret_rows_engine.py": "rows engine equals itself across passes and lanes",
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_kernels_under_the_triton_interpreter(script):
    env = dict(os.environ, TRITON_INTERPRET="1")
    path = Path(__file__).with_name(script)
    done = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert SCRIPTS[script] in done.stdout
