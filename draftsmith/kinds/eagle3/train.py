"""Training the eagle3 kind: the target's features and teacher, the training-time-test loss.

The same batches as the independent draft (distill/batching.py: `prompt + completion[:-1]`,
right-padded; position s of loss_mask predicts a completion token, labels in loss_mask
order). The target runs ONE forward per micro-batch (no grad) and gives both what the
head reads and what it learns from:

    aux      (B, L, 3d)  its hidden states at the head's aux layers, every position
    teacher  (N, Vd)     its logits at the loss_mask positions, on the draft vocabulary
                         only (a softmax over them is the target's distribution restricted
                         and renormalised to the draft vocabulary: what the head can match)

The head's position t pairs g_t with x_{t+1} (eagle3.head_inputs) and at TTT step j
predicts x_{t+2+j}, the token target position s = t+1+j predicts: its teacher row is
loss_mask's row for s, and it is in the loss exactly when s is a loss_mask position
(`step_rows`). Every completion token is learnt at step 0 (the first one from the last
prompt pair), and at step j by the positions j earlier.

Loss: per TTT step the configured divergence (distill/losses.py) between the head and
that teacher, summed over the step's positions; the training loop divides each step's sum
by the global batch's count for that step and adds the steps, step j weighted
draft.eagle3.ttt_loss_decay**j (1: equal weights, as speculators' default
ttt_step_loss_decay 1.0; its loss is also a per-step token mean summed over steps). CE
(the CE twin, or ce_weight) uses the target's own tokens mapped to draft ids; a token
outside the draft vocabulary has no draft id and is left out of the CE (the share of
such tokens in the training data is printed and stored as draft_vocab_coverage).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import Tensor, nn

from draftsmith.config import Config
from draftsmith.distill.batching import Batch
from draftsmith.distill.checkpoint import read_meta
from draftsmith.distill.losses import TokenSum, cross_entropy, distill_loss
from draftsmith.errors import ConfigError
from draftsmith.kinds.base import KindTraining
from draftsmith.kinds.eagle3.config import eagle3_settings
from draftsmith.kinds.eagle3.export import load_eagle3, write_eagle3
from draftsmith.kinds.eagle3.head import (
    Eagle3Head,
    check_aux_layer_ids,
    default_aux_layer_ids,
    head_inputs,
    layer_config_from_target,
    select_aux_hidden,
    shift_left,
)
from draftsmith.kinds.eagle3.vocab import build_draft_vocab
from draftsmith.models import count_parameters, flops_per_token, pick_dtype, resolve_model
from draftsmith.vocab_rows import token_id_count


def batch_target_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The dtype of the target's batched forwards while the head trains: target.dtype.

    Not target.batch_dtype (the independent draft's online teacher uses it): the head
    shares the target's embedding module, so a bf16 target would also change the head's
    own inputs; that trade is not measured. This is the one place to switch it."""
    return pick_dtype(cfg.target.dtype, device)


# ----------------------------------------------------------------------------- the vocabulary


def completion_token_counts(dataset, rows: int, num_ids: int) -> Tensor:
    """(rows,) how often each target id occurs among the dataset's completion_ids.

    Ids from num_ids on (padding rows, draftsmith/vocab_rows.py) count -1: they rank below
    every real token, so the draft vocabulary takes them only when it is larger than the
    tokenizer (refused earlier by kinds.check_eagle3).
    """
    counts = torch.zeros(rows, dtype=torch.long)
    for chunk in dataset.select_columns(["completion_ids"]).iter(batch_size=1024):
        ids = [t for row in chunk["completion_ids"] for t in row]
        if ids:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=rows)[:rows]
    counts[num_ids:] = -1
    return counts


def build_head(cfg: Config, target, dataset, num_ids: int) -> tuple[Eagle3Head, str, float]:
    """A fresh head for `target` over the training data's most frequent completion tokens.

    Returns (head, description, coverage): the share of the training completion tokens
    inside the draft vocabulary.
    """
    e = eagle3_settings(cfg)
    rows = target.config.get_text_config().vocab_size
    counts = completion_token_counts(dataset, rows, num_ids)
    vocab = build_draft_vocab(counts, e.draft_vocab_size, rows)
    head = Eagle3Head.from_target(
        target, vocab, e.aux_layer_ids, e.norm_before_residual, e.lm_head_from_target
    )
    coverage = vocab_coverage(counts, vocab.t2d)
    desc = (
        f"eagle3 head: aux layers {head.aux_layer_ids}, draft vocabulary {vocab.size} "
        f"(covers {coverage:.1%} of the training completion tokens)"
    )
    return head, desc, coverage


def vocab_coverage(counts: Tensor, t2d: Tensor) -> float:
    real = counts.clamp(min=0)
    total = int(real.sum())
    return float(real[t2d].sum()) / total if total else 1.0


