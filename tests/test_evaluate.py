"""The evaluate stage end to end on tiny models: leaderboard, caching, losslessness, errors."""

from __future__ import annotations

import copy
import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch
from board_rows import make_row
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.config import config_from_dict
from draftsmith.data import EVAL_PROMPT_KEYS
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.evaluate.metrics import summarize
from draftsmith.evaluate.native import timing_base
from draftsmith.evaluate.prompts import select_prompts
from draftsmith.evaluate.ranking import (
    costed_sweep_entry,
    dynamic_sweep_entry,
    pick_best,
    recommend_k,
    recommend_k_by_category,
)
from draftsmith.evaluate.records import LeaderboardRow, MetricSummary, rows_from_dicts, sweep_label
from draftsmith.evaluate.report import format_category_ks, format_limits, format_recommendation
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
    record = {"step": step, "kind": "independent", "init": "from_target", "loss_name": "forward_kl"}
    (path / "draftsmith_checkpoint.json").write_text(json.dumps({**record, "settings": {}}))


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
                    "eval_set": "heldout",
                    "messages": [["user", text]],
                    "followups": [],
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


def _board(run_dir: Path) -> dict:
    return json.loads((run_dir / "eval" / "leaderboard.json").read_text())


def _by(board: dict, measured_by: str, eval_set: str = "heldout") -> dict[str, dict]:
    return {
        r["checkpoint"]: r
        for r in board["rows"]
        if r["measured_by"] == measured_by and r["eval_set"] == eval_set
    }


COUNTS = ("tokens_generated", "tokens_proposed", "tokens_accepted", "target_forwards")


def test_evaluate_ranks_checkpoints_and_writes_reports(run_dir, capsys):
    run_evaluate(_cfg(run_dir))
    board = _board(run_dir)
    tf, engine = _by(board, "teacher_forced"), _by(board, "engine")
    # every draft ranked by its replay; the engine decodes the best (checkpoint-8) and the
    # drafts of the comparison (the last distilled, checkpoint-8, against the init)
    assert list(tf) == ["checkpoint-0", "checkpoint-4", "checkpoint-8"]
    assert list(engine) == ["checkpoint-0", "checkpoint-8"]
    perfect = tf["checkpoint-8"]
    assert perfect["acceptance_rate"] == 1.0
    assert perfect["per_position_acceptance"] == [1.0, 1.0, 1.0]
    for row in tf.values():
        assert row["num_prompts"] == len(PROMPTS) and row["lossless_match_rate"] is None
        assert row["speedup"] is None and set(row["per_category"]) == {"code", "chat", "math"}
        assert 1.0 <= row["mean_accepted_length"] <= 4.0
        assert row["tokens_accepted"] <= row["tokens_proposed"]
    for name, row in engine.items():
        # all 5 prompts are under evaluate.engine_max_prompts: the counts are the replay's
        assert row["num_prompts"] == len(PROMPTS) and row["lossless_match_rate"] == 1.0
        assert {c: row[c] for c in COUNTS} == {c: tf[name][c] for c in COUNTS}
        assert row["per_position_acceptance"] == tf[name]["per_position_acceptance"]
        assert row["replay_match_rate"] == 1.0 and row["speedup"] > 0
        assert row["speedup_iqr"][0] <= row["speedup_iqr"][1]
    assert board["best"] == "checkpoint-8" and board["best_path"].endswith("checkpoint-8")
    assert board["primary_eval_set"] == "heldout"
    assert board["eval_sets"] == {
        "heldout": {"num_prompts": 5, "engine_prompts": 5, "categories": ["chat", "code", "math"]}
    }
    assert [s["k"] for s in board["k_sweep"]] == [1, 3]
    for s in board["k_sweep"]:  # a perfect draft: every k accepts all, (k+1) tokens a forward
        assert s["acceptance_rate"] == 1.0 and s["mean_accepted_length"] == s["k"] + 1
        assert s["acceptance_measured_by"] == "teacher_forced" and s["engine_prompts"] == 5
        # the model's median over the timing repeats, each repeat's own c and v_k
        cs, vs = board["costs"]["c"], board["costs"]["v"][str(s["k"])]
        per_repeat = [(s["k"] + 1) / (s["k"] * c + v) for c, v in zip(cs, vs)]
        assert s["modelled_speedup_verify"] == pytest.approx(statistics.median(per_repeat))
        assert s["draft_cost_ratio"] == pytest.approx(statistics.median(cs))
        # the in-run model: the same formula on the engine's own results at that k
        results = run_dir / "eval" / "results"
        spec = json.loads((results / f"checkpoint-8-heldout-k{s['k']}-t0.json").read_text())
        (base,) = [json.loads(p.read_text()) for p in results.glob("target-only-heldout-*.json")]
        # timed against the target alone decoded beside it, prompt by prompt (same tokens)
        assert [p["tokens"] for p in spec["paired"]] == [b["tokens"] for b in base["results"]]
        timed = timing_base(base["results"], spec)
        assert [t["wall_time"] for t in timed] == [p["wall_time"] for p in spec["paired"]]
        in_run = summarize(spec["results"], timed, s["k"])["modelled_speedup_verify"]
        assert s["modelled_speedup_in_run"] == pytest.approx(in_run) and in_run > 0
    assert board["costs"]["repeats"] == 30 and len(board["costs"]["c"]) == 30
    rec = board["k_recommendation"]
    modelled = max(board["k_sweep"], key=lambda s: s["modelled_speedup_verify"])
    assert board["recommended_k"] == rec["k"] == modelled["k"]
    assert rec["by"] == "modelled_speedup_verify"
    # the sweep split by category: each category's alpha through the same costs, and a k each
    for s in board["k_sweep"]:
        assert set(s["per_category"]) == {"code", "chat", "math"}
        for point in s["per_category"].values():  # the perfect draft: (k+1) / (k c + v)
            assert point["alpha"] == 1.0 and point["engine_prompts"] >= 1
            assert point["modelled_speedup_verify"] == pytest.approx(s["modelled_speedup_verify"])
    assert {cat: r["k"] for cat, r in board["k_by_category"].items()} == dict.fromkeys(
        ["chat", "code", "math"], rec["k"]
    )
    # the misses split by the target's own confidence: a partition of the judged drafts, the
    # target's probabilities measured once per prompt and cached beside its outputs
    (probs,) = (run_dir / "eval" / "results").glob("target-p-heldout-*.json")
    assert [len(p) for p in json.loads(probs.read_text())["results"]] == [
        len(b["tokens"]) for b in base["results"]
    ]
    for row in [*tf.values(), *engine.values()]:
        sure, a_sure, a_unsure = (
            row["target_sure_share"],
            row["alpha_target_sure"],
            row["alpha_target_unsure"],
        )
        assert row["alpha"] == pytest.approx(sure * (a_sure or 0) + (1 - sure) * (a_unsure or 0))
    assert perfect["misses_target_unsure"] is None  # a perfect draft has no misses
    assert 0 <= tf["checkpoint-0"]["misses_target_unsure"] <= 1
    printed = capsys.readouterr().out
    assert "where the drafts miss (the target sure: p(own token) >= 0.8):" in printed
    assert "  checkpoint-0: " in printed.split("where the drafts miss")[1]
    csv = (run_dir / "eval" / "leaderboard.csv").read_text().splitlines()
    assert csv[0].startswith("checkpoint,kind,step,acceptance_rate") and len(csv) == 1 + 5
    assert "misses_target_unsure" in csv[0].split(",")
    assert all(line.split(",")[1] == "independent" for line in csv[1:])
    for name in ("acceptance_vs_step.png", "per_position_best.png", "k_sweep.png"):
        assert (run_dir / "eval" / name).stat().st_size > 1000
    assert "== eval set heldout (primary: best draft and k chosen here): 5 prompts" in printed
    assert printed.count("*checkpoint-8") == 2  # its replay row and its engine row
    assert f"recommended k = {rec['k']}, by the modelled speedup" in printed
    assert f"what limits k={rec['k']}: its draft steps take " in printed
    assert printed.count("in-run model ") == 2  # one per k of the sweep
    assert "recommended k per category (its own acceptance, the run's costs):" in printed
    assert f"  code: k={rec['k']} (alpha 1.000, modelled " in printed
    # the last distilled checkpoint (the perfect draft) against the init, paired by prompt
    (cmp,) = board["comparisons"]
    assert (cmp["draft"], cmp["against"], cmp["role"]) == ("checkpoint-8", "checkpoint-0", "init")
    diff = perfect["acceptance_rate"] - tf["checkpoint-0"]["acceptance_rate"]
    assert cmp["diff"] == pytest.approx(diff) and diff > 0 and cmp["eval_set"] == "heldout"
    assert cmp["ci95"][0] <= cmp["diff"] <= cmp["ci95"][1] and cmp["num_prompts"] == len(PROMPTS)
    assert "[heldout] checkpoint-8 vs checkpoint-0: acceptance +" in printed


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
    # its replay, and the engine: the newest checkpoint is now the one compared with the init
    assert set(after) - set(stamps) == {
        "checkpoint-12-heldout-tf.json",
        "checkpoint-12-heldout-k3-t0.json",
    }
    board = _board(run_dir)
    assert [r["step"] for r in board["rows"] if r["measured_by"] == "teacher_forced"] == [
        0,
        4,
        8,
        12,
    ]


