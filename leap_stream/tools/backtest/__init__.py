"""`leap-stream backtest`: nightly retrains against the fleet simulator's ground truth
(its reference: docs/model.md).

`loop` runs the nights (`run_backtest`), `truth` holds a night's ground truth, `scoring` scores a
night, `summary` pools the nights, `scenarios` has the new-hardware and drift scenarios,
`params` the settings, `cli` the command.
"""

from leap_stream.tools.backtest.cli import register, run
from leap_stream.tools.backtest.loop import run_backtest
from leap_stream.tools.backtest.params import DEFAULT_RATE
from leap_stream.tools.backtest.scenarios import drift_recovery, new_hardware_summary, parse_drift
from leap_stream.tools.backtest.scoring import LineageResamples, savings_replicates
from leap_stream.tools.backtest.truth import Night, NightTruth

__all__ = [
    "DEFAULT_RATE",
    "LineageResamples",
    "Night",
    "NightTruth",
    "drift_recovery",
    "new_hardware_summary",
    "parse_drift",
    "register",
    "run",
    "run_backtest",
    "savings_replicates",
]
