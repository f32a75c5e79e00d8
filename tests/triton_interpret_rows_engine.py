"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): triton_interpret_grid_engine.py's
checks with the rows form's kernel in every Gated DeltaNet layer: decode = prefill logits and
close to the chunk reference (cuts, lanes, several-row passes and the graph layout are
triton_interpret_rows.py's)."""

from triton_interpret_grid_engine import main

if __name__ == "__main__":
    main("rows", every=False)
