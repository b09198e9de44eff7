"""Benchmarks: each runs redline beside its baseline or competitor in one run and prints ratios."""
