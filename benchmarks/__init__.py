"""Reproductions of this project's own measurements, run from a checkout: none of it is in the
installed package, and the package imports nothing of it (benchmarks/README.md)."""
