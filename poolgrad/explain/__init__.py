"""explain (being moved)."""
