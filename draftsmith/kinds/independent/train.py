"""The independent kind's side of the training loop: a small causal LM of the target's
tokenizer (init.py builds it), trained whole, in its last layers, or through
low-rank adapters (distill/lora.py). distill/train.py's loop calls it, as any kind's
training side, through kinds/base.py KindTraining.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from draftsmith.config import Config
from draftsmith.distill.batching import Batch
from draftsmith.distill.checkpoint import read_meta
from draftsmith.distill.losses import TokenSum, distill_loss
from draftsmith.distill.teacher import CompletionLogits, teacher_signal
from draftsmith.errors import ConfigError
from draftsmith.kinds.base import KindTraining
from draftsmith.kinds.independent.init import build_draft, check_pretrained_draft
from draftsmith.models import count_parameters, flops_per_token, load_tokenizer, pick_batch_dtype

# The draft keys the independent kind reads (init.py build_draft), recorded with
# its checkpoints; `draft.kind` and the other kinds' sections are not among them.
DRAFT_KEYS = (
    "init",
    "model",
    "num_layers",
    "layer_selection",
    "layers",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "dtype",
)


def _uses_target(cfg: Config, loss_name: str) -> bool:
    return loss_name != "ce" and cfg.distill.teacher == "online"


def _needs_target_weights(cfg: Config, loss_name: str, resume: Path | None) -> bool:
    """Load the target only to teach (online) or to build a fresh from_target/config draft.

    The offline teacher, CE and a pretrained or resumed draft need only the target's
    tokenizer, config and generation config (small files); a target loaded just to build
    the draft is dropped right after (`setup`).
    """
    builds_draft = resume is None and cfg.draft.init != "pretrained"
    return _uses_target(cfg, loss_name) or builds_draft


def load_draft(cfg: Config, resume: Path | None, target, target_tok, target_config, device):
    """(draft, tokenizer, init description): from a checkpoint, else freshly initialised."""
    if resume is None:
        return build_draft(cfg, target, target_tok, device, target_config)
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if cfg.draft.dtype == "auto" else getattr(torch, cfg.draft.dtype)
    draft = AutoModelForCausalLM.from_pretrained(resume, dtype=dtype).to(device).train()
    return draft, load_tokenizer(str(resume), key="distill.resume"), read_meta(resume)["init"]


def trainable_parameters(draft, freeze_embeddings: bool, train_layers: int | None = None) -> list:
    """The parameters the optimizer updates; frozen embeddings (and a tied head) get no grad.
    `train_layers`: only the last that many decoder layers (and the final norm and head)
    train; the layers below and the input embeddings are frozen, so no gradient is computed
    below the lowest trained layer."""
    if freeze_embeddings:
        draft.get_input_embeddings().weight.requires_grad_(False)
        draft.get_output_embeddings().weight.requires_grad_(False)
    if train_layers is not None:
        layers = _decoder_layers(draft, "distill.train_layers")
        if train_layers > len(layers):
            raise ConfigError(
                f"distill.train_layers: {train_layers} is more than the draft's {len(layers)} layers"
            )
        draft.get_input_embeddings().weight.requires_grad_(False)
        for layer in layers[: len(layers) - train_layers]:
            layer.requires_grad_(False)
    return [p for p in draft.parameters() if p.requires_grad]


def _decoder_layers(draft, key: str = "distill.lora_rank"):
    layers = getattr(getattr(draft, "model", None), "layers", None)
    if layers is None:
        raise ConfigError(
            f"{key}: {type(draft).__name__} has no decoder layers (model.layers) to choose "
            "from; set it to null"
        )
    return layers


def describe(draft, target_config, say) -> dict:
    """Print and return the draft's size and its FLOPs/token relative to the target."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # the target's shape without its weights
        target = AutoModelForCausalLM.from_config(target_config)
    d_flops, t_flops = flops_per_token(draft), flops_per_token(target)
    info = {
        "draft_params": count_parameters(draft),
        "target_params": count_parameters(target),
        "flops_ratio": d_flops / t_flops,
    }
    say(
        f"draft: {info['draft_params'] / 1e6:.2f}M params, target {info['target_params'] / 1e6:.2f}M; "
        f"FLOPs/token ratio draft/target {info['flops_ratio']:.3f} "
        f"(2 x non-embedding params + head matmul)"
    )
    return info


