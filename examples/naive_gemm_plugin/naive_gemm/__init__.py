"""A third-party variant for gemm-dispatcher: `naive`, one dot product per
output element. It exists to show (and test) that a new variant needs no
change to the core: see docs/writing-a-plugin.md."""
