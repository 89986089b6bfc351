"""`draftsmith run configs/tiny.yaml` end to end, then export's own checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.config import load_config
from draftsmith.errors import DraftsmithError
from draftsmith.export import run_export
from draftsmith.io import TMP_MARK

REPO = Path(__file__).resolve().parents[1]
# for runs whose W&B log no test reads: wandb.init costs seconds per stage
QUIET = "tracking.wandb.mode=disabled"


def draftsmith(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_run_writes_every_artifact(tiny_run):
    cfg = load_config(tiny_run / "config.yaml")
    assert cfg.run.output_dir == str(tiny_run)
    assert (tiny_run / "data" / "dataset").is_dir() and (tiny_run / "data" / "meta.json").is_file()
    steps = sorted(
        int(p.name.split("-")[1]) for p in (tiny_run / "checkpoints").glob("checkpoint-*")
    )
    assert steps[0] == 0 and steps[-1] == cfg.distill.max_steps

    board = json.loads((tiny_run / "eval" / "leaderboard.json").read_text())
    assert {r["step"] for r in board["rows"] if r["step"] is not None} == set(steps)
    assert {r["checkpoint"]: r["role"] for r in board["rows"]} == {
        f"checkpoint-{s}": "distilled" if s else "init" for s in steps
    }
    for row in board["rows"]:
        # the replay decodes nothing; every engine run is checked lossless
        lossless = 1.0 if row["measured_by"] == "engine" else None
        assert row["lossless_match_rate"] == lossless and row["eval_set"] == "heldout"
        assert row["acceptance_rate"] == row["tokens_accepted"] / row["tokens_proposed"]
        assert row["num_speculative_tokens"] == cfg.evaluate.num_speculative_tokens
    ranked = {r["checkpoint"] for r in board["rows"] if r["measured_by"] == "teacher_forced"}
    assert ranked == {f"checkpoint-{s}" for s in steps}
    engine = {r["checkpoint"] for r in board["rows"] if r["measured_by"] == "engine"}
    assert {board["best"], "checkpoint-0", f"checkpoint-{steps[-1]}"} == engine
    assert (tiny_run / "eval" / "leaderboard.csv").is_file()
    assert list((tiny_run / "eval").glob("*.png"))
    assert [s["k"] for s in board["k_sweep"]] == cfg.evaluate.k_sweep
    # the k with the best modelled speedup (timed costs), not the best wall-clock draw
    modelled = max(board["k_sweep"], key=lambda s: (s["modelled_speedup_verify"], -s["k"]))
    assert board["recommended_k"] == modelled["k"]


def test_export_loads_and_serves_as_assistant_model(tiny_run):
    out = tiny_run / "export"
    board = json.loads((tiny_run / "eval" / "leaderboard.json").read_text())
    spec = json.loads((out / "speculative_config.json").read_text())
    assert spec == {
        "method": "draft_model",
        "model": str(out.resolve()),
        "num_speculative_tokens": board["recommended_k"],
    }
    assert not list(out.glob("*.pt")), "train state must not be exported"
    card = (out / "README.md").read_text()
    best = next(r for r in board["rows"] if r["checkpoint"] == board["best"])
    assert f"{best['acceptance_rate']:.3f}" in card and "vllm serve" in card
    assert "assistant_model=draft" in card
    trained = "none: the untrained" if best["role"] == "init" else "forward_kl (teacher: online"
    assert f"- training: {trained}" in card
    assert "- target outputs: greedy, at most 16 new tokens" in card  # configs/tiny.yaml
    (cmp,) = board["comparisons"]  # the last checkpoint against the init, paired by prompt
    assert cmp["against"] == "checkpoint-0" and f"{cmp['diff']:+.3f}" in card
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == board["recommended_k"]
    assert gen["assistant_confidence_threshold"] == 0.0  # k drafts a round, as measured

    cfg = load_config(tiny_run / "config.yaml")
    from draftsmith.models import resolve_model

    target = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.target.model))
    draft = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("def add(a, b):", return_tensors="pt")
    plain = target.generate(**ids, max_new_tokens=12, do_sample=False)
    assisted = target.generate(**ids, max_new_tokens=12, do_sample=False, assistant_model=draft)
    assert torch.equal(plain, assisted)


def _agreement(draft, prompt_ids: list[int], tokens: list[int]) -> list[bool]:
    """Teacher-forced: does the draft's argmax after prompt + tokens[:i] equal tokens[i]?"""
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids + tokens[:-1]])
        logits = draft(input_ids=ids).logits[0, -len(tokens) :]  # (n, V)
    return (logits.argmax(-1) == torch.tensor(tokens)).tolist()


