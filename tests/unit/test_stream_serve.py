"""Pure parts of `leap-stream serve`: the committed OpenAPI document, tokens, authorization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_stream.settings import SettingsError
from leap_stream.stream.serve import authorized, openapi_document, read_tokens

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_openapi_document_is_the_served_one() -> None:
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert committed == json.loads(json.dumps(openapi_document())), (
        "docs/openapi.json is stale: leap-stream serve --openapi > docs/openapi.json"
    )
    assert set(committed["paths"]) == {
        "/v1/rank",
        "/v1/rank/batch",
        "/v1/skypilot/policy",
        "/healthz",
        "/readyz",
    }
    body = committed["paths"]["/v1/rank"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["title"] == "job-submitted"  # the contract's own schema


def test_tokens_file(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# ops\nalpha\n\n  beta  \n")
    assert read_tokens(f) == {"alpha", "beta"}
    f.write_text("# nothing here\n")
    with pytest.raises(SettingsError, match="no token"):
        read_tokens(f)
    with pytest.raises(SettingsError, match="LEAP_SERVE_TOKENS_FILE"):
        read_tokens(tmp_path / "missing")


def test_authorization_header() -> None:
    tokens = frozenset({"alpha", "beta"})
    assert authorized(None, None) and authorized("anything", None)  # no tokens: open
    assert authorized("Bearer beta", tokens)
    assert not authorized(None, tokens)
    assert not authorized("Bearer gamma", tokens)
    assert not authorized("Basic alpha", tokens)
    assert not authorized("Bearer ", tokens)
