"""Helpers for tools/bench_h200.py, one job per module: the gateway process, its /metrics, GPU
activity, the load-test points, the cloned voices, and the report. Scripts only: nothing here is part
of the product."""
