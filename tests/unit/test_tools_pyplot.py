"""matplotlib is the tools' optional dependency: without it a plot says which extra to install,
and `backtest --plots` says so before it runs, not after."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from leap_stream.tools import pyplot as P


def test_without_matplotlib_a_plot_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    with pytest.raises(P.PlotsUnavailable, match=r"leap-stream\[tools\]"):
        P.pyplot()


def test_with_matplotlib_plots_draw_without_a_display() -> None:
    plt = P.pyplot()
    assert P.plots_available()
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    plt.close(plt.figure())


def test_backtest_plots_without_matplotlib_stops_before_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from leap_stream.settings import Settings
    from leap_stream.tools import backtest
    from leap_stream.tools.backtest import cli as backtest_cli

    monkeypatch.setattr(P, "plots_available", lambda: False)
    ran: list[object] = []
    monkeypatch.setattr(backtest_cli, "run_backtest", lambda **kw: ran.append(kw))
    parser = argparse.ArgumentParser()
    backtest.register(parser)
    args = parser.parse_args(["--nights", "1", "--plots", str(tmp_path)])
    assert backtest.run(args, Settings.from_env({})) == 2
    assert not ran
    assert "leap-stream[tools]" in capsys.readouterr().err
