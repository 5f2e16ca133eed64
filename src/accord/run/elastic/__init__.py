"""Elastic jobs: the driver, its configuration, pure plans, the start and its limits, the store keys,
host discovery, the blacklist, and copying the working folder to hosts that join."""
