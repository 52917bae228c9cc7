"""swapgate's benchmarks: ``python -m bench`` (``make bench``), written to docs/benchmarks.md."""
