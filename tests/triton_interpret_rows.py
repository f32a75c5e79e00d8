"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the rows form's kernel
(ops/triton/gated_delta_rows.py) through triton_interpret_grid.py's checks: its rows against the
chunk form's fp32 reference, and bitwise: any cuts of a prompt (decode rows included) = one call,
a lane beside others = alone, a graph pass's layout = an eager pass's; each planted fault caught."""

from triton_interpret_grid import check_form

from tensorfold.ops.triton import gated_delta_rows as rows


def main() -> None:
    cuts = [37] * 4 + [2]
    check_form(rows.rows_lanes, [(rows.FAULT_TAIL_SKIPPED, cuts), (rows.FAULT_EARLY_STATE, cuts)])
    print("rows form matches its reference and itself")


if __name__ == "__main__":
    main()
