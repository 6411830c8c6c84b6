"""Training, the promotion gate and the backtest (offline; reads the dataset, writes the registry)."""
