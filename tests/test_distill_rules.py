"""Training rules: when distill loads the target, pure on-policy sampling, fp16 scaler state."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_distill_helpers import build_tiny_target, make_cfg, write_dataset  # noqa: E402

from draftsmith.distill import train as train_mod  # noqa: E402
from draftsmith.distill.batching import Example  # noqa: E402
from draftsmith.distill.checkpoint import load_train_state  # noqa: E402
from draftsmith.distill.stage import run_distill  # noqa: E402
from draftsmith.distill.teacher import sample_completions  # noqa: E402
from draftsmith.kinds.independent.train import IndependentTraining  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    from transformers import GenerationConfig

    root = tmp_path_factory.mktemp("rules")
    target = build_tiny_target(root / "target")
    # a field only the target's generation_config.json carries: it must reach the draft
    # even when the target's weights are never loaded
    gen = GenerationConfig.from_pretrained(target)
    gen.max_length = 77
    gen.save_pretrained(target)
    draft = build_tiny_target(root / "draft", seed=2)
    write_dataset(root / "src", target, n=8, k=8)
    return {"root": root, "target": target, "draft": draft}


def _run_dir(dirs: dict, name: str) -> Path:
    out = dirs["root"] / name
    (out / "data").mkdir(parents=True)
    os.symlink(dirs["root"] / "src" / "data" / "dataset", out / "data" / "dataset")
    (out / "data" / "meta.json").write_text((dirs["root"] / "src/data/meta.json").read_text())
    return out


@pytest.fixture
def target_loads(monkeypatch, dirs) -> list:
    """Every from_pretrained of the target's weights, as a weak reference to the model."""
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained.__func__
    loads = []

    def spy(cls, path, *a, **kw):
        model = real(cls, path, *a, **kw)
        if Path(path).resolve() == dirs["target"].resolve():
            loads.append(weakref.ref(model))
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    return loads


def _setup(
    dirs: dict, name: str, *, teacher: str, init: str, loss: str = "forward_kl", resume=None
):
    out = dirs["root"] / name if resume else _run_dir(dirs, name)
    cfg = make_cfg(out, dirs["target"], teacher=teacher, loss=loss)
    cfg.draft.init = init
    if init == "pretrained":
        cfg.draft.model = str(dirs["draft"])
    return train_mod.setup(cfg, out / "checkpoints", loss, resume, IndependentTraining())


@pytest.mark.parametrize(
    "teacher,init,loss,loads,kept",
    [
        ("offline", "pretrained", "forward_kl", 0, False),  # needs only the target's files
        ("online", "pretrained", "ce", 0, False),  # CE has no teacher
        ("offline", "from_target", "forward_kl", 1, False),  # built from it, then dropped
        ("offline", "config", "forward_kl", 1, False),
        ("online", "pretrained", "forward_kl", 1, True),  # the teacher
    ],
)
def test_target_is_loaded_only_to_teach_or_build(
    dirs, target_loads, teacher, init, loss, loads, kept
):
    tr = _setup(dirs, f"setup-{teacher}-{init}-{loss}", teacher=teacher, init=init, loss=loss)
    assert len(target_loads) == loads
    gc.collect()
    alive = [ref() for ref in target_loads if ref() is not None]
    assert bool(alive) == kept
    if kept:
        assert tr.teacher.lm is alive[0]
    else:
        assert tr.teacher is None
    assert tr.draft.generation_config.max_length == 77  # the target's, read from its files


def test_resumed_draft_does_not_load_the_target(dirs, target_loads):
    out = _run_dir(dirs, "resume")
    run_distill(make_cfg(out, dirs["target"], teacher="offline", max_steps=1, save_every=1))
    target_loads.clear()
    ck = out / "checkpoints" / "checkpoint-1"
    tr = _setup(dirs, "resume", teacher="offline", init="from_target", resume=ck)
    assert target_loads == [] and tr.teacher is None


# ----------------------------------------------------------------------------- on-policy sampling


def _pure_reference(draft, prompt: list[int], n: int, temperature: float, seed: int) -> list[int]:
    """Multinomial sampling from softmax(logits / T), written out: no cache, nothing else."""
    torch.manual_seed(seed)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = draft(torch.tensor([ids])).logits[:, -1, :].float()  # (1, V)
            ids.append(int(torch.multinomial((logits / temperature).softmax(-1), 1)))
    return ids[len(prompt) :]


def test_on_policy_samples_ignore_the_generation_config(dirs):
    """Qwen2.5-Instruct ships repetition_penalty 1.05; here an extreme one, plus top-k/top-p."""
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(dirs["draft"]).eval()
    gen = draft.generation_config
    gen.repetition_penalty, gen.top_k, gen.top_p, gen.no_repeat_ngram_size = 10.0, 3, 0.5, 1
    prompt, n, temperature = [5, 70, 80, 90], 16, 0.7
    differs = 0
    for seed in range(4):
        (sample,) = sample_completions(
            draft,
            [Example(prompt, [1] * n)],
            temperature=temperature,
            pad_id=0,
            eos_id=None,
            seed=seed,
            device=torch.device("cpu"),
            num_ids=draft.config.vocab_size,
        )
        assert sample.completion_ids == _pure_reference(draft, prompt, n, temperature, seed)
        torch.manual_seed(seed)  # the same draw through the model's own generation config
        penalised = draft.generate(
            torch.tensor([prompt]), do_sample=True, temperature=temperature, max_new_tokens=n
        )[0, len(prompt) :].tolist()
        differs += penalised != sample.completion_ids
    assert differs > 0  # the config would have changed the samples
    assert draft.generation_config.repetition_penalty == 10.0  # restored after sampling


