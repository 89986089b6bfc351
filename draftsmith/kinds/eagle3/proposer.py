"""The eagle3 kind in the engine: an Eagle3Head proposing from the target's own hidden states.

Alignment (draftsmith/kinds/eagle3/head.py). Head pair i reads the target's aux features g_i (it has
read x_0..x_i) and the token x_{i+1}; its output predicts x_{i+2}. The engine's invariant
is that with n committed tokens the target's cache holds x_0..x_{n-1}'s first n-1 (the
next verify pass feeds seq[-1] + drafts). The head matches it: its pairs 0..n-2 (n-1
pairs, the same count) are in its cache or pending, and the last one predicts x_n, the
first draft of the round. So:

    prefill  the target's prefill gives g_0..g_{P-2}: pairs 0..P-3 go into the head's cache
             (untimed, like the independent draft's prefill), pair P-2 is pending;
    propose  step the pending pairs (target features) -> d_1, then k-1 speculative steps,
             each reading the head's own previous hidden state and the token it proposed;
    verify   the target's pass over [x_{n-1}, d_1..d_k] returns g_{n-1}..g_{n+k-1};
    crop     the speculative entries go (they were computed from the head's own states,
             not the target's), back to the verified pairs;
    observe  the accepted drafts and the target's token x_n..x_{n+a} with g_{n-1}..g_{n+a-1}
             become the next pending pairs (a + 1 of them): again n' - 1 pairs for n' tokens.

A round costs k head forwards (one over the pending pairs, k - 1 speculative), as an
independent draft costs k. A one-token prompt has no g_0 yet: the first round proposes
nothing (a plain target step), after which pair 0 is pending.

q for rejection sampling is the head's distribution over its draft vocabulary placed on
the target ids (draft_vocab.draft_logits_to_target), then the same temperature / top-k /
top-p rule as the target: a token outside the draft vocabulary has q = 0 and is never
proposed; the target's own token at a rejection can be any token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.clock import Step
from draftsmith.evaluate.engine import (
    DecodeResult,
    DraftContext,
    Proposer,
    SpeculativeDecoder,
    argmax_ids,
    record_draft_forward,
    timed,
)
from draftsmith.evaluate.teacher_forced import (
    COUNT_KEYS,
    KindReplay,
    counts_result,
    relative_margin,
)
from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.kinds.eagle3.head import Eagle3Head
from draftsmith.kinds.eagle3.vocab import draft_logits_to_target
from draftsmith.kv_cache import crop_cache


class Eagle3Proposer(Proposer):
    """Drives an Eagle3Head (its embeddings attached: the target's) for the engine."""

    def __init__(self, head: Eagle3Head, margins: list[float] | None = None):
        self.module = head
        self.aux_layer_ids = list(head.aux_layer_ids)
        self.target_ids = head.vocab.target_ids()  # (Vd,) target id of each draft id
        self.margins = margins  # greedy: each draft's relative top-2 logit gap (the replay's)

    def prefill(self, ctx: DraftContext, prompt: list[int], target_hidden) -> None:
        self.ctx = ctx
        self.cache = self.module.new_cache()
        self.verified = 0  # cache entries computed from the target's features
        # draft ids whose target id is past the tokenizer's ids (padding rows) never win
        allowed = self.target_ids < ctx.vocab  # (Vd,)
        self.allowed = None if bool(allowed.all()) else allowed.to(ctx.device)
        self.pending_ids, self.pending_aux = [], None
        if len(prompt) < 2:
            return
        ids, aux = prompt[1:], target_hidden  # pair i = (g_i, x_{i+1}), i = 0..P-2
        if len(ids) > 1:
            self._step_verified(ids[:-1], aux[:-1])
        self.pending_ids, self.pending_aux = ids[-1:], aux[-1:]

    def _step_verified(self, ids: list[int], aux: torch.Tensor):
        """Append verified pairs (tokens (m,), features (m, 3d)) -> last logits, hidden."""
        t = torch.tensor([ids], device=self.ctx.device)  # (1, m)
        out = self.module.step(self.cache, t, aux_hidden=aux[None])
        self.verified += len(ids)
        return out

    def propose(self, seq: list[int], k: int, gen, res: DecodeResult):
        ctx = self.ctx
        if not self.pending_ids:
            return torch.empty(0, dtype=torch.long, device=ctx.device), None
        ids, aux = self.pending_ids, self.pending_aux
        (logits, hidden), dt = timed(lambda: self._step_verified(ids, aux), ctx.sync_device)
        record_draft_forward(res, dt, len(ids))
        self.pending_ids, self.pending_aux = [], None
        tokens, probs = [], []
        for i in range(k):
            tok, q = self._select(logits[0], gen)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            if i == k - 1 or not self._keep_drafting(logits[0], tok, q):
                break
            (logits, hidden), dt = timed(
                lambda tok=tok, hidden=hidden: self.module.step(
                    self.cache, tok.view(1, 1), prev_hidden=hidden[:, None]
                ),
                ctx.sync_device,
            )
            record_draft_forward(res, dt, 1)
        return torch.cat(tokens), (torch.stack(probs) if probs else None)  # (k,), (k, V)

    def _select(self, logits: torch.Tensor, gen):
        """logits (Vd,) -> (target id (1,), q (V,) or None)."""
        ctx = self.ctx
        if ctx.sampling.greedy:  # the argmax in draft space is the argmax over target ids
            if self.allowed is not None:
                logits = logits.masked_fill(~self.allowed, float("-inf"))
            if self.margins is not None:
                self.margins.append(relative_margin(logits[None]))
            return self.target_ids[argmax_ids(logits, keepdim=True)], None
        rows = self.module.t2d.numel()
        scores = draft_logits_to_target(logits, self.module.d2t, rows)[: ctx.vocab]  # (V,)
        return ctx.select(scores, gen)

    def _keep_drafting(self, logits: torch.Tensor, tok: torch.Tensor, q) -> bool:
        """DraftContext.keep_drafting in the head's own vocabulary (greedy: the argmax's
        softmax over the draft ids it may propose; sampling: q of the target id)."""
        if q is not None:
            return self.ctx.keep_drafting(q, tok[0], q)
        if self.allowed is not None:
            logits = logits.masked_fill(~self.allowed, float("-inf"))
        return self.ctx.keep_drafting(logits, argmax_ids(logits), None)

    def crop(self, keep: int) -> None:
        crop_cache(self.cache, min(self.verified, keep))

    def observe(self, new: list[int], target_hidden) -> None:
        # appended, not replaced: a round that proposed nothing left its pairs pending
        aux = [self.pending_aux] if self.pending_ids else []
        self.pending_ids = self.pending_ids + list(new)  # (m,)
        self.pending_aux = torch.cat(aux + [target_hidden])  # (m, 3d)


# ----------------------------------------------------------------------------- teacher-forced


@torch.inference_mode()
def target_aux_hidden(target, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
    """One target forward over `ids` -> the aux features (T, 3d) the engine would pass."""
    device = next(target.parameters()).device
    out = target(
        input_ids=torch.tensor([list(ids)], device=device),
        logits_to_keep=1,
        output_hidden_states=True,
    )
    return torch.cat([out.hidden_states[i][0] for i in layer_ids], dim=-1)


@torch.inference_mode()
def replay_greedy(
    head: Eagle3Head,
    target,
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    k: int,
    budget: int,
    vocab: int | None = None,
) -> DecodeResult:
    """The engine's greedy counts for `head`, given the target's own greedy output `tokens`.

    Greedy rounds only ever extend the target's output, so its features come from ONE
    target forward over prompt + output instead of a verify pass per round; the head then
    runs round by round exactly as in the engine (same pending pairs, same speculative
    steps, same crops): its later drafts read its own states, so one pass cannot replace
    them. Costs the head's steps plus one target forward; no timings.
    """
    return _replay(head, target, prompt_ids, tokens, k, budget, vocab)[0]


@torch.inference_mode()
def _replay(head, target, prompt_ids, tokens, k, budget, vocab) -> tuple[DecodeResult, list]:
    """replay_greedy's result and the head's relative top-2 logit gap at each draft."""
    prompt, tokens = list(prompt_ids), list(tokens)
    res = DecodeResult(tokens=[], k=k, accepted_at=[0] * k, reached_at=[0] * k)
    margins: list[float] = []
    if not tokens:
        return res, margins
    seq = prompt + tokens
    aux = target_aux_hidden(target, seq[:-1], head.aux_layer_ids)  # (N-1, 3d): g_0..g_{N-2}
    device = next(target.parameters()).device
    ctx = DraftContext(
        vocab or target.config.get_text_config().vocab_size,
        SpeculativeDecoder(target).sampling,  # greedy
        device,
        None,
    )
    prop = Eagle3Proposer(head, margins)
    P, i = len(prompt), 0  # i: output tokens committed so far
    with cpu_few_row_linear(head):  # the engine's kernels for the head's steps
        prop.prefill(ctx, prompt, aux[: P - 1])
        while i < len(tokens):
            k_round = min(k, budget - i - 1)
            drafted = (
                prop.propose(seq[: P + i], k_round, None, res)[0].tolist() if k_round > 0 else []
            )
            acc = 0
            while acc < len(drafted) and i + acc < len(tokens) and drafted[acc] == tokens[i + acc]:
                acc += 1
            new = tokens[i : i + acc + 1]
            SpeculativeDecoder._record_round(res, len(drafted), acc, new)
            res.target_forwards += 1
            res.tokens.extend(new)
            n = P + i  # committed before the round; the round's pairs are n-1 .. n+acc-1
            i += acc + 1
            if i < len(tokens):
                prop.crop(n + acc)
                prop.observe(new, aux[n - 1 : n + acc])
    return res, margins


# ----------------------------------------------------------------------------- the kind's replay
# (teacher_forced.KindReplay; draftsmith/kinds/ registers it as the eagle3 kind's)


def teacher_forced_pass(head, load_target, prompt_ids, tokens, vocab, k, budget) -> dict:
    """The engine's greedy counts at k (replay_greedy) and the smallest margin of its drafts."""
    res, margins = _replay(head, load_target(), prompt_ids, tokens, k, budget, vocab)
    counts = {key: getattr(res, key) for key in (*COUNT_KEYS, "draft_forwards", "outcome")}
    return {"counts": counts, "margin": min(margins) if margins else None}


def replay_result(record: dict, tokens, k: int, budget: int) -> dict:
    return counts_result(tokens, k, record["counts"])


@torch.inference_mode()
def draft_step(head: Eagle3Head, load_target, context: Sequence[int], token: int) -> Step:
    """One speculative 1-token head step (k - 1 of a round's k) on a cache holding the
    context's verified pairs, cropped back after each run."""
    target = load_target()
    aux = target_aux_hidden(target, context, head.aux_layer_ids)  # (C, 3d): g_0..g_{C-1}
    ids = torch.tensor([list(context[1:])], device=head.device)  # (1, C-1): x_1..x_{C-1}
    cache = head.new_cache()
    _, hidden = head.step(cache, ids, aux_hidden=aux[None, :-1])  # (1, d)
    keep = cache.get_seq_length()
    tok, prev = torch.tensor([[token]], device=head.device), hidden[:, None]  # (1, 1), (1, 1, d)

    def run() -> None:
        head.step(cache, tok, prev_hidden=prev)

    return run, lambda: crop_cache(cache, keep)


EAGLE3_REPLAY = KindReplay(teacher_forced_pass, replay_result, True, draft_step)
