"""accord.run."""
