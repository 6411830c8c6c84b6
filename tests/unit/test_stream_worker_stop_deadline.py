"""`LEAP_STOP_DEADLINE_S`: a graceful stop that hangs ends the worker with status 4 and every
thread's stack, instead of waiting for the orchestrator's SIGKILL (seen once: a SIGTERM while
Faust's consumer was still joining its group left the stop waiting on the join)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from leap_stream.settings import Settings
from leap_stream.stream.worker import EXIT_STOP_DEADLINE, StopDeadline, stop_on_signals


def test_an_armed_deadline_exits_with_its_status() -> None:
    exited: list[int] = []
    done = threading.Event()

    def record(status: int) -> None:
        exited.append(status)
        done.set()

    deadline = StopDeadline(0.05, exit=record)
    deadline.arm()
    deadline.arm()  # a second signal does not start a second countdown
    assert done.wait(10)
    assert exited == [EXIT_STOP_DEADLINE]


def test_the_deadline_exits_even_when_its_diagnosis_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leap_stream.stream import worker

    def broken(_loop: object) -> None:
        raise ValueError("a task list that cannot be read")

    raised: list[BaseException | None] = []
    monkeypatch.setattr(worker, "_print_tasks", broken)
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    exited: list[int] = []
    deadline = StopDeadline(0.05, exit=exited.append)
    deadline.arm(loop=object())  # type: ignore[arg-type]
    assert deadline._timer is not None
    deadline._timer.join(10)
    assert exited == [EXIT_STOP_DEADLINE]
    assert [type(e) for e in raised] == [ValueError]  # reported, after the exit was called


@pytest.mark.parametrize("seconds", [0.0, 0.2])
def test_no_exit_without_a_deadline_or_after_a_cancel(seconds: float) -> None:
    exited: list[int] = []
    deadline = StopDeadline(seconds, exit=exited.append)
    deadline.arm()
    deadline.cancel()
    threading.Event().wait(0.4)
    assert exited == []


def test_the_default_deadline_is_inside_the_deploy_grace_period() -> None:
    assert 0 < Settings.from_env({}).stop_deadline_s < 60  # deploy/k8s: 60 s


def test_a_signal_arms_the_deadline_and_sets_the_stop() -> None:
    armed: list[bool] = []
    before = signal.getsignal(signal.SIGTERM)
    try:
        stop = stop_on_signals(lambda: armed.append(True))
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stop.is_set() and armed == [True]


# A mode.Worker (Faust's base) whose one service never finishes stopping, as a consumer stuck
# in a group join would; it prints "started" once it runs.
STUCK_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    import mode
    from leap_stream.stream.worker import StopDeadline, with_deadline

    class Stuck(mode.Service):
        async def on_started(self) -> None:
            print("started", flush=True)

        async def on_stop(self) -> None:
            await asyncio.sleep(3600)

    deadline = StopDeadline(float(sys.argv[1]))
    worker = with_deadline(mode.Worker, deadline)(
        Stuck(), loglevel="warning", redirect_stdouts=False
    )
    worker.execute_from_commandline()
    """
)


def test_a_worker_whose_stop_hangs_exits_at_the_deadline() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_WORKER, "1.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_STOP_DEADLINE, err
    assert "LEAP_STOP_DEADLINE_S" in err
    assert "in on_stop" in err  # the waiting task's stack: where the stop hangs
