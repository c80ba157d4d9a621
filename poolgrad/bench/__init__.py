"""bench (being moved)."""
