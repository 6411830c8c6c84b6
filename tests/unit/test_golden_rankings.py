"""Golden rankings: a fixed set of submissions, histories and a fixed model rank byte for byte as
recorded in tests/golden/rankings.jsonl.

The model is fitted here from the seeded synthetic dataset, so the file pins the fit, the
features, the prediction, the ranking and the encoding together. A change that is meant to move
rankings regenerates it (``LEAP_WRITE_GOLDEN=1 pytest tests/unit/test_golden_rankings.py``) and
says why in its commit; a refactor must leave it untouched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.contracts import Ok, decode, encode
from leap_stream.core.aggregates import AggregateTable
from leap_stream.core.history import TypeAggregates
from leap_stream.core.lookup import LookupTable
from leap_stream.core.ranker import Ranker
from leap_stream.tools import synthetic_rows as S
from leap_stream.train import pit

GOLDEN = Path(__file__).parents[1] / "golden" / "rankings.jsonl"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
JOBS = 240


def _rank_fixed_set(table: bool = False) -> list[bytes]:
    data = S.dataset(4000, seed=7)
    train, serve = data.iloc[:3000], data.iloc[3000 : 3000 + JOBS]
    measured = pit.measured(train)
    model = S.fitted_model(train, num_rounds=40)
    model.metadata["version"] = "golden"  # the fitted version carries the wall clock
    ranker = Ranker(load_catalog(), model, LookupTable.fit(train))
    # the serving rows see every training completion: lineages seen before get their history
    served = pit.replay(measured, serve.assign(submitted_at=NOW))
    submissions: list[Any] = []
    for i in range(len(serve)):
        raw = orjson.dumps(S.submission_event(serve.iloc[i]))
        decoded = decode(raw, "job-submitted", max_bytes=1 << 20)
        assert isinstance(decoded, Ok), decoded
        submissions.append(decoded.event)
    aggregates: Mapping[str, TypeAggregates] = {
        str(mt): agg for mt, agg in zip(serve["model_type"], served.aggregates, strict=True) if agg
    }
    if table:  # as the online store reads them
        aggregates = AggregateTable.of(aggregates)
    # every fifth job ranks as if Redis were down (no history)
    histories = [None if i % 5 == 4 else h for i, h in enumerate(served.histories)]
    rankings = ranker.rank_batch(submissions, histories, aggregates, NOW)
    return [encode(r) for r in rankings]


@pytest.mark.parametrize("table", [False, True], ids=["dicts", "table"])
def test_rankings_match_the_golden_file(table: bool) -> None:
    """The aggregates as dicts (the backtest, serve) and as the online store's flat table."""
    lines = _rank_fixed_set(table)
    if os.environ.get("LEAP_WRITE_GOLDEN") == "1" and not table:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(b"\n".join(lines) + b"\n")
    want = GOLDEN.read_bytes().splitlines()
    assert len(lines) == len(want) == JOBS
    sources = {orjson.loads(line)["source"] for line in want}
    assert "model" in sources  # the file exercises the model, not only the fallbacks
    for i, (got, expected) in enumerate(zip(lines, want, strict=True)):
        if got != expected:
            pytest.fail(f"ranking {i} differs from the golden file:\n{got!r}\n{expected!r}")
