"""The kinds of draft, registered in one place: what each brings to the shared stages.

An independent draft (its own layers, embeddings and head: distill/init.py) and an eagle3
head (one layer on the target's own hidden states: draftsmith/eagle3.py) are two kinds of
the same thing, something that proposes k tokens for the target to verify. The config
section, the losses, the accelerate loop and its checkpoints, the engine's one
propose/verify/accept/crop loop, the metrics, the leaderboard and the export step are
shared; a kind brings only:

    where        its run-dir folder: independent `checkpoints/` (CE twin `ablations/ce/`),
                 eagle3 `eagle3/checkpoints/` (CE twin `eagle3/ablations/ce/`); same
                 atomic checkpoint-<step> layout, train state and draftsmith_checkpoint.json
    build        a fresh draft (independent: init.build_draft; eagle3: a head from the
                 target, its draft vocabulary from the training data's completion tokens)
    train        what the loop differentiates: the module accelerate prepares, the teacher,
                 the per-micro-batch loss parts and their token counts (one part for an
                 independent draft, one per training-time-test step for eagle3)
    save / load  a checkpoint's model files (HF model dir / speculators layout)
    decode       the engine's Proposer (evaluate/engine.py, evaluate/eagle3_proposer.py)
                 and a teacher-forced greedy replay giving the engine's counts
    export       the files a serving stack loads (draft_model / eagle3 for vLLM)

A new kind is one more class here and its name in config.DraftKindName. The heavy
imports (torch models, accelerate) happen inside the methods, so importing the registry
stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import ConfigError

# ----------------------------------------------------------------------------- the interface


class DraftKind:
    name: str
    root: str  # sub-folder of the run dir holding this kind's checkpoints ("" = the run dir)

    # -- where --------------------------------------------------------------------------------

    def checkpoints_dir(self, output_dir: Path) -> Path:
        return Path(output_dir) / self.root / "checkpoints"

    def ce_dir(self, output_dir: Path) -> Path:
        """distill.ce_baseline: the plain cross-entropy twin (same data, steps and init)."""
        return Path(output_dir) / self.root / "ablations" / "ce"

    def draft_name(self, checkpoint: str) -> str:
        """The leaderboard name of one of this kind's checkpoints (unique across kinds)."""
        return checkpoint if not self.root else f"{self.root}-{checkpoint}"


def get_kind(name: str) -> DraftKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(
            f"draft.kind: unknown kind {name!r} (known: {', '.join(KINDS)})"
        ) from None


def kind_of(draft: dict) -> DraftKind:
    """The kind of a draft dict from evaluate.prompts.list_drafts (baselines: independent)."""
    return get_kind(draft.get("kind", "independent"))


def check_target(cfg: Config, target_config, num_ids: int) -> None:
    """Every configured kind's checks against the target (its config only, no weights)."""
    for name in cfg.draft.kinds:
        get_kind(name).check_target(cfg, target_config, num_ids)


def proposer_for(draft: dict, models):
    """The engine's Proposer for a draft dict (evaluate.prompts.list_drafts), loaded through
    its kind; `models` is the evaluate stage's loader (target(), tokenizer(), draft(d), dtype)."""
    return kind_of(draft).proposer(draft, models)


def teacher_forced_results(
    draft: dict, models, refs: list[dict], k: int, max_new_tokens: int, vocab: int | None
) -> list[dict]:
    """The engine's greedy counts for `draft` on refs (per prompt {"id", "category",
    "prompt_ids", "tokens": the target's greedy output}), without decoding."""
    return kind_of(draft).teacher_forced(draft, models, refs, k, max_new_tokens, vocab)


# ----------------------------------------------------------------------------- independent


