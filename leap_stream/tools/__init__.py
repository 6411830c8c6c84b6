"""What runs beside the service, never inside it: local services (`dev`), the fleet simulator
(`sim`), the backtest, the demo, the bench, and synthetic data for tests and benchmarks.

The service (``stream``, ``store``, ``train``) never imports from here; tools import the service.
"""
