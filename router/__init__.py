"""The router role (see DESIGN.md)."""
