"""The console script's own cost: what it imports before it can hold the stop signals, and
what `--version` loads."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``, less those it holds
    before (its own start-up). They are printed on stderr: stdout is the command's."""
    probe = (
        "import sys; before = set(sys.modules); {}; "
        "print(*set(sys.modules) - before, file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe.format(code)], capture_output=True, text=True, check=True
    )
    return set(out.stderr.split())


def test_the_entry_module_imports_nothing_heavy_before_it_holds_the_signals() -> None:
    """A SIGTERM that arrives before `main` blocks it kills the worker: every import of
    `leap_stream.cli` widens that window (argparse and typing cost ~12 ms of it)."""
    loaded = _modules_after("import leap_stream.cli")
    assert {"argparse", "typing", "importlib"}.isdisjoint(loaded), sorted(loaded)
    assert {m for m in loaded if m.startswith("leap_stream")} == {"leap_stream", "leap_stream.cli"}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_load_no_command(argv: list[str]) -> None:
    """`leap-stream --version` stays instant: no command module, not even the settings
    (~0.6 s with their contracts)."""
    code = f"from leap_stream.cli import main\ntry: main({argv!r})\nexcept SystemExit: pass"
    loaded = _modules_after(f"exec({code!r})")
    assert {m for m in loaded if m.startswith("leap_stream")} == {"leap_stream", "leap_stream.cli"}