def test_copied_run_dir_is_not_measured_again_and_a_rewritten_checkpoint_is(
    run_dir, target_dir, monkeypatch
):
    """The cache keys on model content: a moved run (same files) hits, new weights miss."""
    from draftsmith.evaluate import engine, teacher_forced, timing

    small = dict(k_sweep=[3], max_prompts=2, max_new_tokens=6)
    run_evaluate(_cfg(run_dir, **small))
    copy_root = run_dir.parent / "copied"
    shutil.copytree(run_dir, copy_root / "run")
    shutil.copytree(target_dir, copy_root / "target")
    results = copy_root / "run" / "eval" / "results"
    stamps = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}

    def no_work(*args, **kwargs):
        raise AssertionError("measured again: the cache missed")

    with monkeypatch.context() as m:
        m.setattr(engine.SpeculativeDecoder, "generate", no_work)
        m.setattr(teacher_forced, "agreement_and_margin", no_work)
        m.setattr(timing, "measure_costs", no_work)
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
    assert changed == {"checkpoint-4-heldout-tf.json"}  # ranked again; the engine never ran it


def test_a_run_dir_moved_to_another_cpu_is_measured_again(run_dir, monkeypatch):
    """Timings belong to a machine: results cached under one hardware record (two CPUs of
    one architecture differ in their model name) are not mixed with another's."""
    from draftsmith.evaluate import native

    small = dict(k_sweep=[3], max_prompts=2, max_new_tokens=6)
    monkeypatch.setattr(native, "hardware", lambda: "cpu: Xeon (amx_bf16), 2 threads")
    run_evaluate(_cfg(run_dir, **small))
    results = run_dir / "eval" / "results"
    stamps = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    before = set(stamps)
    monkeypatch.setattr(native, "hardware", lambda: "cpu: EPYC (avx512_bf16), 2 threads")
    run_evaluate(_cfg(run_dir, **small))
    new = {p.name for p in results.iterdir()} - before
    engine = [n for n in stamps if n.endswith("-k3-t0.json")]  # named without the settings
    assert engine and all((results / n).stat().st_mtime_ns != stamps[n] for n in engine)
    for prefix in ("kernels-", "target-only-heldout-", "costs-"):  # all timed again
        assert any(n.startswith(prefix) for n in new), prefix
    board = _board(run_dir)
    assert board["kernels"]["settings"]["hardware"] == "cpu: EPYC (avx512_bf16), 2 threads"


def test_paired_baseline_keeps_a_slow_stretch_out_of_the_measured_speedup(run_dir):
    """evaluate.paired_baseline: each engine run divides by the target alone decoded beside
    it, so a set baseline decoded while the machine was 10x slower changes no speedup; with
    the switch off, the same slow baseline inflates every speedup."""
    small = dict(k_sweep=[3], max_prompts=3, max_new_tokens=6)
    run_evaluate(_cfg(run_dir, **small))

    def engine_speedups():
        rows = _board(run_dir)["rows"]
        return {r["checkpoint"]: r["speedup"] for r in rows if r["measured_by"] == "engine"}

    before = engine_speedups()
    (path,) = (run_dir / "eval" / "results").glob("target-only-heldout-*.json")
    data = json.loads(path.read_text())
    for r in data["results"]:  # as if decoded in a stretch 10x slower than the engine's
        r["wall_time"] *= 10
        r["target_1tok_time"] *= 10
    path.write_text(json.dumps(data))
    run_evaluate(_cfg(run_dir, **small))
    assert engine_speedups() == before
    run_evaluate(_cfg(run_dir, paired_baseline=False, **small))
    after = engine_speedups()
    assert all(after[name] > 3 * before[name] for name in before)


