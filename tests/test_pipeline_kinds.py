"""`draftsmith run configs/tiny.yaml draft.kind=[independent,eagle3]`: both kinds trained,
ranked on one leaderboard, the best exported; then the eagle3 row exported and served."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from test_pipeline import QUIET, draftsmith

from draftsmith.config import load_config

KINDS = "draft.kind=[independent,eagle3]"


@pytest.fixture(scope="module")
def both_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("kinds") / "run"
    proc = draftsmith("run", "configs/tiny.yaml", f"run.output_dir={out}", KINDS, QUIET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_both_kinds_trained_and_ranked_on_one_leaderboard(both_run):
    out, stdout = both_run
    cfg = load_config(out / "config.yaml")
    assert cfg.draft.kinds == ["independent", "eagle3"]
    steps = [0, 3, 6]  # configs/tiny.yaml: save_every 3, max_steps 6
    for sub in ("checkpoints", "eagle3/checkpoints"):
        found = sorted(int(p.name.split("-")[1]) for p in (out / sub).glob("checkpoint-*"))
        assert found == steps
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    kinds = {r["checkpoint"]: r["kind"] for r in board["rows"]}
    assert kinds == {
        **{f"checkpoint-{s}": "independent" for s in steps},
        **{f"eagle3-checkpoint-{s}": "eagle3" for s in steps},
    }
    ranked = {r["checkpoint"] for r in board["rows"] if r["measured_by"] == "teacher_forced"}
    assert ranked == set(kinds)  # every checkpoint of both kinds ranked by its own replay
    engine = [r for r in board["rows"] if r["measured_by"] == "engine"]
    # the engine decodes each kind's best and the drafts of its comparison (last vs init)
    assert {r["checkpoint"] for r in engine} >= {
        "checkpoint-6",
        "checkpoint-0",
        "eagle3-checkpoint-6",
        "eagle3-checkpoint-0",
    }
    for row in engine:
        assert row["lossless_match_rate"] == 1.0  # greedy equality with the target's output
        assert row["replay_match_rate"] == 1.0  # counts equal the kind's teacher-forced replay
        assert row["draft_cost_ratio"] is not None and row["speedup"] is not None
    for row in board["rows"]:
        cats = row["per_category"].values()
        assert sum(c["num_prompts"] for c in cats) == row["num_prompts"] > 0
    with open(out / "eval" / "leaderboard.csv") as f:
        csv_kinds = {r["checkpoint"]: r["kind"] for r in csv.DictReader(f)}
    assert csv_kinds == kinds
    table = stdout[stdout.index("checkpoint  ") :].splitlines()  # the printed leaderboard
    assert table[0].split()[:3] == ["checkpoint", "kind", "step"]
    body = table[2 : 2 + len(board["rows"])]  # one line per row
    printed = {cells[0].lstrip("*"): cells[1] for cells in map(str.split, body)}
    assert printed == kinds
    # each kind's last checkpoint against its own init, and the best of each kind paired
    within = [c for c in board["comparisons"] if c["role"] != "other_kind"]
    assert {(c["draft"], c["against"]) for c in within} == {
        ("checkpoint-6", "checkpoint-0"),
        ("eagle3-checkpoint-6", "eagle3-checkpoint-0"),
    }
    (across,) = [c for c in board["comparisons"] if c["role"] == "other_kind"]
    tf = {r["checkpoint"]: r for r in board["rows"] if r["measured_by"] == "teacher_forced"}
    best = {
        kind: max(
            (r for r in tf.values() if r["kind"] == kind), key=lambda r: r["acceptance_rate"]
        )["checkpoint"]
        for kind in ("independent", "eagle3")
    }
    assert {across["draft"], across["against"]} == set(best.values())
    a, b = tf[across["draft"]], tf[across["against"]]
    assert across["diff"] == pytest.approx(a["acceptance_rate"] - b["acceptance_rate"])
    assert f"{across['draft']} vs {across['against']}: acceptance" in stdout
    # the export holds the best row, whichever kind it is
    row = json.loads((out / "export" / "leaderboard_row.json").read_text())
    assert row["checkpoint"] == board["best"]
    method = {"independent": "draft_model", "eagle3": "eagle3"}[row["kind"]]
    spec = json.loads((out / "export" / "speculative_config.json").read_text())
    assert spec["method"] == method


def test_eagle3_engine_counts_equal_the_teacher_forced_replay(both_run):
    """Every eagle3 row's per-prompt counts from real decoding equal kinds'
    teacher-forced replay (one target forward + the head's steps) on the target's output."""
    from draftsmith.evaluate.native import Models
    from draftsmith.evaluate.prompts import list_drafts, load_prompts
    from draftsmith.kinds import teacher_forced_results
    from draftsmith.vocab_rows import token_id_count

    out, _ = both_run
    cfg = load_config(out / "config.yaml")
    k, budget = cfg.evaluate.num_speculative_tokens, cfg.evaluate.max_new_tokens
    results = out / "eval" / "results"
    (base_file,) = results.glob("target-only-heldout-*.json")
    base = {r["id"]: r for r in json.loads(base_file.read_text())["results"]}
    prompts = {p["id"]: p for p in load_prompts(out)}
    models = Models(cfg)
    num_ids = token_id_count(models.tokenizer())
    drafts = [d for d in list_drafts(out, cfg.draft.kinds, []) if d.kind == "eagle3"]
    fields = ("tokens", "proposed", "accepted", "accepted_at", "reached_at", "target_forwards")
    decoded = 0
    for d in drafts:
        path = results / f"{d.name}-heldout-k{k}-t0.json"
        if not path.is_file():  # the engine decodes only the best and the compared drafts
            continue
        spec = json.loads(path.read_text())["results"]
        refs = [{**prompts[r["id"]], "tokens": base[r["id"]]["tokens"]} for r in spec]
        fast = teacher_forced_results(d, models, refs, k, budget, num_ids)
        for e, f in zip(spec, fast, strict=True):
            assert {c: f[c] for c in fields} == {c: e[c] for c in fields}, (d.name, e["id"])
        decoded += 1
    # the engine decoded eagle3-checkpoint-0 (init), -6 (last) and the best of the kind (one
    # of those two, or a third): every one of them was checked above
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    engine = {
        r["checkpoint"]
        for r in board["rows"]
        if r["kind"] == "eagle3" and r["measured_by"] == "engine" and r["eval_set"] == "heldout"
    }
    assert engine >= {"eagle3-checkpoint-0", "eagle3-checkpoint-6"}
    assert decoded == len(engine)


def test_the_eagle3_row_exports_validated_and_decodes_losslessly(both_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from draftsmith.evaluate.engine import SpeculativeDecoder
    from draftsmith.kinds.eagle3.export import load_eagle3, validate_eagle3_export
    from draftsmith.kinds.eagle3.proposer import Eagle3Proposer
    from draftsmith.models import resolve_model

    out, _ = both_run
    dest = tmp_path / "eagle3-export"
    proc = draftsmith(
        "export",
        str(out / "config.yaml"),
        f"export.output_dir={dest}",
        "export.checkpoint=eagle3-checkpoint-6",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate_eagle3_export(dest)
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    k = board["recommended_k"]
    assert json.loads((dest / "speculative_config.json").read_text()) == {
        "method": "eagle3",
        "model": str(dest.resolve()),
        "num_speculative_tokens": k,
    }
    config = json.loads((dest / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["draft_vocab_size"] == 128
    card = (dest / "README.md").read_text()
    assert "- kind: eagle3" in card
    assert "hidden states of layers [1, 2, 3], draft vocabulary of 128 tokens" in card
    assert "training-time test 3 steps" in card and '"method": "eagle3"' in card
    # the exported weights are the checkpoint's, plus the target's embeddings
    from safetensors.torch import load_file

    got = load_file(dest / "model.safetensors")
    ckpt = load_file(out / "eagle3" / "checkpoints" / "checkpoint-6" / "model.safetensors")
    assert all(torch.equal(got[name], w) for name, w in ckpt.items())
    target = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random-llama")).eval()
    assert torch.equal(got["embed_tokens.weight"], target.get_input_embeddings().weight)
    head = load_eagle3(dest, target)
    prompt = [1, 72, 101, 108, 108, 111]
    ref = SpeculativeDecoder(target).generate(prompt, 20).tokens
    assert SpeculativeDecoder(target, Eagle3Proposer(head), k=k).generate(prompt, 20).tokens == ref
    # an existing export dir: the export stage's own error and exit code
    again = draftsmith(
        "export",
        str(out / "config.yaml"),
        f"export.output_dir={dest}",
        "export.checkpoint=eagle3-checkpoint-6",
    )
    assert again.returncode == 1
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .endswith(f"{dest}: export dir exists; set export.overwrite=true to replace it")
    )


def test_estimate_acceptance_script_replays_both_kinds_as_the_leaderboard(both_run):
    """scripts/estimate_acceptance.py finds every checkpoint of both kinds in a run and gives
    each the acceptance its teacher-forced leaderboard row has (same prompts, k, budget)."""
    import re
    import subprocess
    import sys

    out, _ = both_run
    cfg = load_config(out / "config.yaml")
    k, budget = cfg.evaluate.num_speculative_tokens, cfg.evaluate.max_new_tokens
    proc = subprocess.run(
        [sys.executable, "scripts/estimate_acceptance.py", str(out), "--k", str(k)]
        + ["--max-new-tokens", str(budget), "--draft-weights", "int8"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = {
        Path(m[1]).relative_to(out).as_posix(): float(m[2])
        for m in re.finditer(r"^(\S+): acceptance ([0-9.]+)", proc.stdout, re.M)
    }
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    tf = {
        r["path"]: r["acceptance_rate"]
        for r in board["rows"]
        if r["measured_by"] == "teacher_forced"
    }
    assert set(printed) == set(tf)  # every checkpoint of both kinds
    assert any(p.startswith("eagle3/") for p in printed)
    for path, acceptance in tf.items():
        assert printed[path] == pytest.approx(acceptance, abs=5e-4), path
    # --draft-weights: each draft again with rounded weights, paired against itself as loaded
    line = r"^(\S+) \[int8\]: acceptance [0-9.]+ .* alpha vs as loaded"
    rounded = re.findall(line, proc.stdout, re.M)
    assert {Path(p).relative_to(out).as_posix() for p in rounded} == set(tf)
    # where each draft's misses fall, as its leaderboard row has it
    unsure = {
        r["path"]: r.get("misses_target_unsure")
        for r in board["rows"]
        if r["measured_by"] == "teacher_forced"
    }
    said = re.findall(
        r"^(\S+): acceptance .*\n.*\n    misses where the target is unsure \(p\(own token\) < "
        r"0\.8\): (\S+);",
        proc.stdout,
        re.M,
    )
    assert {Path(p).relative_to(out).as_posix() for p, _ in said} == set(tf)
    for path, share in said:
        expected = unsure[Path(path).relative_to(out).as_posix()]
        assert share == ("-" if expected is None else f"{expected:.0%}"), path


def test_both_kinds_decode_with_int4_weights_and_stay_lossless(both_run, tmp_path):
    """evaluate.draft_weights: int4 on a run of both kinds (the long pair config's setting): the
    eagle3 head's own layers are rounded too (its fc is read for its dtype), the target's are
    not, and every engine row still gives the target's output."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(both_run[0], out)
    proc = draftsmith(
        "evaluate",
        "configs/tiny.yaml",
        f"run.output_dir={out}",
        KINDS,
        QUIET,
        "evaluate.draft_weights=int4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    assert board["draft_weights"] == "int4"
    assert any(name.startswith("eagle3-") for name in board["quant_widths"])
    engine = [r for r in board["rows"] if r["measured_by"] == "engine"]
    assert {r["kind"] for r in engine} == {"independent", "eagle3"}
    assert all(r["lossless_match_rate"] == 1.0 for r in engine)
