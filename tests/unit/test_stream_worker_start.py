"""`leap-stream worker` start-up: a SIGTERM that arrives while the worker is still starting
(loading the model, before Faust takes the signals over) stops it cleanly, exit 0, instead of
killing it (an orchestrator sends SIGTERM whenever it likes)."""

from __future__ import annotations

import argparse
import os
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from leap_stream.settings import Settings
from leap_stream.stream import worker


@pytest.mark.parametrize("roles", ["submissions", "submissions,completions"])
def test_a_sigterm_while_starting_stops_the_worker_cleanly(
    monkeypatch: pytest.MonkeyPatch, roles: str
) -> None:
    import faust

    from leap_stream.stream import app

    cfg = Settings.from_env(
        {
            "LEAP_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "LEAP_REDIS_URL": "redis://127.0.0.1:1/0",
            "LEAP_WORKER_ROLES": roles,
        }
    )
    served: list[Any] = []
    loop_ran: list[bool] = []

    def building(_cfg: Settings, _kafka: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # mid start-up: the model is loading
        metrics = SimpleNamespace(serve=lambda *a, **k: served.append(a))
        return SimpleNamespace(metrics=metrics, ready=None)

    class NoFaust:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            pass

        def execute_from_commandline(self) -> None:
            raise AssertionError("Faust started after a SIGTERM")

    def loop_once(_deps: Any, stop: Any) -> int:
        loop_ran.append(stop.is_set())
        return 0

    monkeypatch.setattr(worker, "missing_topics", lambda *_a: [])
    monkeypatch.setattr(worker, "build_deps", building)
    monkeypatch.setattr(worker, "tune_gc", lambda _cfg: None)
    monkeypatch.setattr(app, "build_app", lambda _deps: None)
    monkeypatch.setattr(app, "run_submissions_only", loop_once)
    monkeypatch.setattr(faust, "Worker", NoFaust)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # stands in for the default action (death) without killing the test session
    unhandled: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: unhandled.append(signum))
    try:
        rc = worker.run(argparse.Namespace(loglevel=None, metrics_port=0), cfg)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert unhandled == [], "the SIGTERM reached no handler of the worker's"
    assert rc == 0
    assert served  # it got as far as serving its metrics
    if roles == "submissions":
        assert loop_ran == [True]  # the loop sees the stop at once
    else:
        assert loop_ran == []


def test_the_cli_holds_stop_signals_only_while_the_worker_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`leap-stream worker` blocks SIGTERM/SIGINT until the worker has its handlers (the e2e
    test stops a worker 0.05 s after it holds them); a worker that fails before that (a bad setting,
    exit 2) leaves them unblocked, and other commands never block them."""
    from leap_stream import cli

    def blocked() -> set[int]:
        return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    seen: list[set[int]] = []
    monkeypatch.setenv("LEAP_BATCH_SIZE", "many")
    monkeypatch.setattr(worker, "register", lambda _p: seen.append(blocked()))
    assert cli.main(["worker"]) == 2
    assert seen == [{signal.SIGTERM, signal.SIGINT}]  # held while the command loaded
    assert not blocked() & {signal.SIGTERM, signal.SIGINT}
    assert cli.main(["config"]) == 2
    assert not blocked() & {signal.SIGTERM, signal.SIGINT}
