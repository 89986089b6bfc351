"""Training batches: length-bucketed, right-padded, with the loss only on completion tokens.

A training sequence is `prompt + completion[:-1]`: position t predicts token t+1,
so the C completion tokens are predicted by the last C positions (the last
prompt token predicts the first completion token) and the final completion
token never needs to be an input.

`distill.batch_size` is the GLOBAL batch: sequences per optimizer step, split
into `grad_accum_steps x num_processes` equal micro-batches. The batch plan is a
pure function of (seed, step), so every process knows the whole global batch
without talking to the others, a resumed run continues at the exact data
position, and 1 or N processes see the same sequences per step.

No wasted padding: the epoch's shuffled order is cut into chunks of
`_BUCKET_BATCHES` global batches, each chunk is sorted by length and cut into
global batches (then shuffled again), and each global batch is split into
contiguous micro-batches of the length-sorted sequences, so a micro-batch holds
sequences of similar length and is padded only to its own longest one.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from draftsmith.distill.losses import TopK
from draftsmith.errors import ConfigError, DraftsmithError

_BUCKET_BATCHES = 16


@dataclass
class Example:
    prompt_ids: list[int]
    completion_ids: list[int]
    topk_ids: list[list[int]] | None = None  # (C, k), aligned with completion_ids
    topk_logprobs: list[list[float]] | None = None


@dataclass
class Batch:
    input_ids: Tensor  # (B, T) right-padded
    attention_mask: Tensor  # (B, T)
    loss_mask: Tensor  # (B, T) bool: positions that predict a completion token
    labels: Tensor  # (N,) the completion tokens, in loss_mask order (row-major)
    topk: TopK | None  # (N, k) the offline teacher, same order

    @property
    def num_tokens(self) -> int:
        return int(self.labels.numel())

    def to(self, device: torch.device) -> Batch:
        topk = None if self.topk is None else TopK(*(x.to(device) for x in self.topk))
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            self.labels.to(device),
            topk,
        )


class TrainData:
    """The generate stage's dataset, truncated to max_seq_len, read row by row on demand."""

    def __init__(self, dataset, max_seq_len: int | None = None, need_topk: bool = False):
        if need_topk and "topk_ids" not in dataset.column_names:
            raise DraftsmithError(
                "distill.teacher: 'offline' needs topk_ids/topk_logprobs in the dataset; "
                "regenerate with data.topk_logprobs > 0"
            )
        self.dataset = dataset
        self.max_seq_len = max_seq_len
        self.need_topk = need_topk
        p_lens = [len(x) for x in dataset["prompt_ids"]]
        c_lens = [len(x) for x in dataset["completion_ids"]]
        keep = [self._completion_len(p, c) for p, c in zip(p_lens, c_lens)]
        self.rows = [i for i, c in enumerate(keep) if c > 0]  # rows with a token to learn
        self.lengths = [p_lens[i] + keep[i] - 1 for i in self.rows]  # input length per row
        self.dropped = len(p_lens) - len(self.rows)
        if not self.rows:
            raise DraftsmithError("distill: no training sequence has a completion token to learn")

    def _completion_len(self, p: int, c: int) -> int:
        if self.max_seq_len is None:
            return c
        return max(0, min(c, self.max_seq_len - p))

    def __len__(self) -> int:
        return len(self.rows)

    def split_prompts(self, n: int, seed: int) -> tuple[TrainData, TrainData]:
        """(training, held out): `n` prompts drawn by `seed` go to the second, with all their
        samples, so no completion of a held-out prompt is ever trained on. Prompts are told
        apart by their token ids, which every sample of one prompt shares."""
        prompts = self.dataset["prompt_ids"]
        key = [tuple(prompts[r]) for r in self.rows]  # per kept row
        distinct = sorted(set(key))
        if n >= len(distinct):
            raise ConfigError(
                f"distill.heldout_prompts: {n} would leave no training prompt (the data has "
                f"{len(distinct)} distinct prompts with a completion token to learn)"
            )
        held = set(random.Random(seed).sample(distinct, n))
        return (
            self._subset([i for i, k in enumerate(key) if k not in held]),
            self._subset([i for i, k in enumerate(key) if k in held]),
        )

    def _subset(self, positions: list[int]) -> TrainData:
        """The same dataset, reading only the kept rows at `positions`."""
        sub = copy.copy(self)
        sub.rows = [self.rows[i] for i in positions]
        sub.lengths = [self.lengths[i] for i in positions]
        return sub

    def examples(self, idx: list[int]) -> list[Example]:
        rows = self.dataset[[self.rows[i] for i in idx]]
        out = []
        for j, i in enumerate(idx):
            n = self.lengths[i] + 1 - len(rows["prompt_ids"][j])  # completion tokens kept
            ex = Example(rows["prompt_ids"][j], rows["completion_ids"][j][:n])
            if self.need_topk:
                ex.topk_ids = rows["topk_ids"][j][:n]
                ex.topk_logprobs = rows["topk_logprobs"][j][:n]
            out.append(ex)
        return out


def plan_epoch(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's global batches (lists of row indices, each sorted by length)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * _BUCKET_BATCHES
    ordered = []
    for i in range(0, len(order), chunk):
        ordered += sorted(order[i : i + chunk], key=lambda r: lengths[r])
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    batches = [b for b in batches if len(b) == batch_size]  # drop the ragged tail
    rng.shuffle(batches)
    return batches


class BatchPlan:
    """Global batch for any step, deterministically (epochs are re-planned on demand)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        if len(lengths) < batch_size:
            raise ConfigError(
                f"distill.batch_size: {batch_size} is more than the {len(lengths)} training "
                "sequences; lower it or generate more data"
            )
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.steps_per_epoch = len(lengths) // batch_size
        self._epoch, self._batches = -1, []

    def global_batch(self, step: int) -> list[int]:
        """Row indices of optimizer step `step` (0-based)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = (
                epoch,
                plan_epoch(self.lengths, self.batch_size, self.seed, epoch),
            )
        return self._batches[i]


def micro_batches(global_batch: list[int], accum: int, rank: int, world: int) -> list[list[int]]:
    """This process's `accum` micro-batches: contiguous slices of the length-sorted batch."""
    size = len(global_batch) // (accum * world)
    slices = [global_batch[i * size : (i + 1) * size] for i in range(accum * world)]
    return [slices[j * world + rank] for j in range(accum)]


def check_divisible(batch_size: int, accum: int, world: int) -> None:
    if batch_size % (accum * world):
        raise ConfigError(
            f"distill.batch_size: {batch_size} must be divisible by grad_accum_steps x processes "
            f"= {accum} x {world}"
        )


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest sequence; mark the positions that predict completion tokens."""
    seqs = [ex.prompt_ids + ex.completion_ids[:-1] for ex in examples]
    T = max(len(s) for s in seqs)
    B = len(seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    for b, (ex, s) in enumerate(zip(examples, seqs)):
        input_ids[b, : len(s)] = torch.tensor(s)
        attention_mask[b, : len(s)] = 1
        loss_mask[b, len(ex.prompt_ids) - 1 : len(s)] = True
    labels = torch.tensor([t for ex in examples for t in ex.completion_ids], dtype=torch.long)
    topk = None
    if examples[0].topk_ids is not None:
        ids = torch.tensor([row for ex in examples for row in ex.topk_ids], dtype=torch.long)
        lps = torch.tensor([row for ex in examples for row in ex.topk_logprobs])
        topk = TopK(ids, lps.float())  # (N, k)
    return Batch(input_ids, attention_mask, loss_mask, labels, topk)
