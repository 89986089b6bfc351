"""Shared fixtures: tiny models and a scratch run directory. No network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs" / "tiny.yaml"


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The whole pipeline on configs/tiny.yaml, once per session, as a user runs it (the CLI
    in a subprocess). Tests read it; a test that damages or reruns a run works on a copy
    (tests/test_reliability.py run_copy), except test_pipeline's rerun, which must leave it
    as it was."""
    out = tmp_path_factory.mktemp("tiny-run") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "run", str(TINY_CONFIG), f"run.output_dir={out}"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The registry's tiny random Llama (built locally, no download)."""
    from draftsmith.models import pull

    return pull("tiny-random-llama")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny target model dir, one per test module (tests/test_distill_helpers.py)."""
    from test_distill_helpers import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, target_dir) -> Path:
    """A generated data dir (16 sequences, top-8 log-probs) from target_dir's model."""
    from test_distill_helpers import write_dataset

    out = tmp_path_factory.mktemp("data_src")
    write_dataset(out, target_dir, n=16, k=8)
    return out / "data"


@pytest.fixture
def tiny_config_path() -> Path:
    return TINY_CONFIG


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
