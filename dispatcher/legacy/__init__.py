"""Migration from CK's legacy Tile Engine: configs, kernel names, the
stream-K benchmark driver and its outputs. See docs/migration.md."""
