"""The model registry on a temp folder, with real LightGBM text models."""

from __future__ import annotations

import os
from pathlib import Path

import lightgbm as lgb
import numpy as np
import orjson
import pytest

from leap_stream.store.registry import CurrentModel, ModelLoadError, Registry, RegistryError


def _model_dir(base: Path, version: str, trained_at: str = "2026-12-01T02:00:00Z") -> Path:
    rng = np.random.default_rng(abs(hash(version)) % 2**32)
    x = rng.normal(size=(200, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(scale=0.1, size=200)
    booster = lgb.train(
        {"objective": "regression", "verbose": -1, "num_leaves": 4, "num_threads": 1},
        lgb.Dataset(x, y),
        num_boost_round=5,
    )
    d = base / f"build-{version}"
    d.mkdir(parents=True)
    booster.save_model(str(d / "p50.txt"))
    (d / "metadata.json").write_bytes(orjson.dumps({"version": version, "trained_at": trained_at}))
    return d


def _load(path: Path) -> lgb.Booster:
    return lgb.Booster(model_file=str(path / "p50.txt"))


def test_publish_promote_load(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    assert reg.current_version() is None and reg.watch_token() is None
    assert reg.load_current(_load) is None
    v1 = reg.publish(_model_dir(tmp_path, "v1", "2026-12-01T02:00:00Z"))
    v2 = reg.publish(_model_dir(tmp_path, "v2", "2026-12-02T02:00:00Z"))
    assert (v1, v2) == ("v1", "v2")
    assert reg.list_versions() == ["v1", "v2"]
    assert reg.metadata("v2")["trained_at"] == "2026-12-02T02:00:00Z"
    assert not [p for p in (tmp_path / "reg" / "versions").iterdir() if p.name.startswith(".")]

    reg.promote("v1", reason="first")
    t1 = reg.watch_token()
    reg.promote("v2", gate={"accuracy": 0.81})
    assert reg.watch_token() != t1
    assert reg.current_version() == "v2" and reg.current_dir() == tmp_path / "reg/versions/v2"
    version, booster = reg.load_current(_load) or ("", None)
    assert version == "v2" and booster is not None
    assert booster.predict(np.zeros((1, 3))).shape == (1,)
    hist = reg.promotions()
    assert [h["version"] for h in hist] == ["v1", "v2"]
    assert hist[1]["previous"] == "v1" and hist[1]["gate"] == {"accuracy": 0.81}


def test_publish_is_idempotent_and_refuses_clashes(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    src = _model_dir(tmp_path, "v1")
    assert reg.publish(src) == reg.publish(src) == "v1"
    (src / "p50.txt").write_text("tree\n")
    with pytest.raises(RegistryError, match="already published"):
        reg.publish(src)


@pytest.mark.parametrize(
    "meta",
    [
        None,
        b"{not json",
        orjson.dumps({"version": "v9"}),
        orjson.dumps({"version": "../x", "trained_at": "t"}),
    ],
)
def test_publish_validates_metadata(tmp_path: Path, meta: bytes | None) -> None:
    src = _model_dir(tmp_path, "v9")
    if meta is None:
        (src / "metadata.json").unlink()
    else:
        (src / "metadata.json").write_bytes(meta)
    with pytest.raises(RegistryError):
        Registry(tmp_path / "reg").publish(src)
    assert Registry(tmp_path / "reg").list_versions() == []


def test_promote_unknown_version_fails(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    with pytest.raises(RegistryError):
        reg.promote("nope")
    assert reg.current_version() is None


def test_truncated_current_model_never_replaces_the_loaded_one(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    reg.publish(_model_dir(tmp_path, "v1"))
    reg.promote("v1")
    watcher = CurrentModel(reg, _load)
    assert watcher.poll() and watcher.version == "v1"
    good = watcher.model
    assert not watcher.poll()  # nothing changed: one stat, no reload

    reg.publish(_model_dir(tmp_path, "v2"))
    reg.promote("v2")
    model_file = reg.versions / "v2" / "p50.txt"
    data = model_file.read_bytes()
    model_file.write_bytes(data[: len(data) // 2])  # truncated after promotion
    with pytest.raises(ModelLoadError) as info:
        watcher.poll()
    assert info.value.version == "v2" and "p50.txt" in info.value.reason
    assert watcher.version == "v1" and watcher.model is good and watcher.failures == 1

    model_file.write_bytes(data)  # repaired and re-promoted
    reg.promote("v2")
    assert watcher.poll() and watcher.version == "v2"


def test_loader_errors_are_typed(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.publish(_model_dir(tmp_path, "v1"))
    reg.promote("v1")

    def broken(path: Path) -> None:
        raise ValueError("feature names do not match")

    with pytest.raises(ModelLoadError, match="feature names"):
        reg.load_current(broken)


def test_torn_history_line_is_skipped(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.publish(_model_dir(tmp_path, "v1"))
    reg.promote("v1")
    with open(reg.history, "ab") as fh:
        fh.write(b'{"version": "v2", "prom')  # crash mid-append
    assert [h["version"] for h in reg.promotions()] == ["v1"]
    reg.promote("v1", reason="again")  # starts on a fresh line
    assert [h.get("reason") for h in reg.promotions()] == [None, "again"]
    assert os.path.exists(reg.pointer)


def test_prune_keeps_current_and_rollback_target(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    for i in range(6):
        src = tmp_path / f"m{i}"
        src.mkdir()
        (src / "model.txt").write_text(f"tree {i}\n")
        meta = {"version": f"v{i}", "trained_at": f"2026-12-0{i + 1}T00:00:00Z"}
        (src / "metadata.json").write_bytes(orjson.dumps(meta))
        reg.publish(src)
    reg.promote("v0")
    reg.promote("v1")  # current v1, rollback target v0: both old, both kept
    (reg.versions / ".tmp-v9-crashed").mkdir()
    os.utime(reg.versions / ".tmp-v9-crashed", (0, 0))  # long ago
    (reg.versions / ".tmp-v8-in-progress").mkdir()
    assert reg.prune(keep=2) == ["v2", "v3"]
    assert reg.list_versions() == ["v0", "v1", "v4", "v5"]
    left = sorted(p.name for p in reg.versions.iterdir())
    assert left == [".tmp-v8-in-progress", "v0", "v1", "v4", "v5"]
    assert reg.load_current(lambda p: (p / "model.txt").read_text()) == ("v1", "tree 1\n")


def _loaded_registry(tmp_path: Path) -> tuple[Registry, CurrentModel[Path]]:
    r = Registry(tmp_path / "reg")
    v = r.publish(_model_dir(tmp_path, "v1"))
    r.promote(v)
    cur: CurrentModel[Path] = CurrentModel(r, lambda p: p)
    assert cur.poll() and cur.version == "v1"
    return r, cur


@pytest.mark.parametrize("kind", ["fifo", "symlink", "large", "not a name"])
def test_a_hostile_current_pointer_is_refused_unread(tmp_path: Path, kind: str) -> None:
    """`current` must be a small regular file naming a version: a FIFO used to block the poll
    thread (and the lag gauge behind it), a link to a large file was read whole and logged."""
    r, cur = _loaded_registry(tmp_path)
    secret = "s3cr3t-" + "x" * 64
    r.pointer.unlink()
    if kind == "fifo":
        os.mkfifo(r.pointer)
    elif kind == "symlink":
        target = tmp_path / "elsewhere"
        target.write_text("v1\n")
        r.pointer.symlink_to(target)
    elif kind == "large":
        r.pointer.write_text(secret * 100_000)
    else:
        r.pointer.write_text(f"../../{secret}\n")
    with pytest.raises(RegistryError) as err:
        r.current_version()
    assert secret not in str(err.value)
    with pytest.raises(ModelLoadError) as failed:
        cur.poll()
    assert secret not in str(failed.value)
    assert cur.version == "v1" and cur.failures == 1  # the loaded model stays
