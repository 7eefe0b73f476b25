"""The `swiglu` example variant: out = silu(x @ w1) * (x @ w3) in one kernel."""
