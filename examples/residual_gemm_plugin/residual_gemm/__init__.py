"""The `residual` example variant (docs/writing-a-plugin.md)."""
