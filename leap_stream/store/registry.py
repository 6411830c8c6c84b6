"""The model registry on disk: immutable versions and an atomically replaced ``current`` pointer.

Layout under ``root``::

    versions/<version>/      model.txt, ratio_model.txt, metadata.json, lookup.json (+ MANIFEST.json, ours)
    current                  the promoted version, one line (temp file + os.replace)
    history.jsonl            one line per promotion

A version directory appears whole or not at all (copied to a temp folder, fsynced, renamed), so
the worker polling `watch_token()` never sees half a model. MANIFEST.json holds a SHA-256 of
every file, checked before a load, so a truncated or edited model is refused and the worker keeps
serving the one it has. The registry never parses or unpickles the model files.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from leap_stream.store.files import fsync_dir, fsync_file, write_atomic

T = TypeVar("T")
M = TypeVar("M")

# the files of a model artefact (read and written by store/artefact.py) and the registry's own
MODEL_TEXT = "model.txt"
RATIO_TEXT = "ratio_model.txt"  # the transfer rows' ratio model, when the model has one
METADATA = "metadata.json"
LOOKUP = "lookup.json"
MANIFEST = "MANIFEST.json"
REQUIRED_METADATA = ("version", "trained_at")
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_POINTER_MAX_BYTES = 256  # `current` holds one version name (≤ 128 characters) and a newline


class RegistryError(Exception):
    """Bad input to the registry (missing metadata, unknown version, clashing version)."""


class ModelLoadError(Exception):
    """The current model could not be loaded; keep the one already loaded and count it."""

    def __init__(self, version: str | None, reason: str) -> None:
        super().__init__(f"model {version or '?'}: {reason}")
        self.version = version
        self.reason = reason


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_metadata(model_dir: Path) -> dict[str, Any]:
    """metadata.json of a model directory, checked for the fields everyone relies on."""
    try:
        meta = orjson.loads((model_dir / METADATA).read_bytes())
    except FileNotFoundError as exc:
        raise RegistryError(f"{model_dir}: no {METADATA}") from exc
    except orjson.JSONDecodeError as exc:
        raise RegistryError(f"{model_dir}: {METADATA} is not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise RegistryError(f"{model_dir}: {METADATA} is not an object")
    missing = [k for k in REQUIRED_METADATA if not meta.get(k)]
    if missing:
        raise RegistryError(f"{model_dir}: {METADATA} lacks {', '.join(missing)}")
    version = str(meta["version"])
    if not _VERSION_RE.match(version):
        raise RegistryError(f"{model_dir}: version {version!r} is not a safe folder name")
    return meta


def _manifest(model_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(model_dir)): _sha256(p)
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


class Registry:
    """Publish, promote and load models; safe against crashes at any step."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.versions = self.root / "versions"
        self.pointer = self.root / "current"
        self.history = self.root / "history.jsonl"

    # --- publish
    def publish(self, model_dir: str | os.PathLike[str]) -> str:
        """Copy a model directory in as ``versions/<metadata.version>``; returns the version.

        Publishing the same version again with identical files is a no-op (a retried nightly
        job); different files under an existing version are refused.
        """
        src = Path(model_dir)
        version = str(read_metadata(src)["version"])
        manifest = _manifest(src)
        final = self.versions / version
        if final.exists():
            if self._read_manifest(final) == manifest:
                return version
            raise RegistryError(f"version {version} already published with other files")
        self.versions.mkdir(parents=True, exist_ok=True)
        tmp = self.versions / f".tmp-{version}-{uuid.uuid4().hex}"
        try:
            shutil.copytree(src, tmp)
            (tmp / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            for p in tmp.rglob("*"):
                if p.is_file():
                    fsync_file(p)
            fsync_dir(tmp)
            os.rename(tmp, final)  # atomic; fails if a concurrent publish won the race
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.versions)
        return version

    def prune(self, keep: int = 10) -> list[str]:
        """Delete all but the newest ``keep`` versions (by trained_at) and leftover temp folders.

        Never deletes the current version or the one promoted before it (the rollback target).
        Returns the deleted versions.
        """
        protected = {self.current_version()}
        promotions = self.promotions()
        if promotions:
            protected.add(promotions[-1].get("previous"))
        versions = self.list_versions()
        doomed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
        for v in doomed:
            trash = self.versions / f".del-{v}-{uuid.uuid4().hex}"
            os.rename(self.versions / v, trash)  # gone from readers at once, then removed
            shutil.rmtree(trash, ignore_errors=True)
        if self.versions.is_dir():
            stale = time.time() - 3600  # an hour-old temp folder is no publish in progress
            for p in self.versions.iterdir():
                if p.name.startswith((".tmp-", ".del-")) and p.stat().st_mtime < stale:
                    shutil.rmtree(p, ignore_errors=True)
            fsync_dir(self.versions)
        return doomed

    # --- promote
    def promote(self, version: str, **details: Any) -> None:
        """Make ``version`` current (atomic pointer swap) and log it in history.jsonl.

        ``details`` (gate figures, reason) go into the history line.
        """
        self.verify(version)
        previous = self.current_version()
        write_atomic(self.pointer, version.encode() + b"\n")
        line = {
            "version": version,
            "previous": previous,
            "promoted_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            **details,
        }
        with open(self.history, "ab+") as fh:
            size = fh.seek(0, os.SEEK_END)
            lead = b""
            if size:  # a torn last line (crash mid-append) must not swallow this one
                fh.seek(size - 1)
                lead = b"" if fh.read(1) == b"\n" else b"\n"
            fh.write(lead + orjson.dumps(line, default=str) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def promotions(self) -> list[dict[str, Any]]:
        if not self.history.exists():
            return []
        out = []
        for raw in self.history.read_bytes().splitlines():
            try:
                out.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue  # a torn last line after a crash
        return out

    # --- read
    def current_version(self) -> str | None:
        """The promoted version; None when nothing is. Raises `RegistryError` when ``current``
        is not a small regular file naming a version (a FIFO would block the poll thread, a
        link to a large file would be read whole; its content is never echoed)."""
        try:
            fd = os.open(self.pointer, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symbolic link
            raise RegistryError(f"{self.pointer}: not a regular file ({exc.strerror})") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RegistryError(f"{self.pointer}: not a regular file")
            if st.st_size > _POINTER_MAX_BYTES:
                raise RegistryError(f"{self.pointer}: {st.st_size} bytes, not a version name")
            raw = os.read(fd, _POINTER_MAX_BYTES + 1)
        finally:
            os.close(fd)
        try:
            version = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise RegistryError(f"{self.pointer}: not a version name") from None
        if not version:
            return None
        if not _VERSION_RE.match(version):
            raise RegistryError(f"{self.pointer}: not a version name")
        return version

    def current_dir(self) -> Path | None:
        version = self.current_version()
        return None if version is None else self.versions / version

    def metadata(self, version: str) -> dict[str, Any]:
        path = self.versions / version
        if not _VERSION_RE.match(version) or not path.is_dir():
            raise RegistryError(f"unknown version {version!r}")
        return read_metadata(path)

    def list_versions(self) -> list[str]:
        """Published versions, oldest first by trained_at (then name)."""
        if not self.versions.is_dir():
            return []
        found = []
        for p in self.versions.iterdir():
            if p.is_dir() and not p.name.startswith("."):
                try:
                    found.append((str(read_metadata(p)["trained_at"]), p.name))
                except RegistryError:
                    continue
        return [name for _t, name in sorted(found)]

    def watch_token(self) -> tuple[int, int, int] | None:
        """Changes whenever `current` is replaced (new inode): one stat, cheap to poll."""
        try:
            st = os.stat(self.pointer)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read_manifest(self, path: Path) -> dict[str, str] | None:
        try:
            value = orjson.loads((path / MANIFEST).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def verify(self, version: str) -> Path:
        """The version's folder, after checking metadata and every file's checksum."""
        meta = self.metadata(version)
        path = self.versions / version
        if str(meta["version"]) != version:
            raise RegistryError(f"{path}: metadata says version {meta['version']}")
        want = self._read_manifest(path)
        if want is None:
            raise RegistryError(f"{path}: no readable {MANIFEST}")
        got = _manifest(path)
        if got != want:
            bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            raise RegistryError(f"{path}: files differ from {MANIFEST}: {', '.join(bad)}")
        return path

    def load_current(self, loader: Callable[[Path], T]) -> tuple[str, T] | None:
        """(version, loader(dir)) of the current model; None when nothing is promoted.

        Any failure (missing folder, bad metadata, checksum mismatch, loader error) raises
        `ModelLoadError`: the caller keeps its previous model.
        """
        try:
            version = self.current_version()
        except RegistryError as exc:
            raise ModelLoadError("current", str(exc)) from exc
        if version is None:
            return None
        try:
            path = self.verify(version)
            return version, loader(path)
        except Exception as exc:
            raise ModelLoadError(version, f"{type(exc).__name__}: {exc}") from exc


class CurrentModel(Generic[M]):
    """The worker's view: the last good model, swapped only when a new current loads cleanly."""

    def __init__(self, registry: Registry, loader: Callable[[Path], M]) -> None:
        self.registry = registry
        self.loader = loader
        self.version: str | None = None
        self.model: M | None = None
        self.failures = 0
        self._token: tuple[int, int, int] | None = None

    def poll(self) -> bool:
        """True when a new model was loaded. A failed load keeps the old one and is retried
        on the next pointer change (counted in ``failures``, raised for the metric)."""
        token = self.registry.watch_token()
        if token == self._token:
            return False
        self._token = token
        try:
            if token is None or self.registry.current_version() == self.version:
                return False
            loaded = self.registry.load_current(self.loader)
        except RegistryError as exc:
            self.failures += 1
            raise ModelLoadError("current", str(exc)) from exc
        except ModelLoadError:
            self.failures += 1
            raise
        if loaded is None:
            return False
        self.version, self.model = loaded
        return True


__all__ = [
    "CurrentModel",
    "ModelLoadError",
    "Registry",
    "RegistryError",
    "read_metadata",
]
