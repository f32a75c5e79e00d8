"""What the Gluon few-row product compiles to on Hopper, read on a machine with no GPU.

Triton compiles the kernel for sm_90 with its own ptxas; the report reads the machine code
(nvdisasm, cuobjdump) for each form: registers and shared memory a program, how many programs
fit on one multiprocessor by each, the loop's instructions for each weight value it
dequantizes, and, for every wgmma wait, how many fp32 fmas (the next
weight tile's dequantization) the code issues between the MMAs and the wait. Zero means the
MMAs and the dequantization take turns within a warpgroup rather than overlapping; only other
warpgroups (8 warps, or several programs a multiprocessor) can then fill the gaps.

    PYTHONPATH=src python3 benchmarks/sass_report.py [--bits 4,8] [--rows 1,16,64]

The card's Triton may schedule differently: the report names the version it used.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from tensorfold.ops.triton import gluon_affine as ga

REGISTERS, SHARED, WARPS = 65536, 227 * 1024, 64  # a Hopper multiprocessor's
POINTERS = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "b_ptr": "*bf16", "p_ptr": "*fp32"}


def compiled(bits: int, rows: int, warps: int, staged: bool, ring: bool):
    """The kernel of one form, compiled for sm_90 (16-byte aligned pointers and strides)."""
    fn = ga._affine_swapped
    consts = ga.constants(bits, 64, 1024, ga.row_tile(rows), warps, staged, ring)
    sig = {a: "constexpr" if a in consts else POINTERS.get(a, "i32") for a in fn.arg_names}
    aligned = [i for i, a in enumerate(fn.arg_names) if sig[a] != "constexpr" and a not in "MN"]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = GluonASTSource(fn, sig, consts, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def machine_code(kernel) -> tuple[int, list[str], int]:
    """Registers a thread, the opcodes of the kernel in order, and the instructions of its
    longest loop (a backward branch's body)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        ).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True)
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    ops = re.findall(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass.stdout)
    return regs, ops, _longest_loop(sass.stdout.splitlines())


def _longest_loop(lines: list[str]) -> int:
    """Instructions between a label and a later branch back to it, the most of any loop."""
    where = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", l))}
    longest = 0
    for i, line in enumerate(lines):
        target = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", line)
        start = where.get(target.group(1)) if target else None
        if start is not None and start < i:
            body = [x for x in lines[start:i] if re.search(r"/\*[0-9a-f]+\*/\s", x)]
            longest = max(longest, len(body))
    return longest


def fmas_before_waits(ops: list[str]) -> list[int]:
    """For each wgmma wait, the fp32 fmas issued since the last MMA before it."""
    counts, since = [], None
    for op in ops:
        if op.startswith("HGMMA"):
            since = 0
        elif op.startswith("WARPGROUP.DEPBAR") and since is not None:
            counts.append(since)
            since = None
        elif op.startswith("FFMA") and since is not None:
            since += 1
    return counts


def report(bits: int, rows: int, warps: int, staged: bool, ring: bool) -> str:
    kernel = compiled(bits, rows, warps, staged, ring)
    regs, ops, loop = machine_code(kernel)
    values = ga.BN * ga.STEP_K[bits] // 128  # a thread's weight values a loop step
    shared = kernel.metadata.shared
    by_regs = REGISTERS // (regs * 32 * warps)
    by_shared = SHARED // max(shared, 1)
    form = "ring" if ring else "staged" if staged else "registers"
    overlap = fmas_before_waits(ops)
    per_value = f"{loop / values:.1f}" if loop else "unrolled"
    return (
        f"| {bits} | {rows} | {warps} | {form} | {regs} | {shared // 1024} KiB | {by_regs} | "
        f"{by_shared} | {min(by_regs, by_shared, WARPS // warps)} | "
        f"{sum(o.startswith('HGMMA') for o in ops)} | {per_value} | {overlap} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bits", default="4,8")
    p.add_argument("--rows", default="1,16,64")
    args = p.parse_args()
    print(f"Triton {triton.__version__}, sm_90 (compiled here, not on a card)\n")
    print(
        "| bits | rows | warps | inputs | registers | shared | programs by registers | "
        "by shared | a multiprocessor | MMAs | loop instructions a weight value | "
        "fmas between the MMAs and each wait |"
    )
    print("| --- " * 12 + "|")
    for bits in (int(b) for b in args.bits.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            for warps in (4, 8):
                for staged, ring in ((False, False), (True, False), (False, True)):
                    if staged and bits not in ga.STAGED_BITS:
                        continue
                    print(report(bits, rows, warps, staged, ring), flush=True)


if __name__ == "__main__":
    main()
