"""The `transformers` backend: batched `model.generate` with left padding, bucketed by length.

Prompts are sorted by length before batching so each batch pads little; the
results come back in the caller's order. Top-k teacher log-probs come from the
same forward passes that generate (`output_logits=True`: the raw logits, before
temperature/top-p warpers), log-softmaxed at temperature 1 -- no second pass.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import GenerationConfig

from draftsmith.config import DataConfig
from draftsmith.data.completion import Completion, cut_at_eos, eos_ids_of


def length_buckets(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (stable sort, so deterministic)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


def generation_config(dcfg: DataConfig, pad_id: int, eos_ids: set[int]) -> GenerationConfig:
    sample = dcfg.temperature > 0
    kw = dict(temperature=dcfg.temperature, top_p=dcfg.top_p, top_k=dcfg.top_k) if sample else {}
    return GenerationConfig(
        max_new_tokens=dcfg.max_new_tokens,
        do_sample=sample,
        num_return_sequences=dcfg.n,
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids),
        output_logits=dcfg.topk_logprobs > 0,
        return_dict_in_generate=True,
        **kw,
    )


def topk_from_logits(logits: tuple[torch.Tensor, ...], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step raw logits [(N, V)] * S -> (ids, logprobs), both (N, S, k), at temperature 1."""
    ids, vals = [], []
    for step in logits:  # one step at a time: never hold (N, S, V) log-probs
        v, i = torch.log_softmax(step.float(), dim=-1).topk(k, dim=-1)  # (N, k)
        ids.append(i)
        vals.append(v)
    return torch.stack(ids, 1).cpu(), torch.stack(vals, 1).cpu()


class HFBackend:
    """Generates for a list of prompt-id lists; `n` completions per prompt."""

    def __init__(self, model, tokenizer, dcfg: DataConfig):
        self.model, self.dcfg = model, dcfg
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = eos_ids_of(tokenizer, model.generation_config)
        self.gen_cfg = generation_config(dcfg, self.pad_id, self.eos_ids)

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], seed: int) -> list[list[Completion]]:
        """One padded batch -> per prompt, its n completions."""
        ids, mask = left_pad(prompts, self.pad_id)
        torch.manual_seed(seed)  # sampling is reproducible per batch, so a resume repeats it
        out = self.model.generate(
            input_ids=ids.to(self.model.device),
            attention_mask=mask.to(self.model.device),
            generation_config=self.gen_cfg,
        )
        new = out.sequences[:, ids.shape[1] :].cpu()  # (B*n, S)
        k = self.dcfg.topk_logprobs
        top_ids, top_lp = topk_from_logits(out.logits, k) if k else (None, None)
        rows = []
        for r in range(new.shape[0]):
            length, reason = cut_at_eos(new[r].tolist(), self.eos_ids)
            c = Completion(new[r, :length].tolist(), reason)
            if k:
                c.topk_ids = top_ids[r, :length].tolist()
                c.topk_logprobs = top_lp[r, :length].tolist()
            rows.append(c)
        n = self.dcfg.n
        return [rows[i * n : (i + 1) * n] for i in range(len(prompts))]

    def generate(
        self,
        prompts: list[list[int]],
        seed: int,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> list[list[Completion]]:
        """All prompts, bucketed by length; `on_batch(prompts_done, new_tokens)` after each batch."""
        per_batch = max(1, self.dcfg.batch_size // self.dcfg.n)  # batch_size counts sequences
        results: list[list[Completion] | None] = [None] * len(prompts)
        for b, idx in enumerate(length_buckets([len(p) for p in prompts], per_batch)):
            got = self.generate_batch([prompts[i] for i in idx], seed=seed * 1_000_003 + b)
            for i, comps in zip(idx, got):
                results[i] = comps
            if on_batch:
                on_batch(len(idx), sum(len(c.token_ids) for cs in got for c in cs))
        return results