def test_baseline_drafts_and_max_prompts(run_dir, target_dir):
    cfg = _cfg(run_dir, baselines=[str(target_dir)], max_prompts=3, k_sweep=[3])
    run_evaluate(cfg)
    base = _by(_board(run_dir), "teacher_forced")["target"]
    assert base["step"] is None
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
        match=r"checkpoint-0: greedy speculative output differs .* prompt 'p0' at new token \d+"
        r", target logit gap [0-9.e+-]+, beyond the near-tie tolerance 0.000345\); decoded "
        r"outputs kept in .*checkpoint-0-heldout-k3-t0.json",
    ):
        run_evaluate(_cfg(run_dir))
    # the decoding is kept: a rerun checks the same outputs without decoding them again
    from draftsmith.evaluate import native

    def no_decoding(*a, **kw):
        raise AssertionError("decoded again")

    monkeypatch.setattr(native, "decode_prompts", no_decoding)
    with pytest.raises(DraftsmithError, match="checkpoint-0: greedy speculative output differs"):
        run_evaluate(_cfg(run_dir))


def test_missing_inputs_are_clear_errors(tmp_path):
    with pytest.raises(DraftsmithError, match="run `draftsmith generate CONFIG` first"):
        run_evaluate(_cfg(tmp_path / "none"))
    (tmp_path / "x" / "data").mkdir(parents=True)
    (tmp_path / "x" / "data" / "eval_prompts.jsonl").write_text(
        json.dumps(dict.fromkeys(EVAL_PROMPT_KEYS, "x") | {"prompt_ids": [5, 6], "followups": []})
        + "\n"
    )
    with pytest.raises(DraftsmithError, match="run `draftsmith distill CONFIG` first"):
        run_evaluate(_cfg(tmp_path / "x"))


def test_select_prompts_round_robin_and_deterministic():
    prompts = [{"id": i, "category": c} for i, c in enumerate("aaaabbc")]
    picked = select_prompts(prompts, 4)
    assert [p["id"] for p in picked] == [0, 1, 4, 6]
    assert select_prompts(prompts, 4) == picked
    assert select_prompts(prompts, None) == prompts


def _row(checkpoint: str, **fields) -> LeaderboardRow:
    """A leaderboard row with the given figures (identity fields filled in)."""
    return make_row(checkpoint, **fields)


def test_pick_best():
    rows = [
        _row("a", acceptance_rate=0.2, speedup=1.5),
        _row("b", acceptance_rate=0.4, speedup=None),
        _row("c", acceptance_rate=0.4, speedup=1.1),
    ]
    assert pick_best(rows, "acceptance_rate").checkpoint == "b"
    assert pick_best(rows, "speedup").checkpoint == "a"


def _point(k, modelled, m_iqr, measured, s_iqr):
    return {
        "k": k,
        "modelled_speedup_verify": modelled,
        "modelled_speedup_iqr": m_iqr,
        "speedup": measured,
        "speedup_iqr": s_iqr,
    }


def test_recommended_k_follows_the_modelled_optimum_not_the_wall_clock():
    sweep = [
        _point(1, 1.10, [1.08, 1.12], 1.44, [0.20, 1.60]),  # one lucky wall-clock draw
        _point(2, 1.25, [1.22, 1.27], 0.95, [0.80, 1.10]),
        _point(4, 1.05, [1.00, 1.09], 0.16, [0.10, 1.00]),
    ]
    rec = recommend_k(sweep)
    assert (rec["k"], rec["by"], rec["runner_up"], rec["clear"]) == (
        2,
        "modelled_speedup_verify",
        1,
        True,
    )
    # the wall clock would pick k=1, and its spread says it cannot rank
    assert rec["wall_clock"] == {
        "k": 1,
        "value": 1.44,
        "iqr": [0.20, 1.60],
        "stop_threshold": None,
        "second_choice_min": None,
        "by": "speedup",
        "clear": False,
        "runner_up": 2,
        "runner_up_stop_threshold": None,
    }
    assert rec["dynamic"] is None  # no dynamic-lookahead point was swept
    assert (rec["value"], rec["pays"]) == (1.25, True)  # wall clock k=1: IQR up to 1.60x
    # overlapping model spreads: same k, flagged; an exact tie goes to the smaller k
    sweep[0]["modelled_speedup_iqr"] = [1.05, 1.23]
    assert recommend_k(sweep)["k"] == 2 and recommend_k(sweep)["clear"] is False
    sweep[0]["modelled_speedup_verify"] = 1.25
    assert recommend_k(sweep)["k"] == 1
    # nothing modelled (the vLLM backend): the measured speedup chooses
    vllm = [{"k": 1, "speedup": 1.2}, {"k": 4, "speedup": 1.6}, {"k": 8, "speedup": 1.4}]
    assert recommend_k(vllm)["k"] == 4 and recommend_k(vllm)["by"] == "speedup"


