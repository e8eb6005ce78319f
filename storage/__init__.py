"""Cold tier."""
