"""The packaged hardware catalog is valid, complete enough and physically sane."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import orjson
import pytest

from leap_stream.catalog import CATALOG_PATH, CatalogError, HardwareCatalog, load_catalog


def test_default_catalog_is_valid_and_large_enough() -> None:
    cat = load_catalog()
    assert len(cat.types) >= 22
    assert set(cat.vendors) == {"nvidia", "amd", "google", "aws", "intel"}
    for t in cat.types:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", t)
        assert cat[t].source.strip()


def test_expected_types_present() -> None:
    cat = load_catalog()
    for t in (
        "v100-sxm",
        "a100-40g",
        "a100-80g",
        "h100-sxm",
        "h100-pcie",
        "h200",
        "b200",
        "l4",
        "l40s",
        "mi250x",
        "mi300x",
        "mi325x",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "trn1",
        "trn2",
        "gaudi2",
        "gaudi3",
        "a10g",
        "rtx-6000-ada",
    ):
        assert t in cat
    assert "inf2" not in cat  # inference part


def test_spec_matrix_shape_and_sanity() -> None:
    m = load_catalog().spec_matrix()
    assert list(m.columns) == [
        "device_memory_gib",
        "peak_bf16_tflops",
        "memory_bandwidth_gbps",
        "interconnect_gbps",
        "cost_per_device_hour",
        "vendor",
        "peak_fp8_tflops",
        "generation_year",
        "scale_up_domain",
        "network_gbps",
    ]
    assert m.index.name == "type_id"
    num = m.drop(columns=["vendor", "peak_fp8_tflops"])
    assert (num > 0).all().all()
    # optional specs are NaN where the datasheet has none, never 0
    assert np.isnan(m.loc["v100-sxm", "peak_fp8_tflops"])
    assert m.loc["h100-sxm", "peak_fp8_tflops"] > m.loc["h100-sxm", "peak_bf16_tflops"]
    # newer generations are faster: a few well-known orderings
    assert m.loc["h100-sxm", "peak_bf16_tflops"] > m.loc["a100-80g", "peak_bf16_tflops"]
    assert m.loc["b200", "peak_bf16_tflops"] > m.loc["h100-sxm", "peak_bf16_tflops"]
    assert m.loc["h200", "memory_bandwidth_gbps"] > m.loc["h100-sxm", "memory_bandwidth_gbps"]
    assert m.loc["mi300x", "device_memory_gib"] > m.loc["h100-sxm", "device_memory_gib"]
    assert m.loc["h100-sxm", "cost_per_device_hour"] > m.loc["l4", "cost_per_device_hour"]
    # every built-in part says how the fleet deploys it; the scale-out network is slower than
    # the scale-up link, and an NVL72 rack or a TPU pod is a larger domain than an HGX node
    assert m[["scale_up_domain", "network_gbps"]].notna().all().all()
    assert (m["network_gbps"] < m["interconnect_gbps"]).all()
    assert m.loc["gb200", "scale_up_domain"] > m.loc["h100-sxm", "scale_up_domain"] == 8
    assert m.loc["tpu-v5p", "scale_up_domain"] > m.loc["gb200", "scale_up_domain"]


def test_default_is_cached_and_explicit_path_loads(tmp_path: Path) -> None:
    assert load_catalog() is load_catalog()
    p = tmp_path / "c.json"
    p.write_bytes(CATALOG_PATH.read_bytes())
    assert load_catalog(p).types == load_catalog().types


def test_invalid_catalog_rejected() -> None:
    doc = orjson.loads(CATALOG_PATH.read_bytes())
    bad = copy.deepcopy(doc)
    bad["hardware"][0]["vendor"] = "acme"
    with pytest.raises(CatalogError):
        HardwareCatalog.from_dict(bad)
    bad = copy.deepcopy(doc)
    bad["hardware"][1]["type_id"] = bad["hardware"][0]["type_id"]
    with pytest.raises(CatalogError):
        HardwareCatalog.from_dict(bad)
    bad = copy.deepcopy(doc)
    del bad["hardware"][0]["source"]
    with pytest.raises(CatalogError):
        HardwareCatalog.from_dict(bad)


def test_to_dict_round_trips() -> None:
    cat = load_catalog()
    again = HardwareCatalog.from_dict(cat.to_dict())
    assert again.types == cat.types
    assert all(again[t] == cat[t] for t in cat.types)


def test_resolve_matches_type_ids_and_aliases_case_insensitively() -> None:
    cat = load_catalog()
    assert cat.resolve("H100-SXM") == "h100-sxm"
    assert cat.resolve(" a100-sxm-80gb ") == "a100-80g"  # an alias, other case, padded
    assert cat.resolve("Gaudi") == "gaudi1"
    assert cat.resolve("IPU-Bow") is None  # no specs: never guessed


def test_reference_catalog_adds_public_benchmark_parts_without_changing_the_fleet() -> None:
    from leap_stream.catalog import load_reference_catalog

    fleet = load_catalog()
    ref = load_reference_catalog()
    assert set(fleet.types) < set(ref.types)
    for t in fleet.types:
        assert ref[t] == fleet[t]
    assert ref.resolve("K80") == "k80" and "k80" not in fleet
    assert ref.resolve("MI250") == "mi250-gcd"
    # fp32 peaks are below the matrix peaks of the same part
    for s in ref:
        if s.peak_fp32_tflops is not None:
            assert s.peak_fp32_tflops <= s.peak_bf16_tflops
    # an alias names one type only
    names = [n.lower() for s in ref for n in (*s.aliases, s.type_id)]
    assert len(names) == len(set(names))


def test_a_name_for_two_types_is_refused() -> None:
    doc = load_catalog().to_dict()
    doc["hardware"][1]["aliases"] = [doc["hardware"][0]["type_id"].upper()]
    with pytest.raises(CatalogError, match="names both"):
        HardwareCatalog.from_dict(doc)


def test_catalog_file_reloads_on_change_and_refuses_a_bad_edit(tmp_path: Path) -> None:
    import os

    from leap_stream.catalog import CATALOG_PATH, CatalogError, CatalogFile

    doc = orjson.loads(CATALOG_PATH.read_bytes())
    path = tmp_path / "catalog.json"
    path.write_bytes(orjson.dumps(doc))
    watch = CatalogFile(path)
    first = watch.load()
    assert watch.poll() is None  # unchanged: one stat, nothing read
    retired = doc["hardware"][0]["type_id"]
    smaller = dict(doc, hardware=doc["hardware"][1:])
    tmp = tmp_path / "catalog.json.tmp"
    tmp.write_bytes(orjson.dumps(smaller))
    os.replace(tmp, path)
    second = watch.poll()
    assert second is not None and retired in first.types and retired not in second.types
    tmp.write_bytes(b'{"hardware": [{"type_id": 3}]}')
    os.replace(tmp, path)
    with pytest.raises(CatalogError):
        watch.poll()
    assert watch.poll() is None  # the bad edit is reported once, not at every poll
    assert CatalogFile(None).poll() is None and CatalogFile(None).load().types == first.types
    with pytest.raises(CatalogError):
        CatalogFile(tmp_path / "absent.json").load()
