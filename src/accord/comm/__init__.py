"""accord.comm."""
