"""The evaluate stage end to end on tiny models: leaderboard, caching, losslessness, errors."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.config import config_from_dict
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate.prompts import select_prompts
from draftsmith.evaluate.ranking import pick_best, recommend_k
from draftsmith.evaluate.stage import run_evaluate

PROMPTS = [
    ("p0", "code", "def add(a, b):"),
    ("p1", "chat", "Tell me a story about"),
    ("p2", "code", "for i in range(10):"),
    ("p3", "chat", "What is the capital of"),
    ("p4", "math", "2 + 2 ="),
]


def _save_draft(model, tok, path: Path, step: int) -> None:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "draftsmith_checkpoint.json").write_text(json.dumps({"step": step}))


def _trimmed(model, keep: int):
    """A from_target-style draft: the target's first `keep` layers."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:keep]
    draft.config.num_hidden_layers = keep
    return draft


def _tiny_target(path: Path):
    """3 layers, untied head: a tied random model just repeats its input token."""
    from transformers import LlamaForCausalLM

    from draftsmith.models import build_byte_tokenizer, tiny_llama_config

    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    cfg = tiny_llama_config(
        len(tok),
        num_hidden_layers=3,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.fixture
def target_dir(tmp_path) -> Path:
    _tiny_target(tmp_path / "target")
    return tmp_path / "target"


@pytest.fixture
def run_dir(tmp_path, target_dir) -> Path:
    out = tmp_path / "run"
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    lines = []
    for pid, cat, text in PROMPTS:
        ids = tok(text)["input_ids"]
        lines.append(
            json.dumps(
                {
                    "id": pid,
                    "prompt_text": text,
                    "prompt_ids": ids,
                    "category": cat,
                    "source": "test",
                }
            )
        )
    (out / "data").mkdir(parents=True)
    (out / "data" / "eval_prompts.jsonl").write_text("\n".join(lines) + "\n")
    ckpts = out / "checkpoints"
    _save_draft(_trimmed(target, 1), tok, ckpts / "checkpoint-0", 0)
    _save_draft(_trimmed(target, 2), tok, ckpts / "checkpoint-4", 4)
    _save_draft(target, tok, ckpts / "checkpoint-8", 8)  # a perfect draft
    return out


def _cfg(out: Path, **evaluate):
    target = out.parent / "target"
    ev = {"num_speculative_tokens": 3, "k_sweep": [1, 3], "max_new_tokens": 12, **evaluate}
    return config_from_dict(
        {
            "run": {"output_dir": str(out), "device": "cpu"},
            "target": {"model": str(target)},
            "evaluate": ev,
            "tracking": {"wandb": {"mode": "disabled"}},
        }
    )


def test_evaluate_ranks_checkpoints_and_writes_reports(run_dir, capsys):
    run_evaluate(_cfg(run_dir))
    board = json.loads((run_dir / "eval" / "leaderboard.json").read_text())
    rows = {r["checkpoint"]: r for r in board["rows"]}
    assert [r["step"] for r in board["rows"]] == [0, 4, 8]
    perfect = rows["checkpoint-8"]
    assert perfect["acceptance_rate"] == 1.0
    assert perfect["per_position_acceptance"] == [1.0, 1.0, 1.0]
    for row in board["rows"]:
        assert row["lossless_match_rate"] == 1.0
        assert row["num_prompts"] == len(PROMPTS)
        assert set(row["per_category"]) == {"code", "chat", "math"}
        assert 1.0 <= row["mean_accepted_length"] <= 4.0
        assert row["tokens_accepted"] <= row["tokens_proposed"]
    assert board["best"] == "checkpoint-8" and board["best_path"].endswith("checkpoint-8")
    assert [s["k"] for s in board["k_sweep"]] == [1, 3]
    assert board["recommended_k"] in (1, 3)
    csv = (run_dir / "eval" / "leaderboard.csv").read_text().splitlines()
    assert csv[0].startswith("checkpoint,kind,step,acceptance_rate") and len(csv) == 4
    assert all(line.split(",")[1] == "independent" for line in csv[1:])
    for name in ("acceptance_vs_step.png", "per_position_best.png", "k_sweep.png"):
        assert (run_dir / "eval" / name).stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "*checkpoint-8" in printed
    # the last distilled checkpoint (the perfect draft) against the init, paired by prompt
    (cmp,) = board["comparisons"]
    assert (cmp["draft"], cmp["against"], cmp["role"]) == ("checkpoint-8", "checkpoint-0", "init")
    diff = perfect["acceptance_rate"] - rows["checkpoint-0"]["acceptance_rate"]
    assert cmp["diff"] == pytest.approx(diff) and diff > 0
    assert cmp["ci95"][0] <= cmp["diff"] <= cmp["ci95"][1] and cmp["num_prompts"] == len(PROMPTS)
    assert "checkpoint-8 vs checkpoint-0: acceptance +" in printed


def test_rerun_evaluates_only_new_checkpoints(run_dir, target_dir):
    cfg = _cfg(run_dir)
    run_evaluate(cfg)
    results = run_dir / "eval" / "results"
    stamps = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    _save_draft(_trimmed(target, 2), tok, run_dir / "checkpoints" / "checkpoint-12", 12)
    run_evaluate(cfg)
    after = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    assert {n: after[n] for n in stamps} == stamps  # nothing measured again
    assert set(after) - set(stamps) == {"checkpoint-12-k3-t0.json"}
    board = json.loads((run_dir / "eval" / "leaderboard.json").read_text())
    assert [r["step"] for r in board["rows"]] == [0, 4, 8, 12]


def test_copied_run_dir_is_not_measured_again_and_a_rewritten_checkpoint_is(
    run_dir, target_dir, monkeypatch
):
    """The cache keys on model content: a moved run (same files) hits, new weights miss."""
    from draftsmith.evaluate import engine

    small = dict(k_sweep=[3], max_prompts=2, max_new_tokens=6)
    run_evaluate(_cfg(run_dir, **small))
    copy_root = run_dir.parent / "copied"
    shutil.copytree(run_dir, copy_root / "run")
    shutil.copytree(target_dir, copy_root / "target")
    results = copy_root / "run" / "eval" / "results"
    stamps = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again: the cache missed")

    with monkeypatch.context() as m:
        m.setattr(engine.SpeculativeDecoder, "generate", no_decoding)
        run_evaluate(_cfg(copy_root / "run", **small))
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == stamps

    ckpt = copy_root / "run" / "checkpoints" / "checkpoint-4"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(0.5)  # same shapes, same file size
    size = (ckpt / "model.safetensors").stat().st_size
    model.save_pretrained(ckpt)
    assert (ckpt / "model.safetensors").stat().st_size == size
    run_evaluate(_cfg(copy_root / "run", **small))
    after = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    changed = {n for n in stamps if after[n] != stamps[n]}
    assert changed == {"checkpoint-4-k3-t0.json"}


def test_baseline_drafts_and_max_prompts(run_dir, target_dir):
    cfg = _cfg(run_dir, baselines=[str(target_dir)], max_prompts=3, k_sweep=[3])
    run_evaluate(cfg)
    board = json.loads((run_dir / "eval" / "leaderboard.json").read_text())
    base = board["rows"][-1]
    assert base["checkpoint"] == "target" and base["step"] is None
    assert base["acceptance_rate"] == 1.0 and base["num_prompts"] == 3
    assert set(base["per_category"]) == {"code", "chat", "math"}  # the cap keeps every category


def test_tokenizer_mismatch_is_one_clear_error(run_dir):
    from transformers import LlamaForCausalLM

    from draftsmith.models import tiny_llama_config

    other = AutoTokenizer.from_pretrained(run_dir / "checkpoints" / "checkpoint-0")
    other.add_tokens(["<extra-token>"])
    bad = run_dir / "checkpoints" / "checkpoint-2"
    _save_draft(LlamaForCausalLM(tiny_llama_config(len(other))), other, bad, 2)
    with pytest.raises(DraftsmithError, match="tokenizer mismatch between target"):
        run_evaluate(_cfg(run_dir))


def test_lossless_failure_names_prompt_and_position(run_dir, monkeypatch):
    from draftsmith.evaluate import engine

    real = engine.greedy_accept

    def off_by_one(logits, drafted):  # a broken verifier: emits token+1 on rejection
        n, tok = real(logits, drafted)
        return n, (tok + 1) % logits.shape[-1]

    monkeypatch.setattr(engine, "greedy_accept", off_by_one)
    with pytest.raises(
        DraftsmithError,
        match=r"checkpoint-0: greedy speculative output differs .* prompt 'p0' at new token \d+",
    ):
        run_evaluate(_cfg(run_dir))
    assert not list((run_dir / "eval" / "results").glob("checkpoint-*"))  # nothing cached


def test_missing_inputs_are_clear_errors(tmp_path):
    with pytest.raises(DraftsmithError, match="run `draftsmith generate CONFIG` first"):
        run_evaluate(_cfg(tmp_path / "none"))
    (tmp_path / "x" / "data").mkdir(parents=True)
    (tmp_path / "x" / "data" / "eval_prompts.jsonl").write_text(
        json.dumps({"id": "a", "prompt_ids": [5, 6], "category": "c"}) + "\n"
    )
    with pytest.raises(DraftsmithError, match="run `draftsmith distill CONFIG` first"):
        run_evaluate(_cfg(tmp_path / "x"))


def test_select_prompts_round_robin_and_deterministic():
    prompts = [{"id": i, "category": c} for i, c in enumerate("aaaabbc")]
    picked = select_prompts(prompts, 4)
    assert [p["id"] for p in picked] == [0, 1, 4, 6]
    assert select_prompts(prompts, 4) == picked
    assert select_prompts(prompts, None) == prompts


def test_pick_best_and_recommend_k():
    rows = [
        {"checkpoint": "a", "acceptance_rate": 0.2, "speedup": 1.5},
        {"checkpoint": "b", "acceptance_rate": 0.4, "speedup": None},
        {"checkpoint": "c", "acceptance_rate": 0.4, "speedup": 1.1},
    ]
    assert pick_best(rows, "acceptance_rate")["checkpoint"] == "b"
    assert pick_best(rows, "speedup")["checkpoint"] == "a"
    sweep = [{"k": 1, "speedup": 1.2}, {"k": 4, "speedup": 1.6}, {"k": 8, "speedup": 1.4}]
    assert recommend_k(sweep) == 4