# ----------------------------------------------------------------------------- the target's side


@torch.no_grad()
def target_pass(
    target, batch: Batch, aux_layer_ids, draft_target_ids: Tensor, head_weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One target forward -> aux (B, L, 3d) and teacher (N, Vd) at the loss_mask positions.

    head_weight: the target's output rows of the draft vocabulary (Vd, d), precomputed
    (Eagle3Teacher); the full (N, V) logits are never formed.
    """
    body = getattr(target, target.base_model_prefix)
    out = body(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        output_hidden_states=True,
    )
    aux = select_aux_hidden(out.hidden_states, aux_layer_ids)  # (B, L, 3d)
    hidden = out.last_hidden_state[batch.loss_mask]  # (N, d), final norm applied
    lm_head = target.get_output_embeddings()
    if head_weight is None:
        # = vocab.target_logits_on_draft_vocab(lm_head(hidden), d2t)
        return aux, lm_head(hidden).index_select(-1, draft_target_ids.to(hidden.device))
    return aux, nn.functional.linear(hidden, head_weight)  # (N, Vd)


class Eagle3Teacher:
    """The target in eval mode, no grad: aux features and the draft-vocabulary teacher."""

    def __init__(self, target, head: Eagle3Head):
        target.requires_grad_(False)
        self.target = target.eval()
        self.aux_layer_ids = list(head.aux_layer_ids)
        ids = head.vocab.target_ids()
        lm_head = target.get_output_embeddings()
        if getattr(lm_head, "bias", None) is not None:  # Llama-family heads have none
            self.weight = None  # the full logits, then restricted
        else:
            self.weight = lm_head.weight.detach()[ids.to(lm_head.weight.device)]  # (Vd, d)
        self.draft_target_ids = ids

    def __call__(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return target_pass(
            self.target, batch, self.aux_layer_ids, self.draft_target_ids, self.weight
        )


# ----------------------------------------------------------------------------- the head's side


class HeadUnroll(nn.Module):
    """What accelerate prepares for the eagle3 kind: the head's training-time-test unroll.

    `lm` is the head (the name the trainer reads for either kind's trained module).
    """

    def __init__(self, head: Eagle3Head, steps: int, num_ids: int | None = None):
        super().__init__()
        self.lm, self.steps, self.num_ids = head, steps, num_ids

    def forward(self, aux: Tensor, input_ids: Tensor, attention_mask: Tensor) -> list[Tensor]:
        """The target's aux (B, L, 3d) and the batch's ids/mask (B, L) -> per step (B, L-1, Vd)."""
        ids, feats, mask = head_inputs(input_ids, aux, attention_mask)
        return [o.logits for o in self.lm.unroll(feats, ids, mask, self.steps)]


def teacher_rows(loss_mask: Tensor) -> Tensor:
    """(B, L) the row of each loss_mask position in loss_mask order (N rows), -1 elsewhere."""
    rows = loss_mask.flatten().long().cumsum(0).view_as(loss_mask) - 1
    return torch.where(loss_mask, rows, torch.full_like(rows, -1))


def step_rows(loss_mask: Tensor, step: int) -> Tensor:
    """(B, L-1) teacher row of head position t at TTT step j: target position t + 1 + j."""
    return shift_left(teacher_rows(loss_mask)[:, 1:], step, fill=-1)


def draft_ids_of(t2d: Tensor) -> Tensor:
    """(V,) the draft id of each target id, -1 outside the draft vocabulary."""
    ids = t2d.long().cumsum(0) - 1
    return torch.where(t2d, ids, torch.full_like(ids, -1))


def ttt_token_counts(loss_name: str, batch: Batch, steps: int, t2d: Tensor) -> list[float]:
    """Per TTT step, the tokens its loss sums over (known before any forward)."""
    out = []
    for j in range(steps):
        rows = step_rows(batch.loss_mask, j)
        rows = rows[rows >= 0]
        if loss_name == "ce":  # only tokens that have a draft id
            rows = rows[t2d.to(rows.device)[batch.labels[rows]]]
        out.append(float(rows.numel()))
    return out


def ttt_loss_parts(
    loss_name: str,
    step_logits: list[Tensor],
    teacher: Tensor,
    batch: Batch,
    t2d: Tensor,
    *,
    temperature: float = 1.0,
    beta: float = 0.5,
    ce_weight: float = 0.0,
) -> list[TokenSum]:
    """One TokenSum per TTT step: step_logits[j] (B, L-1, Vd) against teacher (N, Vd)."""
    draft_of = draft_ids_of(t2d.to(teacher.device))
    parts = []
    for j, logits in enumerate(step_logits):
        rows = step_rows(batch.loss_mask, j)  # (B, L-1)
        where = rows >= 0
        student = logits[where]  # (n_j, Vd)
        rows = rows[where]
        labels = draft_of[batch.labels[rows]]  # (n_j,) draft ids, -1 outside
        known = labels >= 0
        if loss_name == "ce":
            parts.append(cross_entropy(student, labels.clamp(min=0), known))
            continue
        part = distill_loss(
            loss_name,
            student,
            teacher[rows],
            labels.clamp(min=0),
            torch.ones_like(known),
            temperature=temperature,
            beta=beta,
        )
        if ce_weight > 0:
            ce = cross_entropy(student, labels.clamp(min=0), known)
            part = TokenSum(part.total + ce_weight * ce.total, part.count)
        parts.append(part)
    return parts


def trainable_parameters(head: Eagle3Head, train_lm_head: bool) -> list:
    if not train_lm_head:
        head.lm_head.weight.requires_grad_(False)
    return [p for p in head.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- checkpoints


def write_head(head: Eagle3Head, path: Path, target_config, verifier: str, k: int) -> None:
    """A checkpoint's model files: the speculators layout without the target's embeddings
    (the target supplies them when it is loaded: load_eagle3(path, target))."""
    write_eagle3(head, path, target_config, verifier, k, include_embeddings=False)


# ----------------------------------------------------------------------------- the loop's view


class Eagle3Training(KindTraining):
    """What the loop (distill/train.py) needs from the eagle3 kind (KindTraining's methods)."""

    name = "eagle3"

    def draft_settings(self, cfg: Config) -> dict:
        """The draft keys that change what the head trains (distill.checkpoint records them);
        include_embeddings is the export's business, not training's."""
        e = dataclasses.asdict(eagle3_settings(cfg))
        e.pop("include_embeddings")
        return {"dtype": cfg.draft.dtype, "eagle3": e}

    def check_target(self, cfg: Config, target_config, target_tok) -> None:
        """One ConfigError line for a target the configured head cannot be built on."""
        e, num_ids = eagle3_settings(cfg), token_id_count(target_tok)
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

    def reads_topk(self, cfg: Config, loss_name: str) -> bool:
        return False  # its teacher comes from the forward that gives it the hidden states

    def teacher_name(self, cfg: Config, loss_name: str) -> str:
        return "online"

    def needs_target_weights(self, cfg: Config, loss_name: str, resume) -> bool:
        return True  # it reads the target's hidden states, CE twin included

    def target_dtype(self, cfg: Config, device):
        return batch_target_dtype(cfg, device)

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        """(head, tokenizer, init description, extra meta): built fresh or resumed."""
        dtype = torch.float32 if cfg.draft.dtype == "auto" else getattr(torch, cfg.draft.dtype)
        num_ids = token_id_count(target_tok)
        rows = target_config.get_text_config().vocab_size
        counts = completion_token_counts(data.dataset, rows, num_ids)
        if resume is None:
            head, init, _ = build_head(cfg, target, data.dataset, num_ids)
        else:
            head, init = load_eagle3(resume, target), read_meta(resume)["init"]
        head = head.to(device=device, dtype=dtype).train()
        meta = {
            "aux_layer_ids": head.aux_layer_ids,
            "draft_vocab_size": head.vocab.size,
            "draft_vocab_coverage": vocab_coverage(counts, head.t2d.cpu()),
            "ttt_steps": eagle3_settings(cfg).ttt_steps,
        }
        return head, target_tok, init, meta

    def describe(self, head: Eagle3Head, target_config, say) -> dict:
        from transformers import AutoModelForCausalLM

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

    def training_modules(self, cfg: Config, loss_name: str, head, target, num_ids: int, device):
        """(teacher, the module accelerate prepares)."""
        return Eagle3Teacher(target, head), HeadUnroll(
            head, eagle3_settings(cfg).ttt_steps, num_ids
        )

    def learning_rate(self, cfg: Config) -> float:
        return eagle3_settings(cfg).lr or cfg.distill.lr

    def trainable_parameters(self, cfg: Config, head: Eagle3Head) -> list:
        return trainable_parameters(head, eagle3_settings(cfg).train_lm_head)

    def loss_weights(self, cfg: Config) -> list[float]:
        e = eagle3_settings(cfg)
        return [e.ttt_loss_decay**j for j in range(e.ttt_steps)]

    def token_counts(self, tr, batch: Batch) -> list[float]:
        return ttt_token_counts(
            tr.loss_name, batch, eagle3_settings(tr.cfg).ttt_steps, tr.draft.t2d
        )

    def loss_parts(self, tr, batch: Batch, on_policy: bool) -> list[TokenSum]:
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
        """The checkpoint's model files (write_head), written into a temp dir."""
        verifier = resolve_model(tr.cfg.target.model, "target.model")
        k = tr.cfg.evaluate.num_speculative_tokens

        def write(path: Path) -> None:
            write_head(tr.draft, path, tr.target_config, verifier, k)

        return write
