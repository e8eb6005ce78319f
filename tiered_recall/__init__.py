"""tiered-recall."""
