"""tools (being moved)."""
