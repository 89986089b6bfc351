"""The model card says how the exported draft was trained, whichever row won."""

from __future__ import annotations

import json

import pytest

from draftsmith.config import load_config
from draftsmith.export import _training, assistant_generation_config


@pytest.fixture
def cfg():
    return load_config("configs/smollm2-135m.yaml", ["distill.max_steps=180"])


@pytest.mark.parametrize(
    "row,want,not_want",
    [
        ({"role": "distilled", "step": 180}, "forward_kl (teacher: offline", "ce ("),
        ({"role": "ce_twin", "step": None, "trained_steps": 180}, "ce (plain", "forward_kl ("),
        ({"role": "init", "step": 0}, "untrained", "forward_kl ("),
        ({"role": "baseline", "step": None}, "external draft", "forward_kl ("),
    ],
)
def test_training_line_follows_the_row(cfg, row, want, not_want):
    line = _training(cfg, row)
    assert want in line and not_want not in line
    if row["role"] in ("distilled", "ce_twin"):
        assert "180 steps" in line


def test_assistant_generation_config_keeps_other_fields(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": 2, "num_assistant_tokens": 20}))
    assistant_generation_config(path, 3)
    gc = json.loads(path.read_text())
    assert gc == {
        "eos_token_id": 2,
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
