"""Shared fixtures: tiny models and a scratch run directory. No network."""

from __future__ import annotations

import os
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
def tiny_model_dir() -> Path:
    """The registry's tiny random Llama (built locally, no download)."""
    from draftsmith.models import pull

    return pull("tiny-random-llama")


@pytest.fixture
def tiny_config_path() -> Path:
    return TINY_CONFIG


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
