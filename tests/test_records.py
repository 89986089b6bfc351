"""The typed records the evaluate stage passes around read back exactly what they write,
and a malformed leaderboard row is one line naming the file and the field."""

from __future__ import annotations

import json

import pytest
from board_rows import VLLM_COUNTS, make_row

from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics
from draftsmith.evaluate.records import (
    DraftEntry,
    EchoSplit,
    LeaderboardRow,
    MetricSummary,
    rows_from_dicts,
    summary_args,
)
from draftsmith.evaluate.vllm_backend import summary_from_counts


def _result(tokens, accepted_at, reached_at, outcome, category="x"):
    """One prompt's engine result (evaluate/engine.py DecodeResult.to_dict's count fields)."""
    return {
        "category": category,
        "tokens": tokens,
        "proposed": 2 * len(tokens),
        "accepted": sum(accepted_at),
        "target_forwards": len(tokens),
        "accepted_at": accepted_at,
        "reached_at": reached_at,
        "wall_time": 0.5,
        "draft_1tok_time": 0.1,
        "draft_1tok_n": 4,
        "target_1tok_time": 0.4,
        "target_1tok_n": 4,
        "target_verify_time": 0.3,
        "target_verify_n": 2,
        "outcome": outcome,
    }


def _native_row() -> LeaderboardRow:
    """A row as build_row makes it: summary, per-category summaries, echo split, extras."""
    spec = [
        _result([5, 6, 7, 8], [2, 1], [3, 2], [1, 1, 0, -1], "code"),
        _result([1, 2, 3], [1, 0], [2, 1], [1, 0, -1], "math"),
    ]
    ids = [[5, 6, 7, 8, 9], [4, 4]]
    cats = metrics.per_category(spec, spec, ["code", "math"], 2, ids)
    return make_row(
        "checkpoint-4",
        eval_set="mtbench",
        **summary_args(metrics.summarize(spec, spec, 2, ids)),
        speedup_iqr=[0.9, 1.1],
        per_category={c: MetricSummary(**summary_args(s)) for c, s in cats.items()},
        lossless_match_rate=1.0,
        lossless_ties=0,
        num_speculative_tokens=2,
        replay_match_rate=1.0,
        trained_with={"init": "from_target", "distill": {"loss": "forward_kl"}},
    )


def test_a_draft_entry_round_trips_and_writes_key_only_for_a_baseline():
    ckpt = DraftEntry(name="c", ref="/r/c", step=4, role="distilled", trained_steps=4, kind="k")
    base = DraftEntry(name="b", ref="hub/b", role="baseline", key="evaluate.baselines[0]", kind="k")
    assert list(ckpt.to_dict()) == ["name", "ref", "step", "role", "trained_steps", "kind"]
    assert list(base.to_dict()) == ["name", "ref", "step", "role", "trained_steps", "key", "kind"]
    for d in (ckpt, base):
        assert DraftEntry.from_dict(d.to_dict(), "drafts") == d
    assert (ckpt.config_key, base.config_key) == ("checkpoint", "evaluate.baselines[0]")
    with pytest.raises(DraftsmithError, match=r"^drafts\[0\]: missing field 'kind'$"):
        DraftEntry.from_dict({"name": "c", "ref": "/r/c"}, "drafts[0]")


def test_a_native_row_round_trips_through_its_json_in_build_rows_key_order():
    row = _native_row()
    d = json.loads(json.dumps(row.to_dict()))
    assert LeaderboardRow.from_dict(d, "leaderboard.json") == row
    keys = list(d)
    # identity, then the summary in metrics.summarize's order, then the row's own fields
    assert keys[:8] == list(LeaderboardRow.IDENTITY + LeaderboardRow.WHERE)
    n = len(MetricSummary.NATIVE_KEYS) + 3
    assert keys[8 : 8 + n] == [*MetricSummary.NATIVE_KEYS, "echo_share", "alpha_echo", "alpha_new"]
    assert keys[8 + n :] == [
        "speedup_iqr",
        "per_category",
        "lossless_match_rate",
        "lossless_ties",
        "num_speculative_tokens",
        "temperature",
        "backend",
        "replay_match_rate",
        "trained_with",
    ]
    assert list(d["per_category"]) == ["code", "math"]
    echo = ["echo_share", "alpha_echo", "alpha_new"]
    assert list(d["per_category"]["code"]) == [*MetricSummary.NATIVE_KEYS, *echo]
    assert (
        row.alpha == d["alpha"]
        and row.per_category["math"].alpha == d["per_category"]["math"]["alpha"]
    )
    assert row.alpha_new == d["alpha_new"] and row.echo_share == d["echo_share"]


