"""The training loop: one accelerate code path for CPU, one GPU, and many GPUs or nodes.

    draftsmith distill CONFIG                                   # one process (CPU or GPU)
    accelerate launch --num_processes 8 -m draftsmith.cli distill CONFIG   # DDP
    accelerate launch --num_processes 2 --cpu -m draftsmith.cli distill CONFIG  # DDP on CPU (gloo)

FSDP is refused (one error at start): checkpoints are written by rank 0 from its own
parameters and on-policy sampling calls `generate` on the unwrapped module, both of which
assume every rank holds the whole draft. Drafts are small; DDP fits them.

Per optimizer step: the global batch (distill.batch_size sequences) is split into
grad_accum_steps x num_processes micro-batches. Each micro-batch loss is its token SUM
divided by the global batch's completion-token count (times the process count, which
DDP's gradient averaging divides out), so the update is the exact token mean over the
global batch whatever the accumulation and process layout.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.config import Config
from draftsmith.data import load_train_dataset
from draftsmith.distill.batching import (
    Batch,
    BatchPlan,
    TrainData,
    check_divisible,
    collate,
    micro_batches,
)
from draftsmith.distill.checkpoint import (
    find_resume,
    kill_hook,
    list_checkpoints,
    load_train_state,
    prune_checkpoints,
    read_meta,
    save_checkpoint,
    training_settings,
)
from draftsmith.distill.teacher import (
    CompletionLogits,
    is_on_policy_step,
    sample_completions,
)
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.io import clean_stale_temps
from draftsmith.kinds import FALLBACK_KIND
from draftsmith.kinds.base import KindTraining
from draftsmith.models import (
    batched_bf16,
    load_target,
    load_target_config,
    load_target_tokenizer,
    pick_device,
)
from draftsmith.rundir import record_config
from draftsmith.tracking import wandb_run
from draftsmith.vocab_rows import token_id_count


@dataclass
class Trainer:
    """Everything one optimizer step needs (built once by `setup`)."""

    cfg: Config
    loss_name: str
    accelerator: object
    model: object  # the prepared CompletionLogits(draft)
    teacher: CompletionLogits | None
    optimizer: object
    scheduler: object
    data: TrainData
    plan: BatchPlan
    tokenizer: object
    meta: dict
    checkpoints_dir: Path
    kind: KindTraining  # the kind's training side (DraftKind.training(), draftsmith/kinds/)
    target_config: object
    step: int = 0
    history: list[float] = field(default_factory=list)
    # process CPU seconds spent in optimizer steps, over all resumes: what a run's training
    # cost, independent of the machine's load (README compares data kinds by it)
    cpu_seconds: float = 0.0
    tokens_seen: int = 0  # completion tokens trained on so far (sums over epochs)
    heldout: TrainData | None = None  # distill.heldout_prompts' sequences, never trained on
    heldout_losses: dict[int, float] = field(default_factory=dict)  # step -> held-out loss

    @property
    def draft(self):
        return self.accelerator.unwrap_model(self.model).lm

    @property
    def num_ids(self) -> int:
        return self.accelerator.unwrap_model(self.model).num_ids


# ----------------------------------------------------------------------------- data


def make_batches(tr: Trainer, step: int, on_policy: bool) -> list[Batch]:
    """This process's micro-batches for `step`, on device (draft-sampled when on-policy)."""
    acc, dcfg = tr.accelerator, tr.cfg.distill
    idx = micro_batches(
        tr.plan.global_batch(step), dcfg.grad_accum_steps, acc.process_index, acc.num_processes
    )
    pad = tr.tokenizer.pad_token_id
    out = []
    for j, rows in enumerate(idx):
        examples = tr.data.examples(rows)
        if on_policy:
            seed = hash((tr.cfg.run.seed, step, acc.process_index, j)) % (2**31)
            examples = sample_completions(
                tr.draft,
                examples,
                temperature=dcfg.on_policy_temperature,
                pad_id=pad,
                eos_id=tr.tokenizer.eos_token_id,
                seed=seed,
                device=acc.device,
                num_ids=tr.num_ids,
            )
        out.append(collate(examples, pad).to(acc.device))
    return out


# ----------------------------------------------------------------------------- one step


