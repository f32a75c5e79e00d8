"""What the host-side primitives around a graph replay cost on this machine, in µs of host time
(medians): a pass's fed ids built from Python lists (by torch, or through numpy as the runner
does) and copied from pageable memory against written into a pinned buffer, the same copies
while the stream is still busy (whether the call waits for the card), a pinned buffer made per
step, a logits clone, an event, a read back. Prints a table last.

    PYTHONPATH=src python3 benchmarks/host_ops.py [--reps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tensorfold.util import longs


def timed(fn, reps: int, busy: bool = False) -> float:
    """Median host µs of fn(); with `busy`, each call made while ~1 ms of sleep is queued ahead."""
    out = []
    for _ in range(reps):
        if busy:
            torch.cuda._sleep(1_000_000)
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
        if busy:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return 1e6 * statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2000)
    args = p.parse_args()
    dev = torch.device("cuda")
    rows_list = (1, 5, 8, 128)
    table = []
    for rows in rows_list:
        ids, pos = list(range(7, 7 + rows)), list(range(300, 300 + rows))
        dst = torch.zeros(2, rows, dtype=torch.long, device=dev)
        pinned = torch.zeros(2, rows, dtype=torch.long, pin_memory=True)
        view = pinned.numpy()
        event = torch.cuda.Event()

        def lists():
            torch.tensor([ids, pos])

        def pageable():
            dst.copy_(torch.tensor([ids, pos]), non_blocking=True)

        def through_numpy():  # the runner's way (util.longs)
            dst.copy_(longs((ids, pos)), non_blocking=True)

        def staged():
            event.synchronize()
            view[0, :] = ids
            view[1, :] = pos
            dst.copy_(pinned, non_blocking=True)
            event.record()

        ways = (("lists", lists), ("pageable", pageable), ("numpy", through_numpy))
        for name, fn in ways + (("pinned", staged),):
            table.append((f"{name} copy, {rows} rows", timed(fn, args.reps)))
            if name != "lists":
                table.append((f"{name} copy, {rows} rows, stream busy", timed(fn, 200, True)))
    small = torch.zeros(8, dtype=torch.long, device=dev)

    def pin_each():
        h = torch.empty(small.shape, dtype=small.dtype, pin_memory=True)
        h.copy_(small, non_blocking=True)
        torch.cuda.Event().record()

    table.append(("pinned buffer + event made per step, 8 tokens", timed(pin_each, args.reps)))
    table.append(("event record", timed(lambda: torch.cuda.Event().record(), args.reps)))
    table.append(("tolist of 8 tokens (sync)", timed(lambda: small.tolist(), args.reps)))
    for vocab in (2048, 248_320):
        for rows in (1, 8):
            logits = torch.zeros(rows, vocab, device=dev)
            table.append((f"logits clone [{rows}, {vocab}]", timed(logits.clone, args.reps)))
    x = torch.zeros(1, device=dev)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        x.add_(1)
    table.append(("replay of a one-kernel graph", timed(graph.replay, args.reps)))
    print("| primitive | host µs |")
    print("| --- | --- |")
    for name, us in table:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
