"""Compiling a Triton or Gluon kernel for Hopper on a machine without a card (the CPU tests that
read a kernel's PTX)."""

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