def test_a_sweep_where_no_k_beats_the_target_alone_says_to_serve_without_a_draft():
    """A compute-bound verify (an AVX2 CPU emulating bf16: 5 tokens cost 3.5 decode steps)
    makes every k lose; the recommendation still names the least bad k, and says it loses."""
    c, ks = 0.23, [1, 2, 3, 4]
    v = {1: 1.57, 2: 2.26, 3: 2.91, 4: 3.52}  # verify cost per k, in target decode steps
    sweep = [
        _point(k, _closed_form(0.75, k, c, v[k]), None, 0.6 - 0.05 * k, [0.5, 0.7]) for k in ks
    ]
    rec = recommend_k(sweep)
    assert rec["k"] == 1 and rec["pays"] is False
    assert rec["value"] == pytest.approx(_closed_form(0.75, 1, c, 1.57))  # 0.97x
    line = format_recommendation({"recommended_k": 1, "k_recommendation": rec})
    assert "No point of the sweep is faster than the target alone" in line
    assert f"k=1, is {rec['value']:.2f}x by the modelled speedup" in line
    assert "serve the target without a draft" in line
    assert "Wall clock ranks k=1 first at 0.55x" in line
    # a dynamic point that pays makes the sweep pay, though no fixed k does
    dyn = {**_point(4, 1.02, None, 1.1, [1.0, 1.2]), "stop_threshold": 0.6}
    assert recommend_k([*sweep, dyn])["pays"] is True
    # the same verdict per category: one category pays, the other does not
    for s, k in zip(sweep, ks):
        s["per_category"] = {
            "coding": {"alpha": 0.95, "modelled_speedup_verify": _closed_form(0.95, k, c, v[k])},
            "writing": {"alpha": 0.6, "modelled_speedup_verify": _closed_form(0.6, k, c, v[k])},
        }
    by_cat = recommend_k_by_category(sweep)
    assert (by_cat["coding"]["pays"], by_cat["writing"]["pays"]) == (True, False)
    lines = format_category_ks({"k_by_category": by_cat})
    assert [line.endswith("no k is faster than the target alone)") for line in lines[1:]] == [
        False,
        True,
    ]
    # the model says k=1 pays, the wall clock clearly not (what prefills cost on the AVX2
    # CPU: modelled 1.06x, measured 0.92x [0.90-0.94]): the measurement decides
    sweep[0]["modelled_speedup_verify"] = 1.2
    sweep[0]["speedup_iqr"] = [0.50, 0.60]
    rec = recommend_k(sweep)
    assert (rec["k"], rec["pays"], rec["pays_by"]) == (1, False, "speedup")
    line = format_recommendation({"recommended_k": 1, "k_recommendation": rec})
    assert "the best, k=1, is 0.55x by the wall clock (its interquartile range below 1.0x)" in line
    # ... unless its spread reaches 1.0x: then the model's gain stands
    sweep[0]["speedup_iqr"] = [0.50, 1.01]
    rec = recommend_k(sweep)
    assert (rec["pays"], rec["pays_by"]) == (True, "modelled_speedup_verify")
    line = format_recommendation({"recommended_k": 1, "k_recommendation": rec})
    assert "without a draft" not in line


def _closed_form(a: float, k: int, c: float, v: float) -> float:
    return (1 - a ** (k + 1)) / ((1 - a) * (k * c + v))


def test_each_category_gets_the_k_its_own_acceptance_recommends():
    """Code that the draft re-types (alpha 0.95) pays for long rounds, prose (0.55) does not:
    the per-category k is the closed-form optimum of each one's alpha at the shared costs."""
    c, v, ks = 0.2, 1.05, [1, 2, 3, 4, 5, 6]
    costs = {
        "c": [c] * 3,
        "v": {str(k): [v] * 3 for k in ks},
        "draft_cost_ratio": [c] * 3,
        "verify_cost_ratio": {str(k): [v] * 3 for k in ks},
    }
    alphas = {"code": 0.95, "writing": 0.55}

    def row(k, measured_by, speedups=None):
        per_cat = {
            cat: MetricSummary(num_prompts=2, alpha=a, speedup=(speedups or {}).get(cat))
            for cat, a in alphas.items()
        }
        return _row(
            "d",
            num_speculative_tokens=k,
            alpha=0.75,
            measured_by=measured_by,
            num_prompts=4,
            per_category=per_cat,
        )

    sweep = [
        costed_sweep_entry(
            row(k, "teacher_forced"), row(k, "engine", {"code": 1.0 + k / 10}), costs
        )
        for k in ks
    ]
    for s in sweep:
        for cat, a in alphas.items():
            point = s["per_category"][cat]
            assert point["modelled_speedup_verify"] == pytest.approx(_closed_form(a, s["k"], c, v))
            assert point["alpha"] == a and point["num_prompts"] == 2
        assert s["per_category"]["code"]["speedup"] == pytest.approx(1.0 + s["k"] / 10)
        assert s["per_category"]["writing"]["speedup"] is None  # no engine figure for it
        # what the draft's cost takes: k c of k c + v, and the same alpha with free drafts
        assert s["draft_share"] == pytest.approx(s["k"] * c / (s["k"] * c + v))
        ceiling = (1 - 0.75 ** (s["k"] + 1)) / (1 - 0.75) / v
        assert s["modelled_speedup_free_draft"] == pytest.approx(ceiling)
        assert s["modelled_speedup_verify"] == pytest.approx(ceiling * (1 - s["draft_share"]))
    by_cat = recommend_k_by_category(sweep)
    for cat, a in alphas.items():
        best = max(ks, key=lambda k: _closed_form(a, k, c, v))
        assert by_cat[cat]["k"] == best and by_cat[cat]["by"] == "modelled_speedup_verify"
    assert by_cat["code"]["k"] >= 4 and by_cat["writing"]["k"] <= 2  # they differ
    assert by_cat["code"]["speedup"] == pytest.approx(1.0 + by_cat["code"]["k"] / 10)
    # a dynamic point or a vLLM sweep (no categories) adds no category of its own
    sweep.append({"k": 6, "stop_threshold": 0.5, "modelled_speedup_verify": 9.0})
    assert recommend_k_by_category(sweep) == by_cat
    assert recommend_k_by_category([{"k": 1, "speedup": 1.2}]) == {}


def test_a_dynamic_lookahead_point_ranks_beside_the_fixed_ks_without_replacing_k():
    sweep = [
        _point(1, 1.10, [1.08, 1.12], 1.1, [1.0, 1.2]),
        _point(2, 1.25, [1.22, 1.27], 1.2, [1.1, 1.3]),
        {**_point(6, 1.40, [1.35, 1.45], 1.3, [1.2, 1.4]), "stop_threshold": 0.5},
    ]
    rec = recommend_k(sweep)
    assert rec["k"] == 2  # the best fixed k: what vLLM's speculative_config takes
    assert (rec["dynamic"]["k"], rec["dynamic"]["stop_threshold"]) == (6, 0.5)
    sweep[2]["modelled_speedup_verify"] = 1.2  # below k=2: no dynamic recommendation
    assert recommend_k(sweep)["dynamic"] is None


def test_dynamic_sweep_entry_costs_the_drafts_its_rounds_made():
    row = _row(
        "c",
        num_speculative_tokens=6,
        stop_threshold=0.5,
        num_prompts=2,
        measured_by="engine",
        target_forwards=10,
        tokens_proposed=25,  # 2.5 drafts a round
        mean_accepted_length=2.0,
    )
    costs = {
        "c": [0.5, 0.5, 0.5],
        "v": {"1": [1.0] * 3, "2": [1.1] * 3, "4": [1.2] * 3, "6": [1.3] * 3},
        "draft_cost_ratio": [0.5, 0.5, 0.5],
        "verify_cost_ratio": {"1": [1.0] * 3, "2": [1.1] * 3, "4": [1.2] * 3, "6": [1.3] * 3},
    }
    entry = dynamic_sweep_entry(row, costs)
    assert entry["drafts_per_round"] == 2.5 and entry["verify_cost_ratio"] == 1.2  # width 4+1
    assert entry["modelled_speedup_verify"] == pytest.approx(2.0 / (2.5 * 0.5 + 1.2))
    assert entry["modelled_speedup"] == pytest.approx(2.0 / (2.5 * 0.5 + 1))
    assert entry["draft_share"] == pytest.approx(1.25 / (1.25 + 1.2))
    assert entry["modelled_speedup_free_draft"] == pytest.approx(2.0 / 1.2)