def micro_step(tr: Trainer, batch: Batch, global_counts: list[float], on_policy: bool):
    """Forward + backward of one micro-batch; returns its loss SUM per part (detached, (m,)).

    A kind's loss has m parts (a head trained with a training-time test: one per step); part i's
    sum is divided by its token count over the whole global batch and weighted, so the
    update is the weighted sum of exact token means (one part: the plain token mean).
    """
    acc = tr.accelerator
    parts = tr.kind.loss_parts(tr, batch, on_policy)
    weights = tr.kind.loss_weights(tr.cfg)
    objective = sum(
        w * p.total * acc.num_processes / n
        for w, p, n in zip(weights, parts, global_counts)
        if n > 0  # a part with no token anywhere (a TTT step past every sequence) adds 0
    )
    acc.backward(objective)
    return torch.stack([p.total.detach() for p in parts])


def weighted_token_mean(tr: Trainer, totals: torch.Tensor, counts: torch.Tensor) -> float:
    """The objective from its parts' loss sums and token counts ((m,) each): each part's
    exact token mean, weighted as the kind weights them."""
    weights = torch.tensor(tr.kind.loss_weights(tr.cfg), device=totals.device)
    return float((weights * (totals / counts.clamp(min=1.0))).sum())


def train_step(tr: Trainer, step: int) -> dict:
    """One optimizer step over the global batch; returns its metrics."""
    acc, dcfg = tr.accelerator, tr.cfg.distill
    on_policy = is_on_policy_step(tr.cfg.run.seed, step, dcfg.on_policy_fraction)
    batches = make_batches(tr, step, on_policy)
    counts = [tr.kind.token_counts(tr, b) for b in batches]  # per micro-batch, per part
    local = torch.tensor([sum(c) for c in zip(*counts)], device=acc.device)  # (m,)
    global_counts = acc.reduce(local, "sum")
    total = torch.zeros(len(local), device=acc.device)
    for j, batch in enumerate(batches):
        last = j == len(batches) - 1
        with contextlib.nullcontext() if last else acc.no_sync(tr.model):
            total += micro_step(tr, batch, global_counts.tolist(), on_policy)
    loss = weighted_token_mean(tr, acc.reduce(total, "sum"), global_counts)
    if not math.isfinite(loss):
        good = list_checkpoints(tr.checkpoints_dir)
        keep = good[-1][1] if good else "none"
        raise DraftsmithError(
            f"distill: the loss became {loss} at step {step + 1}; stopped (last good checkpoint: "
            f"{keep}); try a lower distill.lr or distill.max_grad_norm"
        )
    grad_norm = acc.clip_grad_norm_(tr.model.parameters(), dcfg.max_grad_norm)
    lr = tr.scheduler.get_last_lr()[0]
    tr.optimizer.step()
    tr.scheduler.step()
    tr.optimizer.zero_grad(set_to_none=True)
    return {
        "loss": loss,
        "lr": lr,
        "grad_norm": float(grad_norm),
        "tokens": global_counts[0].item(),
        "on_policy": on_policy,
    }


# ----------------------------------------------------------------------------- held out


