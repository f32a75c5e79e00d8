"""The GPU kernels' checks: each kernel against its plain-torch reference on the shapes it
serves, and the planted faults that prove each check can fail (`python -m
tensorfold.checks.registry`)."""
