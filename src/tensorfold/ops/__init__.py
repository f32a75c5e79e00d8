"""Pure tensor functions. Each op here is the plain-torch reference; GPU kernels sit beside it."""
