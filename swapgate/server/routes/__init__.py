"""Thin HTTP handlers: they translate requests into calls on the runtime."""
