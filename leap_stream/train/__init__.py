"""Nightly training and the promotion gate (offline: reads the dataset, writes the registry)."""
