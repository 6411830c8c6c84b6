"""HistoryBook applied from job-completed events: the same rules as the field-by-field apply."""

from __future__ import annotations

from leap_stream.contracts.timestamps import epoch_s
from leap_stream.core.history import HistoryBook
from leap_stream.tools import synthetic_events as synthetic


def test_apply_completion_is_apply_with_the_event_fields() -> None:
    completions = [c for _s, c in synthetic.pairs(300, seed=4, lineages=20)]
    by_event, by_fields = HistoryBook(), HistoryBook()
    measured = [by_event.apply_completion(c) for c in completions]
    for c in completions:
        by_fields.apply(
            c["lineage_id"],
            c["model_type"],
            c["hardware_type"],
            c["status"],
            (c.get("throughput") or {}).get("samples_per_s"),
            c["num_devices"],
            epoch_s(c["ended_at"]),
        )
    assert 0 < sum(measured) < len(completions)  # failed attempts measure nothing
    assert by_event.lineage_ids == by_fields.lineage_ids
    assert [by_event.lineage(x) for x in by_event.lineage_ids] == [
        by_fields.lineage(x) for x in by_fields.lineage_ids
    ]
    for mt in by_event.model_types:
        assert by_event.aggregates(mt) == by_fields.aggregates(mt)
