"""Logits at completion positions only, the teacher signal, and on-policy samples.

The LM head of a 49k-vocab model dominates a small draft's cost, so the models
run their decoder body over the whole (B, T) batch but apply the head only to
the N positions that predict completion tokens: (N, H) @ (H, V) instead of
(B*T, H) @ (H, V), and no (B, T, V) tensor ever exists.

Teacher signals (cfg.distill.teacher):
- online: the target in memory, eval mode, no grad, one forward per micro-batch;
- offline: the top-k log-probs generate stored (`TopK`, see losses.py for the
  k+1-bucket approximation); no target in memory;
- on-policy (a share `on_policy_fraction` of steps, online only): the draft
  samples the completions at `on_policy_temperature` and the target scores
  them, as in GKD (Agarwal et al. 2024) and DistillSpec (Zhou et al. 2024).
"""

from __future__ import annotations

import contextlib
import random

import torch
from torch import Tensor, nn

from draftsmith.distill.batching import Batch, Example
from draftsmith.distill.losses import TopK


class CompletionLogits(nn.Module):
    """Wraps a causal LM; forward returns logits only where `loss_mask` is set: (N, V).

    V is `num_ids`, the tokenizer's ids: the rows past them (padding, draftsmith/vocab_rows.py)
    are cut here, for draft and target alike, so no loss ever sees them and the two
    sides have one width even when their row counts differ. This wrapper (not the bare
    LM) is what accelerate prepares, so DDP sees the forward that the loss
    differentiates.
    """

    def __init__(self, lm: nn.Module, num_ids: int | None = None):
        super().__init__()
        self.lm, self.num_ids = lm, num_ids

    def forward(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Tensor:
        body = getattr(self.lm, self.lm.base_model_prefix)
        hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm.get_output_embeddings()(hidden[loss_mask])  # (N, H) -> (N, rows)
        return logits[:, : self.num_ids]  # (N, V)


@torch.no_grad()
def teacher_signal(teacher: CompletionLogits | None, batch: Batch) -> Tensor | TopK | None:
    """The target's logits at the completion positions (online), or the stored top-k."""
    if teacher is None:
        return batch.topk  # offline (or None for plain CE)
    return teacher(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (N, V)


def is_on_policy_step(seed: int, step: int, fraction: float) -> bool:
    """Deterministic in (seed, step), so resumed runs and all processes agree."""
    if fraction <= 0:
        return False
    return random.Random(seed * 7919 + step).random() < fraction


def pure_sampling_config(temperature: float, max_new: int, pad_id: int, eos_id, num_ids, rows):
    """GenerationConfig: multinomial sampling from softmax(logits[:num_ids] / T), nothing else."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,  # transformers' global default would be 50
        top_p=1.0,
        max_new_tokens=max_new,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        suppress_tokens=list(range(num_ids, rows)) or None,  # padding rows (vocab_rows.py)
    )


@contextlib.contextmanager
def neutral_generation_config(model: nn.Module):
    """generate() fills every field a passed config leaves unset from model.generation_config
    (transformers 5), so a target's repetition_penalty, top_k/top_p, no_repeat_ngram_size or
    bad_words_ids would creep into the samples; swap in a blank one for the call."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


@torch.no_grad()
def sample_completions(
    draft: nn.Module,
    examples: list[Example],
    *,
    temperature: float,
    pad_id: int,
    eos_id: int | None,
    seed: int,
    device: torch.device,
    num_ids: int | None = None,
) -> list[Example]:
    """Replace each completion by the draft's own sample of at most the same length.

    Sampling is pure temperature sampling over the tokenizer's `num_ids` ids: softmax(logits
    / T), no top-k/top-p, and nothing from the draft's generation config (which is the
    target's: Qwen2.5-Instruct's carries repetition_penalty 1.05). A sample ends after EOS.
    """
    prompts = [ex.prompt_ids for ex in examples]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, p in enumerate(prompts):  # left-pad for generation
        input_ids[b, width - len(p) :] = torch.tensor(p)
        attention_mask[b, width - len(p) :] = 1
    max_new = max(len(ex.completion_ids) for ex in examples)
    rows = draft.get_output_embeddings().weight.shape[0]  # the logits' width
    config = pure_sampling_config(temperature, max_new, pad_id, eos_id, num_ids or rows, rows)
    was_training = draft.training
    draft.eval()
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        neutral_generation_config(draft),
    ):
        torch.manual_seed(seed)
        out = draft.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
        )
    draft.train(was_training)
    new = out[:, width:].tolist()
    samples = []
    for ex, toks in zip(examples, new):
        toks = toks[: len(ex.completion_ids)]
        if eos_id is not None and eos_id in toks:
            toks = toks[: toks.index(eos_id) + 1]
        samples.append(Example(ex.prompt_ids, toks or [eos_id if eos_id is not None else pad_id]))
    return samples
