"""Helpers that tests and benchmarks share: random cross-process interleavings checked against exact search."""
