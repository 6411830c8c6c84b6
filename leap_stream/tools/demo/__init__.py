"""`leap-stream demo`: the whole service on one machine, with a report built from the real run.

`runner.py` drives the services, the simulator, the trainer and the worker process;
`report.py` turns what came back (rankings, latencies, the simulator's truth) into figures
with plain functions; `plots.py` and `html.py` draw and inline them.
"""
