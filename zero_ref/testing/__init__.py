"""Helpers for tests and scripts only: the production path never imports this package."""