def independent_loss_parts(tr, batch: Batch, on_policy: bool) -> list[TokenSum]:
    """The independent draft's one loss part: its logits against the teacher's signal."""
    dcfg, acc = tr.cfg.distill, tr.accelerator
    with acc.autocast():
        logits = tr.model(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (N, V)
        signal = teacher_signal(tr.teacher, batch)
    part = distill_loss(
        tr.loss_name,
        logits,
        signal,
        batch.labels,
        torch.ones_like(batch.labels, dtype=torch.bool),
        temperature=dcfg.temperature,
        beta=dcfg.beta,
        ce_weight=0.0 if on_policy else dcfg.ce_weight,  # no target tokens to imitate
    )
    return [part]


class IndependentTraining(KindTraining):
    """What the loop needs from the independent kind (KindTraining's methods)."""

    name = "independent"
    lora_resume: Path | None = None  # distill.lora_rank: the checkpoint whose adapters resume

    def draft_settings(self, cfg: Config) -> dict:
        """The draft keys that change what this kind trains (distill.checkpoint records them):
        an allow-list, so a key or section added for another kind leaves this kind's
        checkpoints' record, and so their resumption, untouched."""
        return {key: copy.deepcopy(getattr(cfg.draft, key)) for key in DRAFT_KEYS}

    def check_target(self, cfg: Config, target_config, target_tok) -> None:
        # a pretrained draft of another family; init.py checks the other keys as it builds
        check_pretrained_draft(cfg, target_tok)

    def reads_topk(self, cfg: Config, loss_name: str) -> bool:
        return loss_name != "ce" and cfg.distill.teacher == "offline"

    def teacher_name(self, cfg: Config, loss_name: str) -> str:
        return cfg.distill.teacher

    def needs_target_weights(self, cfg: Config, loss_name: str, resume) -> bool:
        return _needs_target_weights(cfg, loss_name, resume)

    def target_dtype(self, cfg: Config, device):
        return None  # target.dtype (models.load_target), the serving dtype: the draft copies it

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        """(draft, tokenizer, init description, extra meta): built fresh or resumed. With
        adapters (distill.lora_rank) a resume starts from the init's weights (checkpoint-0,
        which LoRA never changes); trainable_parameters then loads the adapters."""
        if resume is not None and cfg.distill.lora_rank:
            self.lora_resume, resume = resume, resume.parent / "checkpoint-0"
        draft, tok, init = load_draft(cfg, resume, target, target_tok, target_config, device)
        return draft, tok, init, {}

    def describe(self, draft, target_config, say) -> dict:
        return describe(draft, target_config, say)

    def training_modules(self, cfg: Config, loss_name: str, draft, target, num_ids: int, device):
        """(teacher or None, the module accelerate prepares)."""
        teacher = None
        if _uses_target(cfg, loss_name):
            # the online teacher scores whole batches: the target's batched dtype (bf16 where fast)
            target.requires_grad_(False).to(pick_batch_dtype(cfg.target, device))
            teacher = CompletionLogits(target.eval(), num_ids)
        return teacher, CompletionLogits(draft, num_ids)

    def learning_rate(self, cfg: Config) -> float:
        return cfg.distill.lr

    def trainable_parameters(self, cfg: Config, draft) -> list:
        dcfg = cfg.distill
        params = trainable_parameters(draft, dcfg.freeze_embeddings, dcfg.train_layers)
        if not dcfg.lora_rank:
            return params
        from draftsmith.distill import lora

        trained = [
            m for m in _decoder_layers(draft) if any(p.requires_grad for p in m.parameters())
        ]
        alpha = dcfg.lora_alpha or 2.0 * dcfg.lora_rank
        params = lora.add_lora(draft, trained, dcfg.lora_rank, alpha)
        if self.lora_resume is not None:
            from safetensors.torch import load_file

            lora.load_lora_state(draft, load_file(self.lora_resume / lora.LORA_FILE))
        return params

    def loss_weights(self, cfg: Config) -> list[float]:
        return [1.0]

    def token_counts(self, tr, batch: Batch) -> list[float]:
        return [float(batch.num_tokens)]

    def loss_parts(self, tr, batch: Batch, on_policy: bool) -> list[TokenSum]:
        return independent_loss_parts(tr, batch, on_policy)

    def model_writer(self, tr):
        """The checkpoint's model files (an HF model dir), written into a temp dir."""

        def write(path: Path) -> None:
            if tr.cfg.distill.lora_rank:  # merged weights: a plain HF dir; adapters beside
                from safetensors.torch import save_file

                from draftsmith.distill import lora

                tr.draft.save_pretrained(path, state_dict=lora.merged_state_dict(tr.draft))
                save_file(lora.lora_state_dict(tr.draft), path / lora.LORA_FILE)
            else:
                tr.draft.save_pretrained(path)
            tr.tokenizer.save_pretrained(path)

        return write
