"""accord.torch."""
