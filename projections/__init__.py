"""Read models folded from the log."""
