"""`leap-stream rankings cache`: the local ranking cache of Slurm's job_submit plugin.

job_submit runs inside slurmctld under its locks, so it must never call the network: it reads
this cache, which this command keeps fresh from the rankings topic. One small file per job and
one per lineage, so the plugin opens exactly one file per submission whatever the cache's size:

    <dir>/job.<job id>       the ranking of that job (when its submission was ranked before sbatch)
    <dir>/lineage.<lineage>  the newest ranking of the lineage (its prior runs' choice)

An id becomes a file name by ``/`` → ``~`` and ``:`` → ``+`` (neither is allowed in an id, so the
mapping is one to one, and the ``.``-prefixed kind keeps any name clear of ``.`` and ``..``).
A file is plain lines that Lua 5.1 reads without a JSON parser:

    leap-ranking 1
    produced_at <epoch seconds>
    job_id <id>
    source <model|lookup>
    model_version <version or ->
    rank <type>              (one line per ranked type, best first)

Files are replaced atomically (never read half written) but not fsynced: the cache is rebuilt
from the topic. Rankings that say nothing (source ``none``) are skipped; files older than
``LEAP_RANKINGS_CACHE_MAX_AGE_S`` are removed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from leap_stream.contracts import parse_ts
from leap_stream.core.placement import ranked_types
from leap_stream.store.files import write_atomic

log = logging.getLogger(__name__)

FORMAT_LINE = "leap-ranking 1"


def file_name(kind: str, ident: str) -> str:
    """The cache file of a job or lineage id (``kind`` is ``job`` or ``lineage``)."""
    return f"{kind}." + ident.replace("/", "~").replace(":", "+")


def cache_entry(ranking: Mapping[str, Any]) -> bytes | None:
    """The file text of a ranking, or None when it ranks nothing."""
    types = ranked_types(ranking)
    if not types:
        return None
    lines = [
        FORMAT_LINE,
        f"produced_at {parse_ts(str(ranking['produced_at'])):.3f}",
        f"job_id {ranking['job_id']}",
        f"source {ranking['source']}",
        f"model_version {ranking.get('model_version') or '-'}",
        *(f"rank {t}" for t in types),
    ]
    return ("\n".join(lines) + "\n").encode()


class RankingsCache:
    """Writes rankings into the cache folder; a lineage's file is replaced only by a newer one."""

    def __init__(self, folder: Path, max_age_s: float) -> None:
        self.folder = folder
        self.max_age_s = max_age_s
        self._lineage_newest: dict[str, float] = {}
        self.written = 0
        self.skipped = 0
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, ranking: Mapping[str, Any], now: float | None = None) -> bool:
        """Cache one ranking; False when it is too old, ranks nothing or is malformed."""
        now = time.time() if now is None else now
        try:
            entry = cache_entry(ranking)
            produced = parse_ts(str(ranking["produced_at"]))
            job_id, lineage = str(ranking["job_id"]), str(ranking["lineage_id"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("not cached: malformed ranking (%r)", exc)
            entry = None
        if entry is None or produced < now - self.max_age_s:
            self.skipped += 1
            return False
        write_atomic(self.folder / file_name("job", job_id), entry, durable=False)
        if produced >= self._lineage_newest.get(lineage, float("-inf")):
            self._lineage_newest[lineage] = produced
            write_atomic(self.folder / file_name("lineage", lineage), entry, durable=False)
        self.written += 1
        return True

    def prune(self, now: float | None = None) -> int:
        """Remove files older than the maximum age; returns how many."""
        cutoff = (time.time() if now is None else now) - self.max_age_s
        removed = 0
        with os.scandir(self.folder) as entries:
            for e in entries:
                ours = e.name.startswith((".", "job.", "lineage.")) and e.is_file()
                if ours and e.stat().st_mtime < cutoff:
                    Path(e.path).unlink(missing_ok=True)
                    removed += 1
        self._lineage_newest = {k: v for k, v in self._lineage_newest.items() if v >= cutoff}
        return removed


__all__ = ["FORMAT_LINE", "RankingsCache", "cache_entry", "file_name"]
