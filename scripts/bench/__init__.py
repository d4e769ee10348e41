"""Benchmarks and checks: each runnable script prints a JSON line last."""
