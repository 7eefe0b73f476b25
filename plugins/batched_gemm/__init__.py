"""The `batched` variant: strided-batched GEMM with numpy matmul semantics."""