def test_a_second_choice_point_is_costed_with_its_leaves_as_verify_rows():
    row = _row(
        "c",
        num_speculative_tokens=4,
        second_choice_min=0.05,
        second_choices={"proposed": 15, "accepted": 4},
        num_prompts=2,
        measured_by="engine",
        target_forwards=10,
        tokens_proposed=30,  # 3 drafts and 1.5 leaves a round: width 4.5 + 1
        mean_accepted_length=3.0,
    )
    costs = {
        "c": [0.2] * 3,
        "v": {"2": [1.0] * 3, "4": [1.1] * 3, "6": [1.3] * 3},
        "draft_cost_ratio": [0.2] * 3,
        "verify_cost_ratio": {"2": [1.0] * 3, "4": [1.1] * 3, "6": [1.3] * 3},
    }
    entry = dynamic_sweep_entry(row, costs)
    assert entry["verify_cost_ratio"] == 1.3  # the leaves widen the forward past k=4's
    assert entry["modelled_speedup_verify"] == pytest.approx(3.0 / (3 * 0.2 + 1.3))
    assert (entry["second_choices_emitted"], entry["second_choices_verified"]) == (4, 15)
    assert sweep_label(entry) == "k=4 2nd>=0.05"
    # it ranks beside the fixed ks, and never as the k vLLM is given
    fixed = [_point(2, 1.2, [1.1, 1.3], 1.2, [1.1, 1.3]), _point(4, 1.3, [1.2, 1.4], 1.3, None)]
    rec = recommend_k([*fixed, entry])
    assert rec["k"] == 4 and rec["dynamic"]["second_choice_min"] == 0.05
    assert "k=4 2nd>=0.05 ranks above every fixed k" in format_recommendation(
        {"recommended_k": 4, "k_recommendation": rec}
    )
    # what limits it is said of that point, not of the fixed k=4 beside it
    board = {"recommended_k": 4, "k_recommendation": rec, "k_sweep": [*fixed, entry]}
    (line,) = format_limits(board)
    share, ceiling = 0.6 / (0.6 + 1.3), 3.0 / 1.3
    assert line.startswith(f"what limits k=4 2nd>=0.05: its draft steps take {share:.0%} ")
    assert f"(modelled {3.0 / 1.9:.2f}x)" in line and f"would give {ceiling:.2f}x" in line
    # the sweep lacks the point ranked first: nothing said
    assert format_limits({**board, "k_sweep": fixed}) == []


def test_second_choice_leaves_are_decoded_by_the_engine_and_ranked_in_the_sweep(run_dir, capsys):
    run_evaluate(_cfg(run_dir, k_sweep=[1, 3], stop_thresholds=[0.5], second_choice_min=[0.0]))
    board = _board(run_dir)
    (leaves,) = [s for s in board["k_sweep"] if s.get("second_choice_min") is not None]
    assert (leaves["k"], leaves["stop_threshold"], leaves["acceptance_measured_by"]) == (
        3,
        0.5,
        "engine",
    )
    assert leaves["lossless_match_rate"] == 1.0 and leaves["modelled_speedup_verify"] is not None
    assert leaves["second_choices_verified"] > 0  # min gain 0: beside every drafted token
    assert 0 <= leaves["second_choices_emitted"] <= leaves["second_choices_verified"]
    assert "k<=3 stop<0.5 2nd>=0: accept" in capsys.readouterr().out


def test_second_choice_leaves_are_swept_under_sampling_too(run_dir):
    run_evaluate(_cfg(run_dir, k_sweep=[1, 3], second_choice_min=[0.0], temperature=1.0))
    board = _board(run_dir)
    (leaves,) = [s for s in board["k_sweep"] if s.get("second_choice_min") is not None]
    assert (leaves["k"], leaves["acceptance_measured_by"]) == (3, "engine")
    assert leaves["lossless_match_rate"] is None  # sampled: no token-for-token check
    assert leaves["second_choices_verified"] > 0 and leaves["modelled_speedup_verify"] is not None


def test_stop_thresholds_are_decoded_by_the_engine_and_ranked_in_the_sweep(run_dir, capsys):
    run_evaluate(_cfg(run_dir, k_sweep=[1, 3], stop_thresholds=[0.5]))
    board = _board(run_dir)
    (dyn,) = [s for s in board["k_sweep"] if s.get("stop_threshold") is not None]
    assert (dyn["k"], dyn["stop_threshold"], dyn["acceptance_measured_by"]) == (3, 0.5, "engine")
    assert dyn["lossless_match_rate"] == 1.0 and dyn["modelled_speedup_verify"] is not None
    assert [s["k"] for s in board["k_sweep"] if s.get("stop_threshold") is None] == [1, 3]
    assert "k<=3 stop<0.5" in capsys.readouterr().out


# ----------------------------------------------------------------------------- eval sets


def _tag_sets(run_dir: Path, sets: dict[str, str]) -> None:
    """Give every eval prompt of the fixture the eval set its id maps to."""
    path = run_dir / "data" / "eval_prompts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "eval_set": sets[r["id"]]}) + "\n" for r in rows))