class IndependentKind(DraftKind):
    """A small causal LM of the target's tokenizer (distill/init.py)."""

    name, root = "independent", ""

    def check_target(self, cfg: Config, target_config, num_ids: int) -> None:
        return None  # distill/init.py checks its own keys when it builds the draft

    # distill (distill/train.py keeps this kind's loop code unchanged)
    def reads_topk(self, cfg: Config, loss_name: str) -> bool:
        return loss_name != "ce" and cfg.distill.teacher == "offline"

    def needs_target_weights(self, cfg: Config, loss_name: str, resume) -> bool:
        from draftsmith.distill.train import _needs_target_weights

        return _needs_target_weights(cfg, loss_name, resume)

    def target_dtype(self, cfg: Config, device):
        return None  # target.dtype (models.load_target)

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        """(draft, tokenizer, init description, extra meta): built fresh or resumed."""
        from draftsmith.distill.train import load_draft

        draft, tok, init = load_draft(cfg, resume, target, target_tok, target_config, device)
        return draft, tok, init, {}

    def describe(self, draft, target_config, say) -> dict:
        from draftsmith.distill.train import describe

        return describe(draft, target_config, say)

    def training_modules(self, cfg: Config, loss_name: str, draft, target, num_ids: int):
        """(teacher or None, the module accelerate prepares)."""
        from draftsmith.distill.teacher import CompletionLogits
        from draftsmith.distill.train import _uses_target

        teacher = None
        if _uses_target(cfg, loss_name):
            target.requires_grad_(False)
            teacher = CompletionLogits(target.eval(), num_ids)
        return teacher, CompletionLogits(draft, num_ids)

    def trainable_parameters(self, cfg: Config, draft) -> list:
        from draftsmith.distill.train import trainable_parameters

        return trainable_parameters(draft, cfg.distill.freeze_embeddings)

    def loss_weights(self, cfg: Config) -> list[float]:
        return [1.0]

    def token_counts(self, tr, batch) -> list[float]:
        return [float(batch.num_tokens)]

    def loss_parts(self, tr, batch, on_policy: bool) -> list:
        from draftsmith.distill.train import independent_loss_parts

        return independent_loss_parts(tr, batch, on_policy)

    def model_writer(self, tr):
        """The checkpoint's model files, written into a temp dir by distill/checkpoint.py."""

        def write(path: Path) -> None:
            tr.draft.save_pretrained(path)
            tr.tokenizer.save_pretrained(path)

        return write

    # evaluate
    def proposer(self, draft: dict, models):
        from draftsmith.evaluate.engine import IndependentProposer

        return IndependentProposer(models.draft(draft))

    def teacher_forced(self, draft, models, refs, k, max_new_tokens, vocab):
        from draftsmith.evaluate.teacher_forced import teacher_forced_results as tf

        return tf(models.draft(draft), refs, k, max_new_tokens, vocab)

    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict:
        """evaluate.backend=vllm: the draft as vLLM's `draft_model` method."""
        # vLLM (0.15) runs an independent draft only at the target's tensor-parallel size
        return {
            "method": "draft_model",
            "model": path,
            "num_speculative_tokens": k,
            "draft_tensor_parallel_size": cfg.evaluate.vllm.tensor_parallel_size,
        }

    # export
    def export(self, cfg: Config, row: dict, k: int, tmp: Path, out: Path) -> None:
        from draftsmith.export import export_independent

        export_independent(cfg, row, k, tmp, out)


# ----------------------------------------------------------------------------- eagle3


