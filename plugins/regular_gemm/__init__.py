"""The `regular` variant: data-parallel GEMM, one output block per work item."""
