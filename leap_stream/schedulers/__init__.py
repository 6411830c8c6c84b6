"""Scheduler integrations: adapters that put a ranking where a scheduler decides.

- `slurm`: the rankings cache that the job_submit plugin of deploy/slurm reads;
- `skypilot`: the admin policy served by `leap-stream serve`;
- `kueue`: the admission-gate controller (untested against a live cluster).
"""