def test_engine_counts_equal_a_teacher_forced_replay(tiny_run):
    """Each engine-decoded draft's per-prompt counts equal the counts one teacher-forced pass
    over the target's own output predicts (metrics.greedy_rounds), and the leaderboard row
    sums them: an independent check of the engine, the row and the stage's own check."""
    from draftsmith.evaluate.metrics import greedy_rounds
    from draftsmith.evaluate.prompts import load_prompts

    cfg = load_config(tiny_run / "config.yaml")
    k, budget = cfg.evaluate.num_speculative_tokens, cfg.evaluate.max_new_tokens
    board = json.loads((tiny_run / "eval" / "leaderboard.json").read_text())
    results = tiny_run / "eval" / "results"
    (base_file,) = results.glob("target-only-heldout-*.json")
    base = {r["id"]: r for r in json.loads(base_file.read_text())["results"]}
    prompts = {p["id"]: p["prompt_ids"] for p in load_prompts(tiny_run)}
    checked = 0
    engine_rows = [r for r in board["rows"] if r["measured_by"] == "engine"]
    for row in engine_rows:
        assert row["replay_match_rate"] == 1.0  # the stage compared them too
        spec_file = results / f"{row['checkpoint']}-heldout-k{k}-t0.json"
        spec = json.loads(spec_file.read_text())["results"]
        assert row["tokens_proposed"] == sum(r["proposed"] for r in spec)
        assert row["tokens_accepted"] == sum(r["accepted"] for r in spec)
        draft = AutoModelForCausalLM.from_pretrained(tiny_run / row["path"]).eval()
        for r in spec:
            ref = base[r["id"]]["tokens"]
            assert r["tokens"] == ref  # greedy: the target's own output
            if len(ref) < budget:
                continue  # stopped at EOS: the engine drafts past it, the replay cannot
            rounds = greedy_rounds(_agreement(draft, prompts[r["id"]], ref), k)
            got = {key: r[key] for key in ("proposed", "accepted", "accepted_at", "reached_at")}
            assert got == {key: rounds[key] for key in got}, (row["checkpoint"], r["id"])
            checked += 1
    assert checked >= len(engine_rows)  # the replay covered prompts of every draft


