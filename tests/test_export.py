"""The model card says how the exported draft was trained, whichever row won."""

from __future__ import annotations

import json

import pytest
from board_rows import make_row

from draftsmith.config import load_config
from draftsmith.distill.checkpoint import training_settings
from draftsmith.evaluate.records import ConfidenceSplit, LeaderboardRow, MetricSummary
from draftsmith.export import _training
from draftsmith.kinds.independent.export import assistant_generation_config
from draftsmith.kinds.independent.train import IndependentTraining


@pytest.fixture
def cfg():
    return load_config("configs/smollm2-135m.yaml", ["distill.max_steps=180"])


def _record(loss: str) -> dict:
    """A checkpoint's record (draftsmith_checkpoint.json) as distill writes it."""
    cfg = load_config("configs/smollm2-135m.yaml", ["distill.max_steps=180"])
    return {
        "init": "from_target layers [0, 1]",
        "settings": training_settings(cfg, loss, IndependentTraining()),
    }


def _row(name, **fields) -> LeaderboardRow:
    """A leaderboard row of draft `name` with the given fields (the rest filled in)."""
    return make_row(name, **({"eval_set": "mtbench", "measured_by": "teacher_forced"} | fields))


@pytest.mark.parametrize(
    "fields,loss,want,not_want",
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
def test_training_line_follows_the_row(fields, loss, want, not_want):
    # a checkpoint's trained_steps is its step (list_drafts); a CE twin's says how far it went
    row = _row("d", **({"trained_steps": fields["step"]} | fields))
    line = _training(_record(loss), row)
    assert want in line and not_want not in line
    if row.role in ("distilled", "ce_twin"):
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


def _board_row(name, eval_set, by, acceptance, **extra):
    return _row(
        name,
        eval_set=eval_set,
        measured_by=by,
        acceptance_rate=acceptance,
        num_prompts=24 if by == "teacher_forced" else 8,
        per_category={"math": MetricSummary(acceptance_rate=acceptance / 2, num_prompts=3)},
        **extra,
    )


BOARD = {
    "best": "checkpoint-6",
    "select_metric": "acceptance_rate",
    "primary_eval_set": "mtbench",
    "recommended_k": 2,
    "k_recommendation": {
        "k": 2,
        "by": "modelled_speedup_verify",
        "clear": False,
        "runner_up": 1,
        "wall_clock": {"k": 1, "by": "speedup", "clear": False, "runner_up": 2},
    },
    "k_sweep": [{"k": 1, "acceptance_rate": 0.3}, {"k": 2, "acceptance_rate": 0.2}],
    "rows": [
        _board_row("checkpoint-3", "mtbench", "teacher_forced", 0.111),
        _board_row("checkpoint-6", "mtbench", "teacher_forced", 0.222),
        _board_row(
            "checkpoint-6",
            "mtbench",
            "engine",
            0.25,
            speedup=1.37,
            lossless_match_rate=1.0,
            confidence=ConfidenceSplit(
                target_sure_share=0.5,
                alpha_target_sure=0.97,
                alpha_target_unsure=0.5,
                misses_target_unsure=0.94,
            ),
        ),
        _board_row("checkpoint-3", "heldout", "teacher_forced", 0.333),
        _board_row("checkpoint-6", "heldout", "teacher_forced", 0.444),
        _board_row("checkpoint-6", "heldout", "engine", 0.5, speedup=1.2, lossless_match_rate=1.0),
    ],
}


def test_export_takes_the_primary_sets_engine_row_and_the_card_shows_every_set(cfg, tmp_path):
    from draftsmith.export import choose_row, model_card

    row = choose_row(BOARD, None)
    assert (row.eval_set, row.measured_by, row.speedup) == ("mtbench", "engine", 1.37)
    other = choose_row(BOARD, "checkpoint-3")  # never decoded: its replay row over every prompt
    assert (other.eval_set, other.measured_by) == ("mtbench", "teacher_forced")
    card = model_card(cfg, BOARD, row, 2, tmp_path / "export", _record("forward_kl"))
    assert "## Measured on mtbench by real speculative decoding" in card
    assert "| measured speedup over target-only decoding | 1.37x |" in card
    assert "| misses where the target itself was unsure (p(own token) < 0.8) | 0.94 |" in card
    assert "| alpha where the target was sure / unsure | 0.970 / 0.500 |" in card
    sets = card.split("## Eval sets", 1)[1]
    assert "### mtbench (primary): 24 prompts, teacher-forced replay" in sets
    assert "### heldout: 24 prompts, teacher-forced replay" in sets
    assert "acceptance rate 0.222" in sets and "acceptance rate 0.444" in sets
    assert "| math | 0.111 |" in sets and "0.333" not in sets  # this draft's rows only
    assert "recommended k = 2, by the modelled speedup" in card
    assert "the spread is too wide to rank it above k=1" in card
    assert "per category" not in card  # a board without a per-category k says nothing of it
    assert "What limits" not in card  # a sweep without timed costs says nothing of them
    timed = {
        "modelled_speedup_verify": 1.6,
        "draft_share": 0.3,
        "modelled_speedup_free_draft": 2.29,
    }
    sweep = [BOARD["k_sweep"][0], {**BOARD["k_sweep"][1], **timed}]
    card = model_card(
        cfg, {**BOARD, "k_sweep": sweep}, row, 2, tmp_path / "export", _record("forward_kl")
    )
    assert "What limits k=2: its draft steps take 30% of a round (modelled 1.60x)" in card
    by_cat = {
        "coding": {
            "k": 5,
            "clear": True,
            "runner_up": 4,
            "alpha": 0.82,
            "modelled_speedup_verify": 1.91,
            "speedup": 1.95,
            "engine_prompts": 1,
        },
        "writing": {
            "k": 3,
            "clear": False,
            "runner_up": 2,
            "alpha": 0.64,
            "modelled_speedup_verify": 1.52,
            "speedup": None,
            "engine_prompts": 0,
        },
    }
    card = model_card(
        cfg, {**BOARD, "k_by_category": by_cat}, row, 2, tmp_path / "export", _record("forward_kl")
    )
    assert "Recommended k per category (its own acceptance, the run's costs):" in card
    assert "  coding: k=5 (alpha 0.820, modelled 1.91x, measured 1.95x on 1 prompt)" in card
    assert "  writing: k=3 (alpha 0.640, modelled 1.52x, not clear of k=2)" in card


def test_the_card_says_when_the_draft_was_measured_with_rounded_weights(cfg, tmp_path):
    from draftsmith.export import choose_row, model_card

    row = choose_row(BOARD, None)
    note = "The draft was decoded with int4 weights (evaluate.draft_weights)"
    plain = model_card(cfg, BOARD, row, 2, tmp_path / "export", _record("forward_kl"))
    int4 = model_card(
        cfg, {**BOARD, "draft_weights": "int4"}, row, 2, tmp_path / "export", _record("forward_kl")
    )
    assert note not in plain and note in int4