class Eagle3Kind(DraftKind):
    """An EAGLE-3 head on the target's hidden states, over a reduced draft vocabulary."""

    name, root = "eagle3", "eagle3"

    def check_target(self, cfg: Config, target_config, num_ids: int) -> None:
        """One ConfigError line for a target the configured head cannot be built on."""
        from draftsmith.eagle3 import (
            check_aux_layer_ids,
            default_aux_layer_ids,
            layer_config_from_target,
        )

        e = cfg.draft.eagle3
        layer_config_from_target(target_config)  # a supported family
        n = target_config.get_text_config().num_hidden_layers
        if e.aux_layer_ids is None:
            default_aux_layer_ids(n)
        else:
            check_aux_layer_ids(e.aux_layer_ids, n)
        if e.draft_vocab_size > num_ids:
            raise ConfigError(
                f"draft.eagle3.draft_vocab_size: {e.draft_vocab_size} is more than the "
                f"target's {num_ids} token ids; set at most {num_ids}"
            )

    # distill
    def reads_topk(self, cfg: Config, loss_name: str) -> bool:
        return False  # its teacher comes from the forward that gives it the hidden states

    def needs_target_weights(self, cfg: Config, loss_name: str, resume) -> bool:
        return True  # it reads the target's hidden states, CE twin included

    def target_dtype(self, cfg: Config, device):
        from draftsmith.distill.eagle3_train import batch_target_dtype

        return batch_target_dtype(cfg, device)

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        import torch

        from draftsmith.distill import eagle3_train as e3
        from draftsmith.distill.checkpoint import read_meta
        from draftsmith.eagle3_export import load_eagle3
        from draftsmith.vocab import token_id_count

        dtype = torch.float32 if cfg.draft.dtype == "auto" else getattr(torch, cfg.draft.dtype)
        num_ids = token_id_count(target_tok)
        rows = target_config.get_text_config().vocab_size
        counts = e3.completion_token_counts(data.dataset, rows, num_ids)
        if resume is None:
            head, init, _ = e3.build_head(cfg, target, data.dataset, num_ids)
        else:
            head, init = load_eagle3(resume, target), read_meta(resume)["init"]
        head = head.to(device=device, dtype=dtype).train()
        meta = {
            "aux_layer_ids": head.aux_layer_ids,
            "draft_vocab_size": head.vocab.size,
            "draft_vocab_coverage": e3.vocab_coverage(counts, head.t2d.cpu()),
            "ttt_steps": cfg.draft.eagle3.ttt_steps,
        }
        return head, target_tok, init, meta

    def describe(self, head, target_config, say) -> dict:
        import torch
        from transformers import AutoModelForCausalLM

        from draftsmith.distill.init import flops_per_token
        from draftsmith.models import count_parameters

        with torch.device("meta"):
            target = AutoModelForCausalLM.from_config(target_config)
        params = count_parameters(head)  # the target's embeddings are not the head's
        info = {
            "draft_params": params,
            "target_params": count_parameters(target),
            "flops_ratio": 2 * params / flops_per_token(target),
        }
        say(
            f"eagle3 head: {params / 1e6:.2f}M params (fc, 1 layer, norm, {head.vocab.size}-row "
            f"lm_head), target {info['target_params'] / 1e6:.2f}M; FLOPs/token ratio "
            f"{info['flops_ratio']:.3f}"
        )
        return info

    def training_modules(self, cfg: Config, loss_name: str, head, target, num_ids: int):
        from draftsmith.distill.eagle3_train import Eagle3Teacher, HeadUnroll

        return Eagle3Teacher(target, head), HeadUnroll(head, cfg.draft.eagle3.ttt_steps, num_ids)

    def trainable_parameters(self, cfg: Config, head) -> list:
        from draftsmith.distill.eagle3_train import trainable_parameters

        return trainable_parameters(head, cfg.draft.eagle3.train_lm_head)

    def loss_weights(self, cfg: Config) -> list[float]:
        e = cfg.draft.eagle3
        return [e.ttt_loss_decay**j for j in range(e.ttt_steps)]

    def token_counts(self, tr, batch) -> list[float]:
        from draftsmith.distill.eagle3_train import ttt_token_counts

        return ttt_token_counts(tr.loss_name, batch, tr.cfg.draft.eagle3.ttt_steps, tr.draft.t2d)

    def loss_parts(self, tr, batch, on_policy: bool) -> list:
        from draftsmith.distill.eagle3_train import ttt_loss_parts

        d = tr.cfg.distill
        with tr.accelerator.autocast():
            aux, teacher = tr.teacher(batch)  # no grad: (B, L, 3d), (N, Vd)
            step_logits = tr.model(aux, batch.input_ids, batch.attention_mask)
        return ttt_loss_parts(
            tr.loss_name,
            step_logits,
            teacher,
            batch,
            tr.draft.t2d,
            temperature=d.temperature,
            beta=d.beta,
            ce_weight=d.ce_weight,
        )

    def model_writer(self, tr):
        from draftsmith.distill.eagle3_train import write_head
        from draftsmith.models import resolve_model

        verifier = resolve_model(tr.cfg.target.model, "target.model")
        k = tr.cfg.evaluate.num_speculative_tokens

        def write(path: Path) -> None:
            write_head(tr.draft, path, tr.target_config, verifier, k)

        return write

    # evaluate
    def load_head(self, draft: dict, models):
        from draftsmith.eagle3_export import load_eagle3

        return load_eagle3(draft["ref"], models.target()).to(models.dtype).eval()

    def proposer(self, draft: dict, models):
        from draftsmith.evaluate.eagle3_proposer import Eagle3Proposer

        return Eagle3Proposer(self.load_head(draft, models))

    def teacher_forced(self, draft, models, refs, k, max_new_tokens, vocab):
        from draftsmith.evaluate.eagle3_proposer import teacher_forced_results as tf

        return tf(self.load_head(draft, models), models.target(), refs, k, max_new_tokens, vocab)

    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict:
        """evaluate.backend=vllm: the checkpoint (speculators layout) as vLLM's `eagle3`
        method; vLLM's default runner shares the target's embeddings with it (README)."""
        return {"method": "eagle3", "model": path, "num_speculative_tokens": k}

    # export
    def export(self, cfg: Config, row: dict, k: int, tmp: Path, out: Path) -> None:
        from draftsmith.export import export_eagle3

        export_eagle3(cfg, row, k, tmp, out)


KINDS: dict[str, DraftKind] = {k.name: k for k in (IndependentKind(), Eagle3Kind())}
