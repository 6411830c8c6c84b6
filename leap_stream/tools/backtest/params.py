"""The backtest's settings and the names of what it reports."""

from __future__ import annotations

PREDICTORS = ("model", "lookup", "oracle")
# the informed and the attainable oracle (tools/sim/informed.py): the ceilings every model
# figure is read against — what enough of a fleet's data determines, and what its runs so far do
INFORMED = "informed"
ATTAINABLE = "attainable"
CEILINGS = (INFORMED, ATTAINABLE)
KIND_KEYS = ("self", "transfer", "model")
# transfer rows by whether the lineage's prior is on the candidate's vendor
TRANSFER_KEYS = ("transfer_same_vendor", "transfer_cross_vendor")
# the figures reported as model / each ceiling (`ceiling`)
CEILING_KEYS = ("accuracy", "accuracy_ran", "top1", "savings")
# Nightly training set: every point-in-time row so far, as the trainer reads the whole dataset,
# subsampled (~25k measured rows a day at the simulator's full rate, 30000/day). A window of the
# last days loses, in closed loop, the pairs the users ran and the ranking no longer chooses
# (docs/research/2026-12-07-training-window-and-pair-levels.md). 0: everything.
TRAIN_WINDOW_DAYS = 0
TRAIN_ROWS = 150_000
DEFAULT_RATE = 30000
ABLATION_KEYS = ("accuracy", "accuracy_ran", "mape", "top1", "savings")
# Resamples of the fleet's lineages behind the savings share's interval. The share is decided
# by the few largest jobs (docs/decisions/0006), and a lineage's jobs
# recur night after night, so it says how far the figure would move on another draw of them.
SAVINGS_REPLICATES = 200
