"""Developer scripts (benchmarks, GPU smoke checks, the oracle setup); not part of the installed product."""
