"""Triton kernels for the CUDA backend. Each has its plain-torch reference in ops/ (see registry)."""

import os

# Every kernel here was written and checked on the card with Triton's floating-point fusion on
# (multiply-adds contracted to fma), Triton's default through 3.9; 3.10 turns it off by default,
# which would change the kernels' bits. Pinned for kernels that do not choose (a user's own
# setting stands).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
