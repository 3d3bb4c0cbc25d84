"""Benchmarks meant for a CUDA machine (they also run, smaller, on CPU)."""