@torch.no_grad()
def measure_heldout(tr: Trainer) -> float | None:
    """The draft's loss on the held-out prompts' completions at the current step (None when
    distill.heldout_prompts is 0): the training objective's exact token mean, nothing
    updated, cached per step. Every process computes it over all held-out sequences (a DDP
    forward must run on every rank alike), so all ranks agree without talking."""
    if tr.heldout is None:
        return None
    if tr.step not in tr.heldout_losses:
        acc, dcfg = tr.accelerator, tr.cfg.distill
        size = max(1, dcfg.batch_size // (dcfg.grad_accum_steps * acc.num_processes))
        order = sorted(range(len(tr.heldout)), key=tr.heldout.lengths.__getitem__)  # less padding
        totals, counts = 0.0, 0.0
        tr.model.eval()
        try:
            for i in range(0, len(order), size):
                examples = tr.heldout.examples(order[i : i + size])
                batch = collate(examples, tr.tokenizer.pad_token_id).to(acc.device)
                parts = tr.kind.loss_parts(tr, batch, on_policy=False)
                totals = totals + torch.stack([p.total.float() for p in parts]).cpu()
                counts = counts + torch.tensor(tr.kind.token_counts(tr, batch))
        finally:
            tr.model.train()
        tr.heldout_losses[tr.step] = weighted_token_mean(tr, totals, counts)
    return tr.heldout_losses[tr.step]


# ----------------------------------------------------------------------------- checkpoints


def train_state(tr: Trainer) -> dict:
    scaler = getattr(tr.accelerator, "scaler", None)  # fp16 on GPU only (None on CPU: fp32)
    return {
        "step": tr.step,
        "history": list(tr.history),
        "cpu_seconds": tr.cpu_seconds,
        "tokens_seen": tr.tokens_seen,
        "heldout_losses": dict(tr.heldout_losses),
        "optimizer": tr.optimizer.state_dict(),
        "scheduler": tr.scheduler.state_dict(),
        # the loss scale and its growth tracker: without them an fp16 resume restarts at
        # 2**16 and skips steps the uninterrupted run did not
        "grad_scaler": scaler.state_dict() if scaler is not None else None,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python_rng": random.getstate(),
    }


def restore_train_state(tr: Trainer, state: dict) -> None:
    tr.optimizer.load_state_dict(state["optimizer"])
    tr.scheduler.load_state_dict(state["scheduler"])
    scaler = getattr(tr.accelerator, "scaler", None)
    if scaler is not None and state.get("grad_scaler"):
        scaler.load_state_dict(state["grad_scaler"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    random.setstate(state["python_rng"])
    tr.step, tr.history = int(state["step"]), list(state["history"])
    tr.cpu_seconds = float(state.get("cpu_seconds", 0.0))  # absent in older checkpoints
    tr.tokens_seen = int(state.get("tokens_seen", 0))
    tr.heldout_losses = {int(k): float(v) for k, v in state.get("heldout_losses", {}).items()}


def save(tr: Trainer) -> None:
    """Rank 0 writes checkpoint-<step>; everyone waits so no rank runs ahead of a save."""
    acc = tr.accelerator
    heldout = measure_heldout(tr)  # on every rank, before rank 0 writes
    if acc.is_main_process:
        meta = {
            **tr.meta,
            "loss": tr.history[-1] if tr.history else None,
            "loss_history": tr.history,
            "lr": tr.scheduler.get_last_lr()[0],
            "cpu_time_s": round(tr.cpu_seconds, 3),
            "tokens_seen": tr.tokens_seen,
            **({} if heldout is None else {"heldout_loss": heldout}),
        }
        write_model = tr.kind.model_writer(tr)
        save_checkpoint(tr.checkpoints_dir, tr.step, write_model, train_state(tr), meta)
        prune_checkpoints(tr.checkpoints_dir, tr.cfg.distill.keep_last)
    acc.wait_for_everyone()


# ----------------------------------------------------------------------------- setup


def make_accelerator(cfg: Config):
    from accelerate import Accelerator, DistributedType

    device = pick_device(cfg.run.device)
    mp = cfg.distill.mixed_precision
    if mp == "auto":
        mp = "bf16" if batched_bf16(device) else "no"
    _forget_other_precision(mp)
    acc = Accelerator(mixed_precision=mp, cpu=device.type == "cpu")
    if acc.distributed_type == DistributedType.FSDP:
        raise DraftsmithError(
            "accelerate is configured for FSDP, which distill does not support (checkpoints "
            "and on-policy sampling need the whole draft on each rank); use DDP: "
            "`accelerate launch --num_processes N -m draftsmith.cli distill CONFIG`"
        )
    return acc


def _forget_other_precision(mp: str) -> None:
    """accelerate keeps one AcceleratorState per process and refuses a second Accelerator of
    another precision; a process that distills twice (the Python API, a notebook, tests) may
    ask for another. Only that per-Accelerator state is dropped: the process group
    (PartialState) of a distributed launch is kept."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mp:
        AcceleratorState._reset_state(reset_partial_state=False)


def _check_loss(cfg: Config, loss_name: str) -> None:
    if loss_name == "ce" and cfg.distill.on_policy_fraction > 0:
        raise ConfigError(
            "distill.on_policy_fraction: needs a divergence loss; 'ce' learns the target's "
            "own tokens only"
        )


def setup(cfg: Config, checkpoints_dir: Path, loss_name: str, resume: Path | None, kind) -> Trainer:
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    dcfg = cfg.distill
    acc = make_accelerator(cfg)
    check_divisible(dcfg.batch_size, dcfg.grad_accum_steps, acc.num_processes)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    need_topk = kind.reads_topk(cfg, loss_name)
    data = TrainData(load_train_dataset(cfg.output_dir), dcfg.max_seq_len, need_topk)
    heldout = None
    if dcfg.heldout_prompts:
        data, heldout = data.split_prompts(dcfg.heldout_prompts, cfg.run.seed)
    target_tok = load_target_tokenizer(cfg.target)
    num_ids = token_id_count(target_tok)  # logits past it are padding (draftsmith/vocab_rows.py)
    kind.check_target(cfg, load_target_config(cfg.target), target_tok)  # before any weights load
    target = None
    if kind.needs_target_weights(cfg, loss_name, resume):
        target = load_target(cfg.target, acc.device, kind.target_dtype(cfg, acc.device))
    target_config = _target_config(cfg, target)
    draft, tok, init, kind_meta = kind.load_draft(
        cfg, resume, target, target_tok, target_config, data, acc.device
    )
    say = acc.print
    info = kind.describe(draft, target_config, say)
    teacher, module = kind.training_modules(cfg, loss_name, draft, target, num_ids, acc.device)
    del target  # offline/CE: the target is not kept in memory
    optimizer = torch.optim.AdamW(
        kind.trainable_parameters(cfg, draft),
        lr=kind.learning_rate(cfg),
        weight_decay=dcfg.weight_decay,
    )
    if dcfg.lr_schedule == "cosine":
        scheduler = get_cosine_schedule_with_warmup(optimizer, dcfg.warmup_steps, dcfg.max_steps)
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, dcfg.warmup_steps)
    model, optimizer = acc.prepare(module, optimizer)
    meta = {
        "kind": kind.name,
        "init": init,
        "loss_name": loss_name,
        "teacher": kind.teacher_name(cfg, loss_name),
        "max_steps": dcfg.max_steps,
        "target": cfg.target.model,
        **info,
        **kind_meta,
        "settings": training_settings(cfg, loss_name, kind),  # what the card and leaderboard read
    }
    say(
        f"distill ({kind.name}): {len(data)} sequences ({data.dropped} dropped: no completion "
        f"token within max_seq_len), loss {loss_name}, teacher {meta['teacher']}, init {init}"
    )
    if heldout is not None:
        say(
            f"distill: {dcfg.heldout_prompts} prompts held out ({len(heldout)} sequences), "
            "their loss measured at every log step and checkpoint"
        )
    return Trainer(
        cfg,
        loss_name,
        acc,
        model,
        teacher,
        optimizer,
        scheduler,
        data,
        BatchPlan(data.lengths, dcfg.batch_size, cfg.run.seed),
        tok,
        meta,
        checkpoints_dir,
        kind,
        target_config,
        heldout=heldout,
    )


def _target_config(cfg: Config, target):
    return target.config if target is not None else load_target_config(cfg.target)


# ----------------------------------------------------------------------------- the loop


def log_metrics(tr: Trainer, window: list[dict], seconds: float, run, bar) -> None:
    """One log line (and W&B point) over the steps since the last; measure_heldout has run
    for this step on every rank before."""
    loss = sum(m["loss"] for m in window) / len(window)
    tokens_per_s = sum(m["tokens"] for m in window) / max(seconds, 1e-9)
    last = window[-1]
    metrics = {
        "train/loss": loss,
        "train/lr": last["lr"],
        "train/grad_norm": last["grad_norm"],
        "train/tokens_per_s": tokens_per_s,
        "train/on_policy_share": sum(m["on_policy"] for m in window) / len(window),
    }
    heldout = tr.heldout_losses.get(tr.step)
    if heldout is not None:
        metrics["heldout/loss"] = heldout
    bar.write(
        f"step {tr.step}: loss {loss:.4f} lr {last['lr']:.2e} grad_norm "
        f"{last['grad_norm']:.3f} tokens/s {tokens_per_s:.0f}"
        + ("" if heldout is None else f" held-out loss {heldout:.4f}")
    )
    if run is not None:
        run.log(metrics, step=tr.step)


def log_heldout_start(tr: Trainer, run, bar) -> None:
    """The held-out loss where training starts (or resumes): the point every later one is
    read against."""
    heldout = measure_heldout(tr)
    if heldout is None or not tr.accelerator.is_main_process:
        return
    bar.write(f"step {tr.step}: held-out loss {heldout:.4f}")
    if run is not None:
        run.log({"heldout/loss": heldout}, step=tr.step)


def run_loop(tr: Trainer, run) -> None:
    dcfg, acc = tr.cfg.distill, tr.accelerator
    bar = tqdm(
        total=dcfg.max_steps, initial=tr.step, desc="distill", disable=not acc.is_main_process
    )
    log_heldout_start(tr, run, bar)
    window, t0 = [], time.perf_counter()
    while tr.step < dcfg.max_steps:
        cpu = time.process_time()
        metrics = train_step(tr, tr.step)
        tr.cpu_seconds += time.process_time() - cpu
        tr.tokens_seen += int(metrics["tokens"])
        tr.step += 1
        tr.history.append(metrics["loss"])
        window.append(metrics)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        if tr.step % dcfg.log_every == 0 or tr.step == dcfg.max_steps:
            seconds = time.perf_counter() - t0  # the steps' time, not the held-out pass's
            measure_heldout(tr)  # on every rank
            if acc.is_main_process:
                log_metrics(tr, window, seconds, run, bar)
            window, t0 = [], time.perf_counter()
        if is_save_step(tr.step, dcfg):
            save(tr)
        kill_hook(f"step:{tr.step}")
    bar.close()


def is_save_step(step: int, dcfg) -> bool:
    return step % dcfg.save_every == 0 or step == dcfg.max_steps or step in dcfg.save_steps


def train_draft(
    cfg: Config, checkpoints_dir: Path, kind: KindTraining, loss_override: str | None = None
) -> Path:
    """Train a draft into `checkpoints_dir`; returns the final checkpoint's path.

    `kind`: the training side of a kind of draft (draftsmith/kinds/ DraftKind.training()).
    `loss_override` trains a twin with another loss (e.g. "ce") on the same data, steps and
    init, for ablations. Resumable per distill.resume; a finished run returns at once.
    """
    checkpoints_dir = Path(checkpoints_dir)
    dcfg = cfg.distill
    loss_name = loss_override or dcfg.loss
    _check_loss(cfg, loss_name)
    done = dict(list_checkpoints(checkpoints_dir)).get(dcfg.max_steps)
    if done is not None:
        print(f"distill: already finished ({done} exists); nothing to do")
        return done
    clean_stale_temps(checkpoints_dir)
    resume = find_resume(checkpoints_dir, dcfg.resume)
    if resume is not None:
        _check_same_loss(resume, loss_name)
        _check_same_kind(resume, kind.name)
    tr = setup(cfg, checkpoints_dir, loss_name, resume, kind)
    record_config(cfg)  # every check passed; the first checkpoint is about to be written
    if resume is not None:
        restore_train_state(tr, load_train_state(resume))
        tr.accelerator.print(f"distill: resuming from {resume} (step {tr.step})")
    else:
        save(tr)  # checkpoint-0: the untrained initialisation
    job = "-".join(["distill"] + [kind.name] * (kind.name != FALLBACK_KIND))
    job += "" if loss_override is None else f"-{loss_name}"
    main = tr.accelerator.is_main_process
    with wandb_run(cfg, job) if main else contextlib.nullcontext(None) as run:
        if run is not None:
            run.config.update({"distill_info": tr.meta}, allow_val_change=True)
        run_loop(tr, run)
    return checkpoints_dir / f"checkpoint-{dcfg.max_steps}"


def _check_same_loss(resume: Path, loss_name: str) -> None:
    trained = read_meta(resume)["loss_name"]
    if trained != loss_name:
        raise DraftsmithError(
            f"distill.resume: {resume} was trained with loss {trained!r}, not {loss_name!r}; "
            "use another checkpoints directory or distill.resume=never on an empty one"
        )


def _check_same_kind(resume: Path, kind: str) -> None:
    trained = read_meta(resume)["kind"]
    if trained != kind:
        raise DraftsmithError(
            f"distill.resume: {resume} is a checkpoint of kind {trained}, not {kind}; "
            "point distill.resume at one of this kind's checkpoints (or use auto)"
        )