def test_a_row_without_an_echo_split_writes_no_echo_fields():
    row = _native_row()
    row.echo = None
    d = row.to_dict()
    assert not {"echo_share", "alpha_echo", "alpha_new"} & set(d)
    assert row.alpha_new is None and LeaderboardRow.from_dict(d, "f") == row
    row.echo = EchoSplit(echo_share=None, alpha_echo=None, alpha_new=None)  # outcomes, no tokens
    assert row.to_dict()["echo_share"] is None  # present, null: as echo_split writes it


def test_a_vllm_row_keeps_the_vllm_backends_fields_and_order():
    summary = summary_from_counts(
        VLLM_COUNTS, 3, tokens=25, wall=0.5, base_tokens=25, base_wall=1.0
    )
    row = LeaderboardRow(
        checkpoint="d",
        kind="independent",
        path="/d",
        step=None,
        role="baseline",
        trained_steps=None,
        eval_set="heldout",
        measured_by="engine",
        num_prompts=2,
        **summary,
        per_category={"c": MetricSummary(**summary, num_prompts=2)},
        num_speculative_tokens=3,
        temperature=0.0,
        backend="vllm",
        lossless_match_rate=1.0,
    )
    d = row.to_dict()
    # vllm_backend._row's dict, then eval_set and measured_by as vllm_rows added them
    head = ["checkpoint", "kind", "path", "step", "role", "trained_steps", "num_prompts"]
    tail = ["per_category", "num_speculative_tokens", "temperature", "backend"]
    assert list(d) == [*head, *summary, *tail, "lossless_match_rate", "eval_set", "measured_by"]
    assert list(d["per_category"]["c"]) == [*summary, "num_prompts"]
    assert LeaderboardRow.from_dict(json.loads(json.dumps(d)), "f") == row


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d.update(alfa=0.5), r"rows\[1\]: unknown field 'alfa'$"),
        (lambda d: d.pop("measured_by"), r"rows\[1\]: missing field 'measured_by'$"),
        (
            lambda d: d["per_category"]["code"].pop("alpha"),
            r"rows\[1\]: per_category\['code'\]: missing field 'alpha'$",
        ),
        (lambda d: d.update(per_category=[]), r"rows\[1\]: per_category is not an object$"),
    ],
)
def test_a_malformed_row_is_one_line_naming_the_file_row_and_field(tmp_path, change, message):
    path = tmp_path / "eval" / "leaderboard.json"
    good, bad = _native_row().to_dict(), _native_row().to_dict()
    change(bad)
    with pytest.raises(DraftsmithError) as e:
        rows_from_dicts([good, bad], path)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    assert e.match(message)


def test_export_names_the_leaderboard_whose_row_is_malformed(tmp_path):
    from draftsmith.config import config_from_dict
    from draftsmith.export import read_leaderboard

    cfg = config_from_dict({"run": {"output_dir": str(tmp_path)}})
    path = tmp_path / "eval" / "leaderboard.json"
    path.parent.mkdir(parents=True)
    row = _native_row().to_dict()
    del row["kind"]
    path.write_text(json.dumps({"best": "checkpoint-4", "rows": [row]}))
    with pytest.raises(DraftsmithError, match=rf"^{path}: rows\[0\]: missing field 'kind'$"):
        read_leaderboard(cfg)
