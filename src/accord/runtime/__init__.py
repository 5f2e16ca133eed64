"""accord.runtime."""
