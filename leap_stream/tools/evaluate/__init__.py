"""`leap-stream evaluate`: cross-hardware prediction checked on a real benchmark table.

A fleet team will not trust a model validated only on our simulator. This tool takes a table of
measured throughputs (a CSV in the documented shape, or one of the public tables' own shapes),
predicts every measurement of a workload on one accelerator type from its measurement on
another, learning only from the table's *other* workloads, and prints how well leap-stream's
transfer estimator and four baselines do (docs/evaluate.md).
"""
