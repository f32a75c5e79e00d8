"""Triton kernels for the CUDA backend. Each has its plain-torch reference in ops/ (see registry)."""
