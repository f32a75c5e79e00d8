"""Compiling a Triton or Gluon kernel for Hopper on a machine without a card (the CPU tests that
read a kernel's PTX)."""

import os
import re
import subprocess
import tempfile

import pytest
import triton
from triton.backends.compiler import GPUTarget


def compile_for_hopper(src, num_warps: int = 4):
    """`src` (an ASTSource) compiled for sm_90; the test is skipped on a Triton without ptxas."""
    try:
        return triton.compile(
            src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps)
        )
    except FileNotFoundError as e:  # a Triton wheel without its bundled ptxas
        pytest.skip(f"no ptxas: {e}")


def spill_bytes(ck) -> int | None:
    """Bytes ptxas spills for the compiled kernel's PTX at sm_90a (Triton's bundled ptxas for
    the newest PTX); None when no such ptxas is bundled."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    tool = os.path.join(bin_dir, "ptxas-blackwell")
    if not os.path.exists(tool):
        return None
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ck.asm["ptx"])
        done = subprocess.run(
            [tool, "-arch=sm_90a", "-v", src, "-o", out], capture_output=True, text=True
        )
    if done.returncode != 0:
        return None
    found = re.findall(r"(\d+) bytes spill stores", done.stderr)
    return int(found[0]) if found else None


GLOBAL_ACCESS = re.compile(r"\b(ld\.global|st\.global|cp\.async|atom\.|red\.global)")


def assert_waits_first(ptx: str) -> bool:
    """A kernel launched early (ops/triton/launch.py) waits for the kernel before it, then lets
    the next launch, before its first global load, store or copy."""
    wait = ptx.find("griddepcontrol.wait")
    let = ptx.find("griddepcontrol.launch_dependents")
    first = GLOBAL_ACCESS.search(ptx)
    assert 0 <= wait < let, "no dependent-launch wait, or the next kernel let in before it"
    assert first is None or let < first.start(), f"{first.group(0)} before the wait"
    return True
