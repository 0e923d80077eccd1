"""The configsvr role (see DESIGN.md)."""
