"""The model card says how the exported draft was trained, whichever row won."""

from __future__ import annotations

import json

import pytest

from draftsmith.config import load_config
from draftsmith.distill.checkpoint import training_settings
from draftsmith.export import _training, assistant_generation_config


def _record(loss: str) -> dict:
    """A checkpoint's record (draftsmith_checkpoint.json) as distill writes it."""
    cfg = load_config("configs/smollm2-135m.yaml", ["distill.max_steps=180"])
    return {"init": "from_target layers [0, 1]", "settings": training_settings(cfg, loss)}


@pytest.mark.parametrize(
    "row,loss,want,not_want",
    [
        ({"role": "distilled", "step": 180}, "forward_kl", "forward_kl (teacher: offline", "ce ("),
        (
            {"role": "ce_twin", "step": None, "trained_steps": 180},
            "ce",
            "ce (plain",
            "forward_kl (",
        ),
        ({"role": "init", "step": 0}, "forward_kl", "untrained", "forward_kl ("),
        ({"role": "baseline", "step": None}, "forward_kl", "external draft", "forward_kl ("),
    ],
)
def test_training_line_follows_the_row(row, loss, want, not_want):
    line = _training(_record(loss), row)
    assert want in line and not_want not in line
    if row["role"] in ("distilled", "ce_twin"):
        assert "180 steps" in line and "lr 0.001" in line  # configs/smollm2-135m.yaml


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
