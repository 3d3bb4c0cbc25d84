"""Benchmarks of FAE; scripts run from the repository root (``python benchmarks/bench_train.py``)."""