def test_every_eval_set_gets_its_rows_and_mtbench_is_primary(run_dir, capsys):
    _tag_sets(
        run_dir,
        {"p0": "heldout", "p1": "mtbench", "p2": "mtbench", "p3": "heldout", "p4": "mtbench"},
    )
    run_evaluate(_cfg(run_dir, k_sweep=[3]))
    board = _board(run_dir)
    assert board["primary_eval_set"] == "mtbench"  # listed second, primary by default
    assert list(board["eval_sets"]) == ["mtbench", "heldout"]
    for name, n, cats in (
        ("mtbench", 3, {"chat", "code", "math"}),
        ("heldout", 2, {"chat", "code"}),
    ):
        tf = _by(board, "teacher_forced", name)
        assert list(tf) == ["checkpoint-0", "checkpoint-4", "checkpoint-8"]
        assert list(_by(board, "engine", name)) == ["checkpoint-0", "checkpoint-8"]
        assert all(r["num_prompts"] == n and set(r["per_category"]) == cats for r in tf.values())
    assert board["k_sweep"][0]["num_prompts"] == 3  # the sweep runs on the primary set
    assert [c["eval_set"] for c in board["comparisons"]] == ["mtbench", "heldout"]
    printed = capsys.readouterr().out
    assert printed.index("== eval set mtbench (primary") < printed.index("== eval set heldout:")
    assert "best: checkpoint-8 by acceptance_rate on mtbench" in printed
    assert (run_dir / "eval" / "acceptance_by_set.png").stat().st_size > 1000

    run_evaluate(_cfg(run_dir, k_sweep=[3], primary_eval_set="heldout"))
    board = _board(run_dir)
    assert board["primary_eval_set"] == "heldout" and board["k_sweep"][0]["num_prompts"] == 2
    with pytest.raises(ConfigError) as e:
        run_evaluate(_cfg(run_dir, primary_eval_set="mt-bench"))
    assert str(e.value) == (
        "evaluate.primary_eval_set: 'mt-bench' is not an eval set of this run "
        "(have: heldout, mtbench)"
    )


def test_engine_prompts_are_capped_per_set_and_select_by_speed_uses_engine_rows(run_dir):
    run_evaluate(_cfg(run_dir, engine_max_prompts=2, select_metric="speedup", k_sweep=[3]))
    board = _board(run_dir)
    engine = _by(board, "engine")
    assert {r["num_prompts"] for r in engine.values()} == {2}
    assert {r["num_prompts"] for r in _by(board, "teacher_forced").values()} == {5}
    assert board["eval_sets"]["heldout"]["engine_prompts"] == 2
    fastest = max(engine.values(), key=lambda r: r["speedup"])
    assert board["best"] == fastest["checkpoint"]  # speedup: only engine rows have one


def test_engine_counts_that_differ_from_the_replay_are_an_error_unless_near_tied(
    run_dir, monkeypatch, capsys
):
    from draftsmith.evaluate import teacher_forced

    real = teacher_forced.agreement_and_margin
    state = {"margin": 1.0}

    def one_flipped(*args):  # a replay that gets the first token of every prompt wrong
        agree, _ = real(*args)
        return [not agree[0], *agree[1:]], state["margin"]

    monkeypatch.setattr(teacher_forced, "agreement_and_margin", one_flipped)
    with pytest.raises(DraftsmithError) as e:
        run_evaluate(_cfg(run_dir, k_sweep=[3]))
    assert str(e.value) == (
        "checkpoint-0 on heldout at k=3: the engine's greedy counts differ from the "
        "teacher-forced replay's on 5 of 5 prompts (first: prompt 'p0') where the draft has "
        "no near-tied logits to explain it: a bug in the engine or the replay"
    )
    shutil.rmtree(run_dir / "eval")
    state["margin"] = 0.0  # a near-tie: float rounding may flip the argmax, not a bug
    run_evaluate(_cfg(run_dir, k_sweep=[3]))
    assert {r["replay_match_rate"] for r in _by(_board(run_dir), "engine").values()} == {0.0}
    assert "with near-tied draft logits (first: 'p0'); float rounding" in capsys.readouterr().out


def _noisy_timer(costs: dict[str, float], seed: int):
    """clock.time_step returning a step's true cost times seeded noise: lognormal jitter and
    one slow outlier in six, as a shared machine gives."""
    import random

    rng = random.Random(seed)

    def time_step(name, run, sync):
        slow = 5.0 if rng.random() < 1 / 6 else 1.0
        # the kernel choice's steps (F.linear_w, W@x^T_w) cost alike: either form will do
        return costs.get(name, 1.0) * slow * rng.lognormvariate(0.0, 0.25)

    return time_step


CHEAP_DRAFT = {"target_1tok": 1.0, "draft_1tok": 0.1, "verify_2tok": 1.05, "verify_4tok": 1.15}
COSTLY_DRAFT = {"target_1tok": 1.0, "draft_1tok": 0.9, "verify_2tok": 1.5, "verify_4tok": 2.5}


@pytest.mark.parametrize("costs, want", [(CHEAP_DRAFT, 3), (COSTLY_DRAFT, 1)])
def test_the_same_run_twice_recommends_the_modelled_k_under_noisy_timings(
    run_dir, monkeypatch, costs, want
):
    """checkpoint-8 accepts everything: the model says (k+1) / (k c + v_k). With a cheap
    draft and verify k=3 wins (2.76x vs 1.74x), with a costly one k=1 (0.83x vs 0.77x); the
    recommendation follows it through noisy clocks, whatever the wall clock measured."""
    from draftsmith import clock

    picked = []
    for seed in (1, 2, 3):
        monkeypatch.setattr(clock, "time_step", _noisy_timer(costs, seed))
        for old in (run_dir / "eval" / "results").glob("costs-*.json"):
            old.unlink()  # time again; everything else comes from the cache
        run_evaluate(_cfg(run_dir))
        board = _board(run_dir)
        c = costs["draft_1tok"]
        true = {
            s["k"]: (s["k"] + 1) / (s["k"] * c + costs[f"verify_{s['k'] + 1}tok"])
            for s in board["k_sweep"]
        }
        assert max(true, key=true.get) == want
        picked.append(board["recommended_k"])
    assert picked == [want] * 3


def test_interleaved_timing_rotates_the_order_and_pairs_each_repeat(monkeypatch):
    from draftsmith import clock
    from draftsmith.evaluate import timing

    order, ticks = [], iter([1.0, 0.2, 1.1, 2.0, 0.4, 2.2, 1.0, 0.2, 1.1])
    steps = {
        name: (lambda n=name: order.append(n), lambda: None)
        for name in ("target_1tok", "draft_1tok", "verify_2tok")
    }
    monkeypatch.setattr(clock, "time_step", lambda name, run, sync: (run(), next(ticks))[1])
    times = clock.interleaved(steps, repeats=3, warmup=0)
    assert order == [
        "target_1tok", "draft_1tok", "verify_2tok",
        "draft_1tok", "verify_2tok", "target_1tok",
        "verify_2tok", "target_1tok", "draft_1tok",
    ]  # fmt: skip
    assert times == {
        "target_1tok": [1.0, 2.2, 0.2],
        "draft_1tok": [0.2, 2.0, 1.1],
        "verify_2tok": [1.1, 0.4, 1.0],
    }
    # a repeat where the whole machine ran 2x slower leaves the paired ratios alone
    costs = timing.cost_ratios(
        {
            "target_1tok": [1.0, 2.0, 1.0],
            "draft_1tok": [0.2, 0.4, 0.2],
            "verify_2tok": [1.1, 2.2, 1.1],
        },
        [1],
    )
    assert costs["draft_cost_ratio"] == pytest.approx([0.2] * 3)
    assert costs["verify_cost_ratio"]["1"] == pytest.approx([1.1] * 3)