# ----------------------------------------------------------------------------- fp16 GradScaler


def _trainer_with_scaler(scaler):
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return SimpleNamespace(
        step=0,
        history=[],
        cpu_seconds=0.0,
        tokens_seen=0,
        heldout_losses={},
        optimizer=opt,
        scheduler=sched,
        accelerator=SimpleNamespace(scaler=scaler),
    )


def test_grad_scaler_state_round_trips_through_the_checkpoint(tmp_path):
    """accelerate makes a GradScaler only for fp16 on a GPU (on CPU, fp16 means fp32 and
    `accelerator.scaler` is None), so a real torch GradScaler stands in for it here."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    tr = _trainer_with_scaler(scaler)
    (p,) = tr.optimizer.param_groups[0]["params"]
    for bad in (True, False, False):  # an overflow halves the scale; good steps count up
        tr.optimizer.zero_grad()
        scaler.scale((p * (float("inf") if bad else 1.0)).sum()).backward()
        scaler.step(tr.optimizer)
        scaler.update()
    saved = scaler.state_dict()
    assert saved["scale"] == 512.0 and saved["_growth_tracker"] == 2
    torch.save(train_mod.train_state(tr), tmp_path / "train_state.pt")
    fresh = _trainer_with_scaler(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
    train_mod.restore_train_state(fresh, load_train_state(tmp_path))  # weights_only load
    assert fresh.accelerator.scaler.state_dict() == saved
    # without fp16 there is no scaler: nothing saved, and old checkpoints (no key) still load
    plain = _trainer_with_scaler(None)
    state = train_mod.train_state(plain)
    assert state["grad_scaler"] is None
    del state["grad_scaler"]
    old = _trainer_with_scaler(torch.amp.GradScaler("cpu"))
    train_mod.restore_train_state(old, state)
    assert old.accelerator.scaler.get_scale() == 2.0**16  # untouched


@pytest.mark.gpu
def test_fp16_resume_restores_the_loss_scale(dirs):
    """On CUDA with fp16: a run resumed from checkpoint-2 ends with the uninterrupted run's
    loss scale and losses. (Not run on the CPU machine this was written on.)"""
    import shutil

    def cfg_for(name):
        cfg = make_cfg(_run_dir(dirs, name), dirs["target"], max_steps=4, save_every=2, lr=1e-2)
        cfg.run.device, cfg.distill.mixed_precision = "cuda", "fp16"
        return cfg

    ref, resumed = cfg_for("fp16-ref"), cfg_for("fp16-resumed")
    run_distill(ref)
    run_distill(resumed)
    ck = resumed.output_dir / "checkpoints"
    shutil.rmtree(ck / "checkpoint-4")
    run_distill(resumed)  # resumes from checkpoint-2
    a = load_train_state(ref.output_dir / "checkpoints" / "checkpoint-4")
    b = load_train_state(ck / "checkpoint-4")
    # the scale, or (with no overflow in 4 steps) the growth tracker: 4 vs 2 unrestored
    assert a["grad_scaler"] is not None and b["grad_scaler"] == a["grad_scaler"]
    assert b["history"] == pytest.approx(a["history"], rel=1e-3)


def test_one_process_distills_at_two_precisions(tmp_path):
    """accelerate's per-process state refused a second Accelerator of another precision
    (the pipeline's Python API, notebooks, this suite): make_accelerator drops it."""
    from draftsmith.distill.train import make_accelerator

    cfg = make_cfg(tmp_path, tmp_path)
    first = make_accelerator(cfg)
    assert first.mixed_precision == "no"
    cfg.distill.mixed_precision = "bf16"
    assert make_accelerator(cfg).mixed_precision == "bf16"
    cfg.distill.mixed_precision = "no"
    assert make_accelerator(cfg).mixed_precision == "no"


def test_fsdp_is_refused_with_one_error(tmp_path, monkeypatch):
    """A single CPU process never becomes FSDP, so accelerate's answer is stood in for."""
    import accelerate
    from accelerate import DistributedType

    from draftsmith.distill.train import make_accelerator
    from draftsmith.errors import DraftsmithError

    class ShardedAccelerator(accelerate.Accelerator):
        distributed_type = DistributedType.FSDP

    monkeypatch.setattr(accelerate, "Accelerator", ShardedAccelerator)
    with pytest.raises(DraftsmithError, match="FSDP, which distill does not support"):
        make_accelerator(make_cfg(tmp_path, tmp_path))
