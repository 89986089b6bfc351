"""The stage folders install inside draftsmith, never as top-level `evaluate`/`data`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_hf_evaluate_and_draftsmith_evaluate_both_import():
    code = (
        "import evaluate, draftsmith.evaluate, draftsmith.data, draftsmith.distill\n"
        "assert callable(evaluate.load), evaluate.__file__\n"
        "assert 'site-packages' in evaluate.__file__, evaluate.__file__\n"
        "import importlib.util as u\n"
        "assert u.find_spec('data') is None, u.find_spec('data')\n"
        "print(draftsmith.evaluate.__file__)\n"
    )
    # Run from a neutral directory: the repo root itself would put ./evaluate on sys.path.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("evaluate/__init__.py")


def test_wheel_holds_only_the_draftsmith_namespace(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("draftsmith-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"draftsmith", next(t for t in top if t.endswith(".dist-info"))}
    for module in (
        "draftsmith/evaluate/__init__.py",
        "draftsmith/data/__init__.py",
        "draftsmith/distill/__init__.py",
        "draftsmith/cli.py",
    ):
        assert module in names
    assert any(n.startswith("draftsmith/data/prompts/") and n.endswith(".jsonl") for n in names)
