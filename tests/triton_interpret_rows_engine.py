"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): triton_interpret_grid_engine.py's
checks with the rows form's kernel in every Gated DeltaNet layer."""

from triton_interpret_grid_engine import main

if __name__ == "__main__":
    main("rows")