def test_rerun_skips_finished_stages(tiny_run):
    board_before = (tiny_run / "eval" / "leaderboard.json").read_text()
    weights = sorted((tiny_run / "checkpoints").glob("checkpoint-*/model.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in weights]
    proc = draftsmith("run", "configs/tiny.yaml", f"run.output_dir={tiny_run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "already holds the best draft; skipping" in proc.stdout
    assert [p.stat().st_mtime_ns for p in weights] == stamps  # no checkpoint was rewritten
    after = json.loads((tiny_run / "eval" / "leaderboard.json").read_text())
    assert [r["checkpoint"] for r in after["rows"]] == [
        r["checkpoint"] for r in json.loads(board_before)["rows"]
    ]


def _measured(board: dict) -> dict:
    """What a rerun must reproduce exactly (timings aside): each row's counts and checks."""
    keys = ("tokens_generated", "tokens_proposed", "tokens_accepted", "lossless_match_rate")
    return {
        (r["eval_set"], r["measured_by"], r["checkpoint"]): {k: r[k] for k in keys}
        for r in board["rows"]
    }


@pytest.mark.parametrize(
    "crash", ["step:4", "evaluate:checkpoint-3:heldout:tf", "evaluate:checkpoint-6:heldout:k3"]
)
def test_run_killed_mid_stage_and_rerun_gives_the_same_results(tiny_run, tmp_path, crash):
    """A kill in distill reruns the whole pipeline from nothing; a kill in evaluate starts
    from a copy of the session's run without its eval/ and export/ (generate and distill
    resumed or redone are the first case's to check)."""
    out = tmp_path / "run"
    if crash.startswith("evaluate:"):
        shutil.copytree(
            tiny_run, out, symlinks=True, ignore=shutil.ignore_patterns("eval", "export")
        )
    killed = draftsmith(
        "run",
        "configs/tiny.yaml",
        f"run.output_dir={out}",
        QUIET,
        env={"DRAFTSMITH_TEST_KILL": crash},
    )
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL, mid-stage
    assert not (out / "export").exists()
    again = draftsmith("run", "configs/tiny.yaml", f"run.output_dir={out}", QUIET)
    assert again.returncode == 0, again.stderr[-3000:]
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    ref = json.loads((tiny_run / "eval" / "leaderboard.json").read_text())
    assert _measured(board) == _measured(ref)
    assert board["best"] == ref["best"]
    assert not list(out.rglob(f"*{TMP_MARK}*"))  # no half-written file or dir survives
    assert (out / "export" / "speculative_config.json").is_file()


def test_export_refuses_existing_dir_and_unknown_checkpoint(tiny_run):
    cfg = load_config(tiny_run / "config.yaml")
    with pytest.raises(DraftsmithError, match="export dir exists; set export.overwrite=true"):
        run_export(cfg)
    cfg.export.output_dir = str(tiny_run / "export-2")
    cfg.export.checkpoint = "checkpoint-999"
    with pytest.raises(DraftsmithError, match="'checkpoint-999' is not on the leaderboard"):
        run_export(cfg)
    assert not (tiny_run / "export-2").exists()


def test_export_without_leaderboard_is_one_line(tmp_path):
    proc = draftsmith("export", "configs/tiny.yaml", f"run.output_dir={tmp_path / 'empty'}")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("no leaderboard yet; run `draftsmith evaluate CONFIG` first")
    )
    assert not (tmp_path / "empty" / "export").exists()


def test_the_leaderboard_reads_back_into_rows_that_write_it_again(tiny_run):
    """leaderboard.json's rows read back into LeaderboardRow records (evaluate/records.py)
    that write the same JSON, key for key in the same order, and the same CSV."""
    from draftsmith.evaluate.records import LeaderboardRow, rows_from_dicts
    from draftsmith.evaluate.report import leaderboard_csv

    path = tiny_run / "eval" / "leaderboard.json"
    board = json.loads(path.read_text())
    rows = rows_from_dicts(board["rows"], path)
    assert [r.checkpoint for r in rows] == [r["checkpoint"] for r in board["rows"]]
    assert json.dumps([r.to_dict() for r in rows]) == json.dumps(board["rows"])
    assert leaderboard_csv(rows).encode() == (tiny_run / "eval" / "leaderboard.csv").read_bytes()
    exported = json.loads((tiny_run / "export" / "leaderboard_row.json").read_text())
    row = LeaderboardRow.from_dict(exported, "leaderboard_row.json")
    assert json.dumps(row.to_dict()) == json.dumps(exported) and row.trained_with is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_memory_hands_freed_heap_back_between_stages():
    """The stages share one process: memory a stage freed must leave the process before the
    next stage's models load (glibc otherwise keeps freed heap pages, as measured on the
    pair: README "The main job"). Run in a fresh interpreter: the test process's own heap,
    fragmented by earlier tests, would decide where the blocks land."""
    probe = """
import os, torch
from pathlib import Path
from draftsmith.pipeline import release_memory
def rss_mb():
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
xs = [torch.ones(16384) for _ in range(8000)]  # 64 KiB each: heap blocks, not mmaps
keep = torch.ones(16)  # allocated last, so the freed blocks are not the heap's top
del xs
freed = rss_mb()
assert release_memory()
print(freed, rss_mb(), float(keep.sum()))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    freed, trimmed, kept = map(float, proc.stdout.split())
    assert freed - trimmed > 0.8 * 8000 * 64 / 1024, (freed, trimmed)  # ~500 MB back
    assert kept == 16


def test_the_evaluate_stage_logs_each_checkpoints_acceptance_to_wandb(tiny_run):
    """tiny.yaml tracks offline: evaluate's W&B history holds, per distill step, the primary
    set's acceptance and alpha of that checkpoint's ranking row, as the leaderboard has them."""
    from test_distill_helpers import read_wandb_history

    from draftsmith.evaluate.records import rows_from_dicts
    from draftsmith.evaluate.report import ranking_rows

    path = tiny_run / "eval" / "leaderboard.json"
    board = json.loads(path.read_text())
    rows = ranking_rows(rows_from_dicts(board["rows"], path), board["primary_eval_set"])
    want = {(r.step, r.acceptance_rate, r.alpha) for r in rows}
    assert len(want) == 3  # checkpoints 0, 3, 6
    # wandb's service may write the offline log a moment after run.finish() returns
    deadline, got = time.time() + 60, set()
    while got != want and time.time() < deadline:
        history = read_wandb_history(tiny_run / "wandb")
        got = {
            (h["eval/step"], h["eval/acceptance_rate"], h["eval/alpha"])
            for h in history
            if "eval/step" in h
        }
        time.sleep(0 if got == want else 0.5)
    assert got == want
