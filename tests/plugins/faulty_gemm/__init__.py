"""A test-only variant whose kernels misbehave on purpose (tile engine isolation tests)."""
