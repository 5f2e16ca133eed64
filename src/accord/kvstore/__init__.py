"""accord.kvstore."""
