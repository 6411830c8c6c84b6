"""The hot modules compiled with mypyc against the interpreted source, alternated on one host.

    .venv/bin/python benchmarks/mypyc_ab.py --pairs 3

Needs Redis (`leap-stream dev up`, or LEAP_REDIS_URL) and a C compiler. Copies the committed
tree (`git archive HEAD`) to a scratch directory, applies the two source changes the compiled
build needs (no `slots=True` on frozen dataclasses; `Ok` not generic), compiles `MODULES` with
mypyc (it ships with mypy, a dev dependency), then runs `benchmarks/pipeline_phases.py --runs 1`
interpreted and compiled in turn and prints each run's CPU per job, the trees' and the
in-process overhead ratio. The build takes about ten minutes on two cores (mypy checks the
whole package first); `--keep DIR` reuses one made from the same commit and rebuilds one made
from another. The interpreted runs use the working tree, the compiled ones HEAD: commit first,
or the two compare different code. Asserts nothing; docs/benchmarks.md records why this is not
the shipped build.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = (
    "leap_stream/contracts/codec.py",
    "leap_stream/contracts/fastpath.py",
    "leap_stream/contracts/window.py",
    "leap_stream/contracts/events.py",
    "leap_stream/contracts/timestamps.py",
    "leap_stream/stream/batch.py",
    "leap_stream/store/online.py",
    "leap_stream/core/ranker.py",
    "leap_stream/core/ranking.py",
    "leap_stream/core/columns.py",
    "leap_stream/core/features.py",
)
SETUP = """
import os
from setuptools import setup
from mypyc.build import mypycify
setup(name="leap-stream-mypyc-ab", packages=[], py_modules=[],
      ext_modules=mypycify(os.environ["MYPYC_AB_MODULES"].split(), opt_level="3"))
"""
RUN_LINE = re.compile(
    r"([\d.]+) us CPU per job, trees ([\d.]+) us: in-process overhead ratio ([\d.]+)"
)


def head_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True)
    return done.stdout.decode().strip()


def copy_tree(dest: Path, commit: str) -> None:
    """The tree of `commit`, without the venv or build products."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def make_compilable(tree: Path) -> None:
    """The two source changes mypyc needs to build these modules."""
    for module in MODULES:
        path = tree / module
        text = path.read_text()
        path.write_text(
            text.replace("@dataclass(frozen=True, slots=True)", "@dataclass(frozen=True)")
        )
    codec = tree / "leap_stream/contracts/codec.py"
    text = codec.read_text()
    if "class Ok(Generic[E]):" not in text:
        sys.exit("codec.Ok is no longer `class Ok(Generic[E])`: update make_compilable")
    text = text.replace("class Ok(Generic[E]):", "class Ok:").replace(
        "    event: E\n", "    event: Any\n"
    )
    codec.write_text(re.sub(r"Ok\[[A-Za-z]+\]", "Ok", text))


def compile_modules(tree: Path) -> None:
    (tree / "setup_mypyc_ab.py").write_text(SETUP)
    cmd = [sys.executable, "setup_mypyc_ab.py", "build_ext", "--inplace"]
    env = {**os.environ, "MYPYC_AB_MODULES": " ".join(MODULES)}  # setuptools owns argv
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mypyc build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def one_run(compiled: Path | None) -> tuple[float, float, float]:
    """One pipeline_phases run: of the working tree, or of the compiled tree given."""
    env = dict(os.environ)
    if compiled is not None:
        env["PYTHONPATH"] = str(compiled)  # ahead of the venv's editable install of ROOT
    cmd = [sys.executable, "benchmarks/pipeline_phases.py", "--runs", "1"]
    cwd = compiled or ROOT
    out = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    found = RUN_LINE.search(out)
    if found is None:
        sys.exit(f"no run line in pipeline_phases' output:\n{out[-2000:]}")
    cpu, trees, ratio = (float(g) for g in found.groups())
    return cpu, trees, ratio


def main() -> None:
    ap = argparse.ArgumentParser(description="mypyc-compiled hot modules against the source")
    ap.add_argument("--pairs", type=int, default=3, help="interpreted/compiled runs, alternated")
    ap.add_argument(
        "--keep",
        type=Path,
        help="build the compiled tree here and keep it; a build there of the same commit is reused",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="leap-mypyc-") as scratch:
        tree = args.keep or Path(scratch)
        built, commit = tree / ".mypyc_ab_built", head_commit()  # the marker names the commit
        if not built.exists() or built.read_text().strip() != commit:
            if tree.exists() and args.keep is not None and any(tree.iterdir()):
                if not built.exists():
                    sys.exit(f"{tree} is not empty and holds no build of this script: refusing")
                print(f"{tree} holds a build of another commit: rebuilding", flush=True)
                shutil.rmtree(tree)
            tree.mkdir(parents=True, exist_ok=True)
            copy_tree(tree, commit)  # the commit the marker will name
            make_compilable(tree)
            compile_modules(tree)
            built.write_text(commit + "\n")
        print("pair  build        CPU/job   trees   overhead ratio")
        for pair in range(1, args.pairs + 1):
            for name, compiled in (("interpreted", None), ("compiled", tree)):
                cpu, trees, ratio = one_run(compiled)
                print(
                    f"{pair:4d}  {name:11s} {cpu:7.1f} us {trees:6.1f} us  {ratio:5.2f}", flush=True
                )


if __name__ == "__main__":
    main()
