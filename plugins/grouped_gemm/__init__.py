"""The `grouped` variant: many independent GEMMs in one launch."""
