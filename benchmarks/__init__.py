"""Benchmark scripts: each prints its figures beside the targets; none asserts on time."""
