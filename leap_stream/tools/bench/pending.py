"""The completions a mixed load may still send: each for a job attempt the worker ranked (its
submission is stored) and that has not completed yet.

An attempt completes once (a second completion is an ``attempt_completed`` dead letter), so a
run that replayed the world's completions under new event ids would, from its second run on,
measure dead-lettering rather than the completions path. The pool starts with the completions
of the world's backlog and, after each run, takes in the completions of the submissions that
run sent (the world's completions renamed to the run's job ids, in the simulator's
``ended_at`` order); a run takes its completions from the front.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any


class PendingCompletions:
    def __init__(
        self, submissions: Sequence[dict[str, Any]], completions: Sequence[dict[str, Any]]
    ):
        """``completions``: those of the world's ``submissions`` (same job ids), in order."""
        position = {s["job_id"]: j for j, s in enumerate(submissions)}
        # (the world's submission each completes, the completion), in the simulator's order
        self._of_world = [(position[c["job_id"]], c) for c in completions]
        self._cycle = len(submissions)
        self._queue: deque[dict[str, Any]] = deque(completions)

    def __len__(self) -> int:
        return len(self._queue)

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` (fewer when the pool holds fewer), never to be sent again."""
        return [self._queue.popleft() for _ in range(min(n, len(self._queue)))]

    def add_run(self, sent: Sequence[dict[str, Any]]) -> None:
        """The completions of the submissions a run ``sent``: its i-th submission is a renamed
        copy of the world's (i mod the world's count), so it completes as that one did."""
        for j, c in self._of_world:
            for i in range(j, len(sent), self._cycle):
                s = sent[i]
                self._queue.append(
                    dict(c, job_id=s["job_id"], event_id=f"{c['event_id']}-{s['event_id']}")
                )


__all__ = ["PendingCompletions"]
