"""Security basics: models load only from LightGBM text, nothing from an event is evaluated.

Pure (no services): a pickle planted in the registry must be refused without being unpickled,
and the package source must not contain the constructs that would evaluate or unpickle input.
"""

from __future__ import annotations

import ast
import os
import pickle
import re
from pathlib import Path

import orjson
import pytest

from leap_stream.store.artefact import read_artefact, write_model
from leap_stream.store.registry import ModelLoadError, Registry

PACKAGE = Path(__file__).resolve().parents[2] / "leap_stream"


class _Bomb:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (os.system, (f"touch {self.marker}",))


def _version_dir(root: Path, version: str, files: dict[str, bytes]) -> Path:
    d = root / f"build-{version}"
    d.mkdir(parents=True)
    meta = {"version": version, "trained_at": "2026-12-01T00:00:00Z", "features": [], "groups": []}
    (d / "metadata.json").write_bytes(orjson.dumps(meta))
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


@pytest.mark.parametrize("name", ["model.txt", "model.pkl"])
def test_a_pickle_in_the_registry_is_refused_not_unpickled(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "unpickled"
    bomb = pickle.dumps(_Bomb(marker))
    reg = Registry(tmp_path / "registry")
    version = reg.publish(_version_dir(tmp_path, f"v-{name.replace('.', '-')}", {name: bomb}))
    reg.promote(version)  # checksums match: only the loader stands between the file and us
    with pytest.raises(ModelLoadError):
        reg.load_current(read_artefact)
    assert not marker.exists(), "the pickle was executed"


def test_a_pickle_next_to_a_good_model_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a model never touches pickle, whatever else lies in the folder."""
    import numpy as np
    import pandas as pd

    import leap_stream.train.trainer  # noqa: F401 - imported before pickle is disarmed
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.fleet import simulate
    from leap_stream.train.trainer import fit, training_rows

    sim = simulate(SimConfig(seed=3, days=1, rate=1500))
    model = fit(training_rows(sim.dataset), num_rounds=5)
    built = write_model(tmp_path / "build", model)
    (built / "extra.pkl").write_bytes(pickle.dumps(_Bomb(tmp_path / "unpickled")))

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("pickle used while loading a model")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pd, "read_pickle", refuse)
    monkeypatch.setattr(np, "load", refuse)
    reg = Registry(tmp_path / "registry")
    reg.promote(reg.publish(built))
    loaded = reg.load_current(read_artefact)
    assert loaded is not None and loaded[0] == model.version
    assert not (tmp_path / "unpickled").exists()


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the package really was found
    return files


# the forbidden call forms, as AST checks (comments and strings do not count)
def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            for n in [*names, mod or ""]:
                if n.split(".")[0] in (
                    "pickle",
                    "cPickle",
                    "dill",
                    "cloudpickle",
                    "marshal",
                    "shelve",
                ):
                    found.append(f"{path}:{node.lineno}: imports {n}")
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if isinstance(f, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
                found.append(f"{path}:{node.lineno}: calls {name}()")
            if (
                name == "load"
                and isinstance(f, ast.Attribute)
                and getattr(f.value, "id", "") == "yaml"
            ):
                loader = [k for k in node.keywords if k.arg == "Loader"]
                safe = loader and "Safe" in ast.unparse(loader[0].value)
                if not safe:
                    found.append(f"{path}:{node.lineno}: yaml.load without SafeLoader")
            if name in ("unsafe_load", "full_load") and getattr(f.value, "id", "") == "yaml":
                found.append(f"{path}:{node.lineno}: yaml.{name}")
            if name in ("read_pickle", "loads") and getattr(f.value, "id", "") in ("pd", "pickle"):
                found.append(f"{path}:{node.lineno}: {ast.unparse(f)}")
            if name == "load" and getattr(f.value, "id", "") == "np":
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if kw.get("allow_pickle") == "True":
                    found.append(f"{path}:{node.lineno}: np.load(allow_pickle=True)")
    return found


def test_nothing_in_the_package_evaluates_or_unpickles() -> None:
    bad = [v for p in _sources() for v in _violations(p)]
    assert not bad, "\n".join(bad)


def test_the_source_check_catches_what_it_looks_for(tmp_path: Path) -> None:
    """The check itself can fail: each forbidden form in a sample file is reported."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import pickle\nimport yaml\n"
        "def f(x):\n"
        "    eval(x)\n    exec(x)\n    yaml.load(x)\n    pickle.loads(x)\n"
        "    yaml.load(x, Loader=yaml.SafeLoader)\n"
    )
    found = _violations(sample)
    assert len(found) == 5, found
    assert any("SafeLoader" in v for v in found)


def test_no_raw_text_escape_hatches() -> None:
    """A grep over the raw text too (catches forms the AST check could miss, e.g. getattr)."""
    pattern = re.compile(r"\b(pickle|cPickle|cloudpickle|dill)\b\.|\beval\(|\bexec\(|yaml\.load\(")
    hits = []
    for p in _sources():
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "SafeLoader" not in code:
                hits.append(f"{p}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