def test_turn2_asks_the_followup_after_the_targets_own_cached_answer(run_dir, monkeypatch):
    from draftsmith.data.sources import Prompt, render
    from draftsmith.evaluate import second_turn, stage
    from draftsmith.evaluate.engine import SpeculativeDecoder

    path = run_dir / "data" / "eval_prompts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows[1:3]:  # p1 and p2 are MT-bench-like: a conversation with a second turn
        r |= {"messages": [["user", r["prompt_text"]]], "followups": [f"And {r['id']}?"]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(run_dir, turn2=True, turn2_answer_tokens=6, k_sweep=[3])
    run_evaluate(cfg)
    board = _board(run_dir)
    assert list(board["eval_sets"]) == ["heldout", "heldout-turn2"]
    tf = _by(board, "teacher_forced", "heldout-turn2")
    assert len(tf) == 3 and {r["num_prompts"] for r in tf.values()} == {2}

    (answers_file,) = (run_dir / "eval" / "results").glob("turn1-answers-heldout-*.json")
    answers = json.loads(answers_file.read_text())["answers"]
    target = AutoModelForCausalLM.from_pretrained(run_dir.parent / "target").eval()
    tok = AutoTokenizer.from_pretrained(run_dir.parent / "target")
    for r, answer in zip(rows[1:3], answers):  # the target's own greedy answer to turn 1
        greedy = SpeculativeDecoder(target, eos_ids={tok.eos_token_id}).generate(r["prompt_ids"], 6)
        assert answer == tok.decode(greedy.tokens, skip_special_tokens=True).strip()

    def no_decoding(*args):
        raise AssertionError("answered again: the cache missed")

    monkeypatch.setattr(second_turn, "target_answers", no_decoding)
    sets = stage.eval_sets(stage.load_prompts(run_dir), None)
    models = stage.Models(cfg)
    got = stage.with_turn2(cfg, sets, "heldout", models, run_dir / "eval" / "results")
    for r, answer, p in zip(rows[1:3], answers, got["heldout-turn2"]):
        convo = (("user", r["prompt_text"]), ("assistant", answer), ("user", f"And {r['id']}?"))
        text = render(Prompt(convo, r["category"], "test"), tok, True, None)
        assert p["id"] == f"{r['id']}-turn2" and p["prompt_text"] == text
        assert p["prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- the target drafting for itself


def test_the_target_drafting_for_itself_accepts_everything_and_never_ranks(run_dir, capsys):
    from draftsmith.export import choose_row

    shutil.rmtree(run_dir / "checkpoints" / "checkpoint-8")  # the perfect draft: no rival
    run_evaluate(_cfg(run_dir, baselines=["target"]))
    board = _board(run_dir)
    for by in ("teacher_forced", "engine"):  # replayed and really decoded
        row = _by(board, by)["target-as-draft"]
        assert row["role"] == "sanity" and row["alpha"] == 1.0
        assert row["tokens_accepted"] == row["tokens_proposed"] > 0
    assert board["best"] == "checkpoint-4"  # it would win every ranking
    out = capsys.readouterr().out
    assert "sanity: the target drafting for itself on heldout (engine): alpha 1.0000" in out
    assert out.count("): pass") == 2 and "FAIL" not in out
    rows = rows_from_dicts(board["rows"], "leaderboard.json")
    with pytest.raises(DraftsmithError, match="is the target drafting for itself"):
        choose_row({**board, "rows": rows}, "target-as-draft")


def test_a_self_draft_that_rejects_tokens_fails_the_run(run_dir, monkeypatch, capsys):
    """A loading mistake stood in for: the 'target' the check loads is a 1-layer draft."""
    from draftsmith.evaluate import stage
    from draftsmith.models import load_model

    real = stage.Models.draft

    def wrong_weights(self, draft):
        if draft.role == "sanity":
            ck0 = str(run_dir / "checkpoints" / "checkpoint-0")
            return load_model(ck0, device=torch.device("cpu"), dtype=torch.float32)
        return real(self, draft)

    monkeypatch.setattr(stage.Models, "draft", wrong_weights)
    with pytest.raises(DraftsmithError, match=r"drafting for itself rejected tokens on heldout"):
        run_evaluate(_cfg(run_dir, baselines=["target"]))
    assert "(teacher_forced): alpha" in capsys.readouterr().out
    assert (run_dir / "eval" / "leaderboard.json").is_file()  # the board is kept to inspect
    run_evaluate(_cfg(run_dir, baselines=["target"], on_mismatch="warn"))  # warn: goes on


def test_only_the_self_draft_is_one_error(tmp_path, run_dir):
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(DraftsmithError, match="only the target drafting for itself"):
        run_evaluate(_cfg(run_dir, baselines=["target"]))


# ----------------------------------------------------------------------------- bf16 near-ties


def _bf16(run_dir: Path, **evaluate):
    cfg = _cfg(run_dir, max_new_tokens=32, engine_max_prompts=None, **evaluate)
    cfg.target.dtype = "bfloat16"
    return cfg


def test_bf16_near_ties_are_recorded_not_errors(run_dir, capsys):
    """In bf16 the perfect draft (the target's own weights) leaves the target's greedy output
    on one of the 5 prompts on CPUs with native bf16 matmuls: a 1-token decode and a 4-token
    verify pass round a near-tie differently. The check asks the target: recorded as a tie,
    the run goes on. Where bf16 is emulated through fp32 (an AVX2-only CPU) both passes round
    alike and no prompt diverges; every divergence must still be a recorded tie."""
    from draftsmith.models import cpu_has_native_bf16

    run_evaluate(_bf16(run_dir))  # on_mismatch: error
    row = _by(_board(run_dir), "engine")["checkpoint-8"]
    assert row["lossless_match_rate"] == 1 - row["lossless_ties"] / 5  # each miss is a tie
    assert row["lossless_ties"] == (1 if cpu_has_native_bf16() else 0)
    assert _by(_board(run_dir), "engine")["checkpoint-0"]["lossless_ties"] == 0
    assert "WARNING" not in capsys.readouterr().out


def test_bf16_broken_verifier_still_fails(run_dir, monkeypatch):
    from draftsmith.evaluate import engine

    real = engine.greedy_accept

    def off_by_one(logits, drafted):  # emits token+1 on rejection: far from any tie
        n, tok = real(logits, drafted)
        return n, (tok + 1) % logits.shape[-1]

    monkeypatch.setattr(engine, "greedy_accept", off_by_one)
    with pytest.raises(DraftsmithError, match=r"beyond the near-tie tolerance 0\.0884"):
        run_evaluate(_bf16(run_dir))


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_draft_weights_decode_every_draft_rounded_and_stay_lossless(run_dir, capsys, weights):
    run_evaluate(_cfg(run_dir, draft_weights=weights))
    board, out = _board(run_dir), capsys.readouterr().out
    assert board["draft_weights"] == weights
    assert set(board["quant_widths"]) == {"checkpoint-0", "checkpoint-4", "checkpoint-8"}
    assert all(q["weights"] == weights and q["layers"] for q in board["quant_widths"].values())
    engine = _by(board, "engine")
    assert engine and all(r["lossless_match_rate"] == 1.0 for r in engine.values())
    for name in ("checkpoint-0", "checkpoint-4", "checkpoint-8"):
        said = f"linear layers decode with {weights} weights at"
        assert f"[evaluate] {name}: " in out and said in out
    cached = [json.loads(p.read_text()) for p in (run_dir / "eval" / "results").glob("*.json")]
    drafts = [c["settings"] for c in cached if "draft" in c["settings"]]
    assert drafts and all(s["draft_weights"] == weights for s in drafts)


def test_the_replay_hook_rounds_the_draft_as_the_int4_stage_does(run_dir):
    """kinds.teacher_forced_results(prepare=quantize_draft), what estimate_acceptance.py
    --draft-weights replays, counts what the stage's teacher-forced rows count with
    evaluate.draft_weights on: same prompts, same rounded weights."""
    from draftsmith.evaluate.native import Models, NativeEvaluator
    from draftsmith.evaluate.prompts import eval_sets, load_prompts
    from draftsmith.evaluate.records import DraftEntry
    from draftsmith.kinds import teacher_forced_results
    from draftsmith.quant_draft import quantize_draft

    run_evaluate(_cfg(run_dir, draft_weights="int4"))
    rounded_board = _by(_board(run_dir), "teacher_forced")
    run_evaluate(_cfg(run_dir))
    loaded_board = _by(_board(run_dir), "teacher_forced")
    cfg = _cfg(run_dir)
    models = Models(cfg)
    prompts = eval_sets(load_prompts(run_dir), cfg.evaluate.max_prompts)["heldout"]
    base = NativeEvaluator(cfg, run_dir / "eval" / "results", models).baseline("heldout", prompts)
    refs = [{**p, "tokens": b["tokens"]} for p, b in zip(prompts, base)]
    vocab = models.target().config.vocab_size
    changed = 0
    for name in ("checkpoint-0", "checkpoint-4", "checkpoint-8"):
        entry = DraftEntry(name=name, ref=str(run_dir / "checkpoints" / name), kind="independent")
        rows = teacher_forced_results(
            entry, models, refs, 3, 12, vocab, lambda m: quantize_draft(m, "int4", models.target())
        )
        accepted = sum(r["accepted"] for r in rows)
        assert accepted == rounded_board[name]["tokens_accepted"], name
        changed += accepted != loaded_board[name]["tokens_accepted"]
    assert changed  # the rounding moves some draft's proposals: the hook is not a no-op


def test_a_reloaded_rounded_draft_keeps_its_first_timed_widths(run_dir, capsys, monkeypatch):
    """The stage keeps one draft loaded; a draft loaded again is rounded again but keeps the
    input widths timed at its first load (a second timing could choose differently), and
    the choice is printed once."""
    from draftsmith import quant_draft as mod
    from draftsmith.evaluate.native import Models, NativeEvaluator
    from draftsmith.evaluate.records import DraftEntry

    choices = iter([({1, 2}, {}), ({3}, {}), ({5, 6}, {})])  # a different choice per timing
    monkeypatch.setattr(mod, "choose_kernel_widths", lambda layers: next(choices))
    cfg = _cfg(run_dir, draft_weights="int4")
    ev = NativeEvaluator(cfg, run_dir / "eval" / "results", Models(cfg))
    a, b = (
        DraftEntry(name=n, ref=str(run_dir / "checkpoints" / n), kind="independent")
        for n in ("checkpoint-0", "checkpoint-4")
    )
    first = ev.draft_model(a)
    ev.draft_model(b)
    again = ev.draft_model(a)  # evicted by b: loaded and rounded again
    assert again is not first
    widths = {
        frozenset(m.kernel_widths) for m in again.modules() if isinstance(m, mod.QuantWeightLinear)
    }
    assert widths == {frozenset({1, 2})}
    assert ev.quant["checkpoint-0"]["kernel_widths"] == [1, 2]
    assert ev.quant["checkpoint-4"]["kernel_widths"] == [3]
    out = capsys.readouterr().out
    assert (
        out.count("[evaluate] checkpoint-0: ") == 1 and out.count("[evaluate] checkpoint-4: ") == 1
    )


def test_target_only_baseline_decodes_with_the_timed_kernel_choice(run_dir, monkeypatch):
    """The baseline every speedup divides by gets the same per-width kernel choice as the
    speculative decoder, width 1 (its decode step) included: a baseline left on a kernel
    the timing found slower would inflate every measured speedup."""
    from draftsmith.evaluate import native

    widths = []

    def fake_choose(model, context, ws, repeats):
        widths.extend(ws)
        return {"forms": {"1": "packed", "2": "W@x^T"}, "ms": {}, "repeats": repeats}

    made = []
    real = native.SpeculativeDecoder

    def spy(target, proposer, **kw):
        made.append((proposer is None, kw["linear_forms"]))
        return real(target, proposer, **kw)

    monkeypatch.setattr(native, "choose_linear_forms", fake_choose)
    monkeypatch.setattr(native, "SpeculativeDecoder", spy)
    run_evaluate(_cfg(run_dir))
    assert 1 in widths  # the decode step's width is timed too
    baselines = [forms for target_only, forms in made if target_only]
    assert baselines and all(forms == {"1": "packed", "2": "W@x^T"} for forms in baselines)
