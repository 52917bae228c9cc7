"""The data plane: bodies in, placement, bytes out, unbuffered."""
