"""Benchmarks behind ``homagg bench ...``: they use the same public API as users."""
