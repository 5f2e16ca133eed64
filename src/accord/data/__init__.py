"""accord.data."""
