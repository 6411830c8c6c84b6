"""Stores, split the Feast way: online (Redis history), offline (Parquet dataset), registry (models)."""
