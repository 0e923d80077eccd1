"""The shard role (see DESIGN.md)."""
