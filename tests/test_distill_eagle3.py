"""The eagle3 kind through the distill stage: its loss alignment, checkpoints, resume, CE twin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distill_helpers import (
    checkpoint_meta,
    make_cfg,
    run_dir_with_data,
)

from draftsmith.distill import list_checkpoints
from draftsmith.distill.batching import Example, collate
from draftsmith.distill.losses import forward_kl
from draftsmith.distill.stage import run_distill
from draftsmith.errors import DraftsmithError
from draftsmith.kinds.eagle3.config import eagle3_settings
from draftsmith.kinds.eagle3.export import load_eagle3, validate_eagle3_export
from draftsmith.kinds.eagle3.train import (
    step_rows,
    ttt_loss_parts,
    ttt_token_counts,
)
from draftsmith.kinds.eagle3.vocab import build_draft_vocab

sys.path.insert(0, str(Path(__file__).parent))


# ----------------------------------------------------------------------------- alignment


def _batch():
    # row 0: prompt [5, 6], completion [7, 8, 9] -> inputs [5, 6, 7, 8], loss at 1, 2, 3
    # row 1: prompt [5], completion [10, 11]    -> inputs [5, 10] (+ pad), loss at 0, 1
    return collate([Example([5, 6], [7, 8, 9]), Example([5], [10, 11])], pad_id=0)


def test_step_rows_align_each_ttt_step_with_its_teacher():
    batch = _batch()
    assert batch.labels.tolist() == [7, 8, 9, 10, 11]  # teacher rows 0..4 in this order
    # head position t (pair g_t, x_{t+1}) predicts x_{t+2+j} at step j: target position
    # t+1+j's teacher row; row 1's first completion token (predicted by its position 0)
    # has no head position (no pair before it)
    assert step_rows(batch.loss_mask, 0).tolist() == [[0, 1, 2], [4, -1, -1]]
    assert step_rows(batch.loss_mask, 1).tolist() == [[1, 2, -1], [-1, -1, -1]]
    assert step_rows(batch.loss_mask, 2).tolist() == [[2, -1, -1], [-1, -1, -1]]


def test_ttt_loss_parts_closed_forms():
    batch = _batch()
    vocab = build_draft_vocab(torch.tensor([0] * 7 + [5, 5, 5, 0, 5]), 4, 12)  # 7, 8, 9, 11
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(5, 4, generator=g)  # (N, Vd)
    # step j's logits at each head position = the teacher row it must match, +1 elsewhere
    logits = []
    for j in range(3):
        rows = step_rows(batch.loss_mask, j)
        step = torch.randn(2, 3, 4, generator=g)
        step[rows >= 0] = teacher[rows[rows >= 0]]
        logits.append(step)
    parts = ttt_loss_parts("forward_kl", logits, teacher, batch, vocab.t2d)
    assert [float(p.count) for p in parts] == [4, 2, 1]
    assert all(abs(float(p.total)) < 1e-6 for p in parts)  # KL(p || p) = 0 at every step
    assert ttt_token_counts("forward_kl", batch, 3, vocab.t2d) == [4, 2, 1]

    # a wrong student: the sum equals forward_kl on exactly the gathered rows
    wrong = [torch.randn(2, 3, 4, generator=g) for _ in range(3)]
    parts = ttt_loss_parts("forward_kl", wrong, teacher, batch, vocab.t2d, temperature=2.0)
    for j, p in enumerate(parts):
        rows = step_rows(batch.loss_mask, j)
        rows = rows[rows >= 0]
        mask = torch.ones(rows.numel(), dtype=torch.bool)
        want = forward_kl(wrong[j][step_rows(batch.loss_mask, j) >= 0], teacher[rows], mask, 2.0)
        assert torch.allclose(p.total, want.total)

    # CE: hard labels as draft ids; 10 (row 1's first label) has none: left out, counted
    ce = ttt_loss_parts("ce", logits, teacher, batch, vocab.t2d)
    assert ttt_token_counts("ce", batch, 3, vocab.t2d) == [float(p.count) for p in ce]
    assert [float(p.count) for p in ce] == [4, 2, 1]  # row 1's 11 is in the vocab, 10 never reached
    lab = {7: 0, 8: 1, 9: 2, 11: 3}
    nll = -torch.log_softmax(logits[0][0, 0], -1)[lab[7]]  # step 0, position 0 -> label 7
    nll = nll - torch.log_softmax(logits[0][0, 1], -1)[lab[8]]
    nll = nll - torch.log_softmax(logits[0][0, 2], -1)[lab[9]]
    nll = nll - torch.log_softmax(logits[0][1, 0], -1)[lab[11]]
    assert torch.allclose(ce[0].total, nll)


def test_ce_leaves_out_tokens_outside_the_draft_vocabulary():
    batch = _batch()
    vocab = build_draft_vocab(torch.tensor([0] * 7 + [5, 5, 0, 0, 5]), 3, 12)  # 7, 8, 11
    assert ttt_token_counts("ce", batch, 3, vocab.t2d) == [3, 1, 0]  # 9 has no draft id
    assert ttt_token_counts("forward_kl", batch, 3, vocab.t2d) == [4, 2, 1]


# ----------------------------------------------------------------------------- the stage


def eagle3_cfg(out: Path, target_dir: Path, **distill):
    cfg = make_cfg(out, target_dir, **distill)
    cfg.draft.kind = "eagle3"
    eagle3_settings(cfg).aux_layer_ids = [1, 2, 3]
    eagle3_settings(cfg).draft_vocab_size = 64
    return cfg


def test_eagle3_checkpoints_contract(tmp_path, target_dir, data_dir):
    import datasets

    out = run_dir_with_data(tmp_path, data_dir)
    cfg = eagle3_cfg(out, target_dir, max_steps=4, save_every=2, batch_size=16, lr=3e-3)
    run_distill(cfg)
    assert not (out / "checkpoints").exists()  # only the configured kind trained
    ckpts = list_checkpoints(out / "eagle3" / "checkpoints")
    assert [s for s, _ in ckpts] == [0, 2, 4]
    final = ckpts[-1][1]
    validate_eagle3_export(final)  # a checkpoint is the speculators layout ...
    weights = load_file(final / "model.safetensors")
    assert "embed_tokens.weight" not in weights  # ... without the target's embeddings
    meta = checkpoint_meta(final)
    assert (meta["kind"], meta["loss_name"], meta["teacher"]) == ("eagle3", "forward_kl", "online")
    assert meta["aux_layer_ids"] == [1, 2, 3] and meta["draft_vocab_size"] == 64
    assert meta["init"].startswith("eagle3 head: aux layers [1, 2, 3], draft vocabulary 64")
    # the draft vocabulary: the 64 most frequent completion tokens of the training data
    ds = datasets.load_from_disk(str(data_dir / "dataset"))
    counts = torch.bincount(
        torch.tensor([t for row in ds["completion_ids"] for t in row]), minlength=259
    )
    want = build_draft_vocab(counts, 64, 259)
    assert torch.equal(weights["d2t"], want.d2t) and torch.equal(weights["t2d"], want.t2d)
    covered = float(counts[want.t2d].sum() / counts.sum())
    assert meta["draft_vocab_coverage"] == pytest.approx(covered)
    hist = meta["loss_history"]  # the whole data set each step: the loss must go down
    assert len(hist) == 4 and hist[-1] < hist[0]
    # the step-0 weights were the init and training moved them; lm_head started as the
    # target's rows of the draft vocabulary
    init = load_file(ckpts[0][1] / "model.safetensors")
    from transformers import AutoModelForCausalLM

    tw = AutoModelForCausalLM.from_pretrained(target_dir).get_output_embeddings().weight
    assert torch.equal(init["lm_head.weight"], tw[want.target_ids()])
    assert not torch.equal(init["fc.weight"], weights["fc.weight"])


def test_eagle3_heldout_loss_is_recorded_and_falls_with_training(tmp_path, target_dir, data_dir):
    """distill.heldout_prompts on a head: the held-out loss is measured through the kind's
    own loss parts (one per training-time-test step, weighted), at the start and after
    training, and a head trained on the other prompts lowers it."""
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = eagle3_cfg(out, target_dir, max_steps=4, save_every=4, batch_size=8, lr=3e-3)
    cfg.distill.heldout_prompts = 4
    run_distill(cfg)
    ckpts = dict(list_checkpoints(out / "eagle3" / "checkpoints"))
    before = checkpoint_meta(ckpts[0])["heldout_loss"]
    after = checkpoint_meta(ckpts[4])["heldout_loss"]
    assert 0 < after < before


def test_the_head_trains_at_its_own_lr_beside_the_independent_draft(tmp_path, target_dir, data_dir):
    """draft.eagle3.lr: a from-scratch head and a fine-tuned draft in one run, each at its own
    step size (the checkpoints record the lr their optimizer ran at)."""
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = eagle3_cfg(out, target_dir, max_steps=2, save_every=2, batch_size=16, lr=1e-5)
    cfg.draft.kind = ["independent", "eagle3"]
    eagle3_settings(cfg).lr = 3e-3
    cfg.distill.warmup_steps, cfg.distill.lr_schedule = 0, "constant"
    run_distill(cfg)
    head = checkpoint_meta(out / "eagle3" / "checkpoints" / "checkpoint-2")
    draft = checkpoint_meta(out / "checkpoints" / "checkpoint-2")
    assert (head["lr"], draft["lr"]) == (3e-3, 1e-5)
    assert head["settings"]["draft"]["eagle3"]["lr"] == 3e-3  # a changed lr refuses to resume


def test_eagle3_resume_after_a_crash_gives_the_same_result(
    tmp_path, target_dir, data_dir, monkeypatch
):
    from draftsmith.distill import train as train_mod

    ref_out = run_dir_with_data(tmp_path / "ref", data_dir)
    run_distill(eagle3_cfg(ref_out, target_dir, max_steps=5, save_every=2))

    out = run_dir_with_data(tmp_path / "crash", data_dir)
    cfg = eagle3_cfg(out, target_dir, max_steps=5, save_every=2)
    real = train_mod.kill_hook

    def crash(tag):
        if tag == "step:3":
            raise KeyboardInterrupt  # dies between checkpoints 2 and 4
        real(tag)

    monkeypatch.setattr(train_mod, "kill_hook", crash)
    with pytest.raises(KeyboardInterrupt):
        run_distill(cfg)
    monkeypatch.setattr(train_mod, "kill_hook", real)
    assert [s for s, _ in list_checkpoints(out / "eagle3" / "checkpoints")] == [0, 2]
    run_distill(cfg)
    a = load_file(ref_out / "eagle3/checkpoints/checkpoint-5/model.safetensors")
    b = load_file(out / "eagle3/checkpoints/checkpoint-5/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert (
        checkpoint_meta(out / "eagle3/checkpoints/checkpoint-5")["loss_history"]
        == checkpoint_meta(ref_out / "eagle3/checkpoints/checkpoint-5")["loss_history"]
    )


def test_eagle3_ce_twin_and_a_resume_of_the_other_kind(tmp_path, target_dir, data_dir):
    out = run_dir_with_data(tmp_path, data_dir)
    cfg = eagle3_cfg(out, target_dir, max_steps=2, save_every=2, ce_baseline=True)
    eagle3_settings(cfg).train_lm_head = False
    run_distill(cfg)
    main = out / "eagle3" / "checkpoints"
    twin = out / "eagle3" / "ablations" / "ce"
    assert (
        checkpoint_meta(main / "checkpoint-2")["loss_name"],
        checkpoint_meta(twin / "checkpoint-2")["loss_name"],
    ) == (
        "forward_kl",
        "ce",
    )
    a, b = (load_file(d / "checkpoint-0" / "model.safetensors") for d in (main, twin))
    assert all(torch.equal(a[k], b[k]) for k in a)  # same init
    c = load_file(twin / "checkpoint-2" / "model.safetensors")
    assert torch.equal(b["lm_head.weight"], c["lm_head.weight"])  # train_lm_head: false
    assert not torch.equal(b["fc.weight"], c["fc.weight"])
    head = load_eagle3(twin / "checkpoint-2")
    assert head.vocab.size == 64

    # an eagle3 checkpoint cannot resume an independent draft
    other = run_dir_with_data(tmp_path / "other", data_dir)
    ind = make_cfg(other, target_dir, max_steps=2, save_every=2)
    ind.distill.resume = str(main / "checkpoint-2")
    with pytest.raises(DraftsmithError) as e:
        run_distill(ind)
    assert str(e.value) == (
        f"distill.resume: {main / 'checkpoint-2'} is a checkpoint of kind eagle3, not "
        "independent; point distill.resume at one of this kind's checkpoints (or use auto)"
    )


def test_a_changed_head_setting_is_one_error_and_other_kinds_keys_are_not(
    tmp_path, target_dir, data_dir
):
    from draftsmith.distill.stage import check_distill_settings

    out = run_dir_with_data(tmp_path, data_dir)
    run_distill(eagle3_cfg(out, target_dir, max_steps=2, save_every=2))
    ckpts = out / "eagle3" / "checkpoints"
    draft = checkpoint_meta(ckpts / "checkpoint-2")["settings"]["draft"]
    assert (draft["kind"], draft["eagle3"]["ttt_steps"]) == ("eagle3", 3)
    assert "num_layers" not in draft and "include_embeddings" not in draft["eagle3"]

    changed = eagle3_cfg(out, target_dir, max_steps=2, save_every=2)
    eagle3_settings(changed).ttt_steps = 2
    with pytest.raises(DraftsmithError) as e:
        check_distill_settings(changed)
    assert str(e.value) == (
        f"{ckpts}: its checkpoints were trained with other settings (draft.eagle3.ttt_steps "
        "differ; e.g. draft.eagle3.ttt_steps was 3, now 2); put the settings back, or delete "
        "that dir (or use a new run.output_dir) to train with these"
    )
    # the independent draft's keys, the export's, and adding the other kind leave it alone
    same = eagle3_cfg(out, target_dir, max_steps=2, save_every=2)
    same.draft.kind = ["independent", "eagle3"]
    same.draft.num_layers = 3
    eagle3_settings(same).include_embeddings = False
    check_distill_settings(same)
