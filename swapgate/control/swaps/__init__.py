"""Swaps: the single-flight coordinator, what a running load has read so far, and the log of the
last swaps."""
