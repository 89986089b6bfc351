"""The distill stage end to end on a tiny model (CPU): checkpoints, resume, teachers, wandb."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_distill_helpers import (
    build_tiny_target,
    checkpoint_meta,
    make_cfg,
    read_wandb_history,
    run_dir_with_data,
)

from draftsmith.config import config_to_dict
from draftsmith.distill import list_checkpoints
from draftsmith.distill.stage import run_distill
from draftsmith.distill.train import train_draft
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.kinds.independent.train import IndependentTraining, trainable_parameters

sys.path.insert(0, str(Path(__file__).parent))


def test_checkpoints_contract_and_finished_stage(tmp_path, target_dir, data_dir, capsys):
    from transformers import AutoModelForCausalLM

    out = run_dir_with_data(tmp_path, data_dir)
    # the whole data set in every batch, so the loss must go down step by step
    cfg = make_cfg(out, target_dir, max_steps=4, save_every=2, batch_size=16, lr=3e-3)
    run_distill(cfg)
    ckpts = list_checkpoints(out / "checkpoints")
    assert [s for s, _ in ckpts] == [0, 2, 4]
    final = ckpts[-1][1]
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "train_state.pt",
        "draftsmith_checkpoint.json",
    ):
        assert (final / name).is_file(), name
    meta = checkpoint_meta(final)
    assert (
        meta["step"] == 4 and meta["loss_name"] == "forward_kl" and len(meta["loss_history"]) == 4
    )
    assert meta["init"] == "from_target layers [0, 1]"
    state = torch.load(final / "train_state.pt", weights_only=True)
    assert state["step"] == 4 and "optimizer" in state and "scheduler" in state
    draft = AutoModelForCausalLM.from_pretrained(final)
    assert draft.config.num_hidden_layers == 2
    # checkpoint-0 is the untrained init: the target's first two layers, unchanged
    target = load_file(target_dir / "model.safetensors")
    init = load_file(ckpts[0][1] / "model.safetensors")
    torch.testing.assert_close(
        init["model.layers.1.mlp.up_proj.weight"], target["model.layers.1.mlp.up_proj.weight"]
    )
    trained = load_file(final / "model.safetensors")
    assert not torch.equal(
        trained["model.layers.1.mlp.up_proj.weight"], init["model.layers.1.mlp.up_proj.weight"]
    )
    # training reduced the loss, and a rerun is a no-op that says so
    assert meta["loss_history"][-1] < meta["loss_history"][0]
    capsys.readouterr()
    before = (final / "model.safetensors").stat().st_mtime_ns
    run_distill(cfg)
    assert "already finished" in capsys.readouterr().out
    assert (final / "model.safetensors").stat().st_mtime_ns == before


def test_offline_teacher_trains_without_the_target(tmp_path, target_dir, data_dir, monkeypatch):
    from draftsmith.distill import train as train_mod

    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, teacher="offline", max_steps=3, save_every=3)
    seen = []
    real = train_mod.setup

    def spy(*a, **kw):
        tr = real(*a, **kw)
        seen.append(tr.teacher)
        return tr

    monkeypatch.setattr(train_mod, "setup", spy)
    run_distill(cfg)
    assert seen == [None]  # no target in memory
    hist = checkpoint_meta(out / "checkpoints" / "checkpoint-3")["loss_history"]
    assert len(hist) == 3 and all(h > 0 for h in hist)


def test_freeze_embeddings_trains_the_layers_only(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, teacher="offline", max_steps=2, save_every=2, lr=3e-3)
    cfg.distill.freeze_embeddings = True
    run_distill(cfg)
    before = load_file(out / "checkpoints" / "checkpoint-0" / "model.safetensors")
    after = load_file(out / "checkpoints" / "checkpoint-2" / "model.safetensors")
    frozen = {"model.embed_tokens.weight", "lm_head.weight"} & set(before)
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)  # the target's
    moved = [k for k in before if k not in frozen and not torch.equal(before[k], after[k])]
    assert any(".mlp." in k for k in moved) and any(".self_attn." in k for k in moved)


def test_train_layers_trains_only_the_last_layers_norm_and_head(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, teacher="offline", max_steps=2, save_every=2, lr=3e-3)
    cfg.draft.num_layers = 3
    cfg.distill.train_layers = 1
    run_distill(cfg)
    before = load_file(out / "checkpoints" / "checkpoint-0" / "model.safetensors")
    after = load_file(out / "checkpoints" / "checkpoint-2" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(
        k.startswith(("model.layers.2.", "model.norm.", "lm_head.")) for k in moved
    )
    assert any(k.startswith("model.layers.2.mlp.") for k in moved)
    assert "model.embed_tokens.weight" not in moved
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "checkpoint-0")
    with pytest.raises(ConfigError, match="distill.train_layers: 4 is more than the draft's 3"):
        trainable_parameters(draft, False, 4)


def test_save_steps_add_checkpoints_beside_save_every(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    run_distill(make_cfg(out, target_dir, max_steps=5, save_every=4, save_steps=[1, 2]))
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [0, 1, 2, 4, 5]


def test_keep_last_and_resume_never(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, max_steps=4, save_every=1, keep_last=2)
    run_distill(cfg)
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [0, 3, 4]
    cfg = make_cfg(out, target_dir, max_steps=6, save_every=1, resume="never")
    with pytest.raises(DraftsmithError, match="distill.resume"):
        run_distill(cfg)


def test_nan_loss_stops_with_clear_error(tmp_path, target_dir, data_dir, monkeypatch):
    from draftsmith.distill.losses import TokenSum
    from draftsmith.kinds.independent import train as independent_train

    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, max_steps=6, save_every=2)
    real, calls = independent_train.distill_loss, []

    def poisoned(*a, **kw):
        calls.append(1)
        res = real(*a, **kw)
        return TokenSum(res.total * float("nan"), res.count) if len(calls) == 3 else res

    monkeypatch.setattr(independent_train, "distill_loss", poisoned)
    with pytest.raises(DraftsmithError, match="loss became nan at step 3.*checkpoint-2"):
        run_distill(cfg)
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [0, 2]


def test_ablation_twin_and_wandb_offline_history(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, max_steps=3, save_every=3, log_every=1)
    cfg.tracking.wandb.mode = "offline"
    final = train_draft(cfg, out / "ce_twin", IndependentTraining(), loss_override="ce")
    meta = checkpoint_meta(final)
    assert meta["loss_name"] == "ce"
    # wandb's service writes the offline log asynchronously: on a loaded machine the last
    # records can land a moment after run.finish() returns, so read until they are there
    deadline, rows = time.time() + 60, []
    while len(rows) < 3 and time.time() < deadline:
        rows = [r for r in read_wandb_history(out / "wandb") if "train/loss" in r]
        time.sleep(0.5 if len(rows) < 3 else 0)
    assert [r["_step"] for r in rows] == [1, 2, 3]
    logged = [r["train/loss"] for r in rows]
    assert logged == pytest.approx(meta["loss_history"], rel=1e-6)
    assert all("train/tokens_per_s" in r and "train/lr" in r for r in rows)
    # never an API key anywhere in what the run wrote
    for f in out.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".yaml", ".log", ".txt"):
            assert "WANDB_API_KEY" not in f.read_text(errors="ignore")


def _start_cli(out: Path, cfg, env_extra: dict | None = None, launcher: list[str] | None = None):
    """`draftsmith distill` on `cfg` in a subprocess of one thread, started, not awaited (a
    reference run goes on beside the killed ones: two cores, two processes)."""
    cfg_path = out / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", **(env_extra or {})}
    cmd = (launcher or [sys.executable]) + ["-m", "draftsmith.cli", "distill", str(cfg_path)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _cli(out: Path, cfg, env_extra: dict | None = None, launcher: list[str] | None = None):
    return _finished(_start_cli(out, cfg, env_extra, launcher))


def test_sigkill_during_save_and_training_resumes_to_same_result(tmp_path, target_dir, data_dir):
    ref_out = run_dir_with_data(tmp_path / "ref", data_dir)
    ref_run = _start_cli(ref_out, make_cfg(ref_out, target_dir, max_steps=6, save_every=2))

    out = run_dir_with_data(tmp_path / "killed", data_dir)
    cfg = make_cfg(out, target_dir, max_steps=6, save_every=2)
    ck = out / "checkpoints"
    first = _cli(out, cfg, {"DRAFTSMITH_TEST_KILL": "save:4"})  # dies while writing checkpoint-4
    assert first.returncode == -9
    assert [s for s, _ in list_checkpoints(ck)] == [0, 2]
    assert any(".tmp-" in p.name for p in ck.iterdir())  # the half-written one
    second = _cli(out, cfg, {"DRAFTSMITH_TEST_KILL": "step:5"})  # dies between checkpoints
    assert second.returncode == -9
    assert [s for s, _ in list_checkpoints(ck)] == [0, 2, 4]
    third = _cli(out, cfg)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "resuming from" in third.stdout
    assert not any(".tmp-" in p.name for p in ck.iterdir())
    ref = _finished(ref_run)
    assert ref.returncode == 0, ref.stderr[-2000:]

    a = load_file(ref_out / "checkpoints/checkpoint-6/model.safetensors")
    b = load_file(ck / "checkpoint-6/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert (
        checkpoint_meta(ck / "checkpoint-6")["loss_history"]
        == checkpoint_meta(ref_out / "checkpoints/checkpoint-6")["loss_history"]
    )


def test_sigkill_mid_on_policy_training_resumes_to_same_result(tmp_path, target_dir, data_dir):
    """The on_policy data kind lives inside distill: the draft's samples of a resumed run are
    the ones the uninterrupted run drew (seeded by run seed and step), so the weights match."""
    kw = dict(max_steps=4, save_every=2, on_policy_fraction=1.0)
    ref_out = run_dir_with_data(tmp_path / "ref", data_dir)
    ref_run = _start_cli(ref_out, make_cfg(ref_out, target_dir, **kw))
    out = run_dir_with_data(tmp_path / "killed", data_dir)
    cfg = make_cfg(out, target_dir, **kw)
    killed = _cli(out, cfg, {"DRAFTSMITH_TEST_KILL": "step:3"})  # after checkpoint-2
    assert killed.returncode == -9
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [0, 2]
    resumed = _cli(out, cfg)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout
    ref = _finished(ref_run)
    assert ref.returncode == 0, ref.stderr[-2000:]
    a = load_file(ref_out / "checkpoints/checkpoint-4/model.safetensors")
    b = load_file(out / "checkpoints/checkpoint-4/model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def fp32(cfg):
    cfg.distill.mixed_precision, cfg.target.batch_dtype = "no", "float32"
    return cfg


def test_two_process_ddp_matches_one_process(tmp_path, target_dir, data_dir):
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    one_out = run_dir_with_data(tmp_path / "one", data_dir)
    # one process, grad accumulation 2 == two processes, no accumulation: same global batch
    # fp32 throughout: the test is about the accumulation math, and bf16 autocast (the auto
    # choice on CPUs with native bf16) rounds differently with different micro-batch shapes
    one = _cli(
        one_out,
        fp32(make_cfg(one_out, target_dir, max_steps=3, save_every=3, grad_accum_steps=2)),
        launcher=launch + ["--num_processes", "1"],
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two_out = run_dir_with_data(tmp_path / "two", data_dir)
    two = _cli(
        two_out,
        fp32(make_cfg(two_out, target_dir, max_steps=3, save_every=3)),
        launcher=launch + ["--num_processes", "2"],
    )
    assert two.returncode == 0, two.stderr[-3000:]
    h1 = checkpoint_meta(one_out / "checkpoints/checkpoint-3")["loss_history"]
    h2 = checkpoint_meta(two_out / "checkpoints/checkpoint-3")["loss_history"]
    assert h1 == pytest.approx(h2, rel=1e-5, abs=1e-7)
    assert h2[-1] != h2[0]  # it trained
    a = load_file(one_out / "checkpoints/checkpoint-3/model.safetensors")
    b = load_file(two_out / "checkpoints/checkpoint-3/model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)


def test_on_policy_steps_are_deterministic_and_sampled_by_the_draft(tmp_path, target_dir, data_dir):
    from draftsmith.distill.teacher import is_on_policy_step

    picks = [is_on_policy_step(0, s, 0.3) for s in range(2000)]
    assert picks == [is_on_policy_step(0, s, 0.3) for s in range(2000)]
    assert 0.25 < sum(picks) / 2000 < 0.35
    assert not any(is_on_policy_step(0, s, 0.0) for s in range(100))
    hist = []
    for name in ("a", "b"):
        out = run_dir_with_data(tmp_path / name, data_dir)
        cfg = make_cfg(out, target_dir, max_steps=2, save_every=2, on_policy_fraction=1.0)
        run_distill(cfg)
        hist.append(checkpoint_meta(out / "checkpoints/checkpoint-2")["loss_history"])
    assert hist[0] == hist[1]
    off = run_dir_with_data(tmp_path / "off", data_dir)
    run_distill(make_cfg(off, target_dir, max_steps=2, save_every=2))
    assert (
        checkpoint_meta(off / "checkpoints/checkpoint-2")["loss_history"] != hist[0]
    )  # other sequences


def test_pretrained_init_checks_the_vocabulary(tmp_path, target_dir, data_dir):
    from transformers import AutoTokenizer

    other = build_tiny_target(tmp_path / "other", seed=1)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra_token>"])  # a different vocabulary
    tok.save_pretrained(other)
    out = run_dir_with_data(tmp_path / "run", data_dir)
    cfg = make_cfg(out, target_dir, max_steps=1, save_every=1)
    cfg.draft.init, cfg.draft.model = "pretrained", str(other)
    with pytest.raises(
        DraftsmithError,
        match="tokenizer mismatch .* token '<extra_token>' has no id in the target and id 259 in",
    ):
        run_distill(cfg)
    good = build_tiny_target(tmp_path / "good", seed=2)
    cfg.draft.model = str(good)
    run_distill(cfg)
    assert checkpoint_meta(out / "checkpoints/checkpoint-1")["init"].startswith("pretrained")


def test_ce_baseline_twin_goes_to_ablations(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, max_steps=2, save_every=2, ce_baseline=True)
    run_distill(cfg)
    main, twin = (
        checkpoint_meta(out / "checkpoints/checkpoint-2"),
        checkpoint_meta(out / "ablations/ce/checkpoint-2"),
    )
    assert (main["loss_name"], twin["loss_name"]) == ("forward_kl", "ce")
    # same init: checkpoint-0 of both is the same model
    a = load_file(out / "checkpoints/checkpoint-0/model.safetensors")
    b = load_file(out / "ablations/ce/checkpoint-0/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_constant_schedule_and_cost_bookkeeping(tmp_path, target_dir, data_dir):
    """lr_schedule=constant keeps the lr flat after warmup (so a run's checkpoints are comparable
    points of a scaling curve); checkpoints count the tokens and CPU seconds spent so far."""
    from draftsmith.data import load_train_dataset

    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, max_steps=4, save_every=2, batch_size=16, lr=2e-3)
    cfg.distill.lr_schedule, cfg.distill.warmup_steps = "constant", 1
    run_distill(cfg)
    two, four = (
        checkpoint_meta(out / "checkpoints/checkpoint-2"),
        checkpoint_meta(out / "checkpoints/checkpoint-4"),
    )
    assert two["lr"] == four["lr"] == 2e-3
    per_step = sum(map(len, load_train_dataset(out)["completion_ids"]))  # batch = whole set
    assert (two["tokens_seen"], four["tokens_seen"]) == (2 * per_step, 4 * per_step)
    assert 0 < two["cpu_time_s"] < four["cpu_time_s"]


def _kl_topk_closed_form(model, examples) -> float:
    """Forward KL on the stored top-k plus a rest bucket, token mean, one sequence at a time
    (no padding, no batching): KL(p || q) = sum_b p_b log(p_b / q_b)."""
    total, count = 0.0, 0
    for ex in examples:
        seq = torch.tensor([ex.prompt_ids + ex.completion_ids[:-1]])
        with torch.no_grad():
            logits = model(seq).logits[0, len(ex.prompt_ids) - 1 :].double()  # (C, V)
        q = torch.log_softmax(logits, -1)
        for c, (ids, lps) in enumerate(zip(ex.topk_ids, ex.topk_logprobs)):
            p_top = torch.tensor(lps, dtype=torch.float64).exp()
            q_top = q[c, ids].exp()
            assert 1 - p_top.sum() > 1e-4  # the rest bucket is real mass, no floor involved
            p = torch.cat([p_top, 1 - p_top.sum(0, keepdim=True)])
            qq = torch.cat([q_top, 1 - q_top.sum(0, keepdim=True)])
            total += float((p * (p / qq).log()).sum())
            count += 1
    return total / count


def test_heldout_prompts_are_never_trained_on_and_their_loss_is_exact(
    tmp_path, target_dir, data_dir, monkeypatch
):
    """distill.heldout_prompts: the drawn prompts' sequences never reach a training batch,
    their loss is recorded before training, at every log step and in every checkpoint, and
    it is the exact token mean of the loss over them (checked against a closed form on the
    saved checkpoint), not a training batch's."""
    from transformers import AutoModelForCausalLM

    from draftsmith.distill import train as train_mod

    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, teacher="offline", max_steps=4, save_every=2, lr=3e-3)
    cfg.distill.heldout_prompts = 5  # two held-out micro-batches of 4: the mean spans both
    trained, seen = [], []
    real = train_mod.setup

    def spy(*a, **kw):
        tr = real(*a, **kw)
        examples = tr.data.examples

        def record(idx):
            got = examples(idx)
            trained.extend(tuple(e.prompt_ids) for e in got)
            return got

        tr.data.examples = record
        seen.append(tr)
        return tr

    monkeypatch.setattr(train_mod, "setup", spy)
    run_distill(cfg)
    tr = seen[0]
    held = tr.heldout.examples(list(range(len(tr.heldout))))
    held_prompts = {tuple(e.prompt_ids) for e in held}
    assert len(held_prompts) == 5 and len(tr.heldout) + len(tr.data) == 16
    assert trained and not held_prompts & set(trained)
    assert sorted(tr.heldout_losses) == [0, 1, 2, 3, 4]  # start + every log step (log_every 1)
    ckpts = dict(list_checkpoints(out / "checkpoints"))
    for step in (0, 2, 4):
        meta = checkpoint_meta(ckpts[step])
        assert meta["heldout_loss"] == tr.heldout_losses[step]
        model = AutoModelForCausalLM.from_pretrained(ckpts[step], dtype=torch.float64).eval()
        assert meta["heldout_loss"] == pytest.approx(_kl_topk_closed_form(model, held), rel=1e-4)
    assert tr.heldout_losses[4] != tr.heldout_losses[0]  # training moved it
    state = torch.load(ckpts[4] / "train_state.pt", weights_only=True)
    assert state["heldout_losses"] == tr.heldout_losses  # a resume keeps the curve


def test_heldout_prompts_must_leave_training_data(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = make_cfg(out, target_dir, teacher="offline", max_steps=2)
    cfg.distill.heldout_prompts = 16
    with pytest.raises(ConfigError, match=r"^distill.heldout_prompts: 16 would leave no training"):
        run_distill(cfg)
    assert not (out / "checkpoints").exists()
