"""train (being moved)."""
