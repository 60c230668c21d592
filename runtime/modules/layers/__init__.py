"""The layers the blocks are built from: linears, dropout, norms, activations, argument and sequence checks."""
