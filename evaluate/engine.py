"""A real speculative decoder (batch 1) on Hugging Face causal LMs with KV caches.

One round, with the committed sequence `seq` of length n (both caches hold at most n-1 tokens):

    draft:  feed the tokens its cache lacks, then propose d1..dk one token at a time
            (its own KV cache; greedy argmax or a sample from its filtered distribution q)
    target: ONE forward over [seq[-1], d1..dk] -> k+1 next-token distributions p_1..p_{k+1}
    accept: greedy   - the longest prefix of d that equals the target's argmax, then the
                       target's own token at the first mismatch (or the bonus token);
            sampling - exact rejection sampling (Leviathan et al. 2023, Chen et al. 2023):
                       accept d_i with probability min(1, p_i(d_i)/q_i(d_i)); at the first
                       rejection sample from normalize(max(0, p_i - q_i)); when all k pass,
                       sample a bonus token from p_{k+1}.
    crop:   both caches back to the accepted prefix (the target keeps n + accepted tokens;
            after a full accept the draft lacks d_k and is fed it with the next round's input).

With no draft (or k = 0) the same loop is the target-only baseline: one 1-token target
forward per emitted token, same caches, same sampling code, so speed comparisons are fair.

Timing: every draft and target forward is timed on its own (perf_counter; cuda synchronize),
split into single-token forwards and multi-token ones, so the draft cost ratio
c = mean draft 1-token forward / mean target 1-token forward can be measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.kv_cache import cache_kwarg, crop_cache, new_cache
from draftsmith.sampling import SamplingConfig, sampling_probs

# verify_fn(p (k+1, V), q (k, V), drafted (k,), generator) -> (num_accepted, next_token)
VerifyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], tuple[int, int]]


@dataclass
class DecodeResult:
    """What one prompt's decoding produced and cost. Counts are per prompt."""

    tokens: list[int]  # the new tokens (EOS included when it was emitted)
    k: int  # speculative tokens per round asked for (0: target only)
    proposed: int = 0  # draft tokens put to the target
    accepted: int = 0  # of those, emitted as output
    accepted_at: list[int] = field(default_factory=list)  # (k,) rounds accepting position i
    reached_at: list[int] = field(default_factory=list)  # (k,) rounds verifying position i
    target_forwards: int = 0  # decode/verify forwards (the prompt prefill not counted)
    draft_forwards: int = 0
    draft_1tok_time: float = 0.0  # summed seconds of single-token draft forwards
    draft_1tok_n: int = 0
    target_1tok_time: float = 0.0  # summed seconds of single-token target forwards
    target_1tok_n: int = 0
    target_verify_time: float = 0.0  # summed seconds of (k+1)-token verify forwards
    target_verify_n: int = 0
    wall_time: float = 0.0  # whole call, prefill included
    stop_reason: str = "length"  # "eos" | "length"

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- sampling


def rejection_sample(
    p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor, generator: torch.Generator
) -> tuple[int, int]:
    """Exact speculative sampling. p (k+1, V) target, q (k, V) draft, drafted (k,) ids.

    The emitted tokens d[:n] + [next] are distributed exactly as k+1 draws from the target.
    """
    k = drafted.numel()
    n_acc = 0
    if k:
        rows = torch.arange(k, device=p.device)
        p_d, q_d = p[rows, drafted], q[rows, drafted]  # (k,), q_d > 0: d was sampled from q
        u = torch.rand(k, generator=generator, device=p.device)
        accept = u * q_d < p_d  # u < p/q, i.e. accept with probability min(1, p/q)
        n_acc = int(accept.long().cumprod(0).sum())
    if n_acc < k:
        residual = (p[n_acc] - q[n_acc]).clamp_min(0.0)
        total = residual.sum()
        # total == 0 only when p == q at this row, where rejection has probability 0 anyway
        dist = residual / total if total > 0 else p[n_acc]
    else:
        dist = p[k]
    return n_acc, int(torch.multinomial(dist, 1, generator=generator))


def greedy_accept(target_logits: torch.Tensor, drafted: torch.Tensor) -> tuple[int, int]:
    """target_logits (k+1, V), drafted (k,): longest agreeing prefix, then the target's token."""
    best = target_logits.argmax(-1)  # (k+1,)
    k = drafted.numel()
    n_acc = int((best[:k] == drafted).long().cumprod(0).sum()) if k else 0
    return n_acc, int(best[n_acc])


# ----------------------------------------------------------------------------- the engine


class SpeculativeDecoder:
    """Speculative decoding of one prompt at a time; `draft=None` is the target-only baseline."""

    def __init__(
        self,
        target,
        draft=None,
        *,
        k: int = 4,
        sampling: SamplingConfig | None = None,
        eos_ids: Iterable[int] = (),
        verify_fn: VerifyFn | None = None,
        few_row_linear: bool = True,
        num_ids: int | None = None,
    ):
        self.target, self.draft = target, draft
        self.k = k if draft is not None else 0
        self.sampling = sampling or SamplingConfig()
        self.eos_ids = set(eos_ids)
        self.verify_fn = verify_fn or rejection_sample
        # on a CPU a verify pass (k+1 rows) through F.linear can cost far more than a
        # one-token forward; as W @ x^T it costs about one (fast_linear.py). Only this
        # decoder's target and draft are switched, one-row forwards are unaffected.
        self.few_row_linear = few_row_linear
        self.device = next(target.parameters()).device
        self._sync = self.device.type == "cuda"
        self._target_kw = cache_kwarg(target)
        self._draft_kw = cache_kwarg(draft) if draft is not None else None
        # Only the tokenizer's ids (`num_ids`, draftsmith.vocab.token_id_count) are ever
        # proposed, sampled or emitted: both models' logits are cut to them, so padding rows
        # (either model's, whatever their weights) never win, and a draft with another row
        # count than the target still gives p and q of one width. Without num_ids: the
        # smaller row count of the two (every token id is below both).
        rows = [m.config.get_text_config().vocab_size for m in (target, draft) if m is not None]
        self.vocab = num_ids or min(rows)

    # -- forwards ---------------------------------------------------------------------------

    def _forward(self, model, kw: str, cache, ids: torch.Tensor, n_logits: int):
        """ids (1, T) -> logits (n_logits, V) for the last n_logits positions, and seconds."""
        if self._sync:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=n_logits, **{kw: cache})
        logits = out.logits[0, :, : self.vocab]
        if self._sync:
            torch.cuda.synchronize(self.device)
        return logits, time.perf_counter() - start

    def _prefill(self, model, kw: str, cache, prompt: list[int]) -> None:
        """Fill the cache with all prompt tokens but the last (the first round feeds that one)."""
        if len(prompt) > 1:
            ids = torch.tensor([prompt[:-1]], device=self.device)
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})

    # -- one round ----------------------------------------------------------------------------

    def _propose(self, seq, cache, k: int, gen, res: DecodeResult):
        """Draft k tokens autoregressively. Returns drafted (k,) and q (k, V) (None if greedy)."""
        ids = torch.tensor([seq[cache.get_seq_length() :]], device=self.device)  # (1, 1 or 2)
        tokens, probs = [], []
        for _ in range(k):
            logits, dt = self._forward(self.draft, self._draft_kw, cache, ids, 1)
            if ids.shape[1] == 1:
                res.draft_1tok_time += dt
                res.draft_1tok_n += 1
            res.draft_forwards += 1
            if self.sampling.greedy:
                tok = logits[-1].argmax(-1, keepdim=True)  # (1,) stays on device, no sync
            else:
                q = sampling_probs(logits[-1], self.sampling)  # (V,)
                tok = torch.multinomial(q, 1, generator=gen)
                probs.append(q)
            tokens.append(tok)
            ids = tok.view(1, 1)
        drafted = torch.cat(tokens)  # (k,)
        return drafted, (torch.stack(probs) if probs else None)

    def _verify(self, seq, cache, drafted, q, gen, res: DecodeResult) -> tuple[int, int]:
        """One target forward over [seq[-1], drafted...]; returns (num_accepted, next token)."""
        k = drafted.numel()
        last = torch.tensor([seq[-1]], device=self.device)
        ids = torch.cat([last, drafted]).view(1, k + 1)
        logits, dt = self._forward(self.target, self._target_kw, cache, ids, k + 1)  # (k+1, V)
        res.target_forwards += 1
        if k:
            res.target_verify_time += dt
            res.target_verify_n += 1
        else:
            res.target_1tok_time += dt
            res.target_1tok_n += 1
        if self.sampling.greedy:
            return greedy_accept(logits, drafted)
        p = sampling_probs(logits, self.sampling)  # (k+1, V)
        if q is None:
            q = p.new_zeros((0, p.shape[-1]))
        return self.verify_fn(p, q, drafted, gen)

    def _emit(self, seq, drafted, n_acc: int, nxt: int, budget: int) -> tuple[list[int], bool]:
        """Tokens this round adds, cut after an EOS or at the budget; and whether to stop."""
        new = drafted[:n_acc].tolist() + [nxt]
        for i, tok in enumerate(new):
            if tok in self.eos_ids:
                return new[: i + 1], True
        return new[:budget], len(new) >= budget

    # -- the loop -----------------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> DecodeResult:
        scope = cpu_few_row_linear(self.target, self.draft, enabled=self.few_row_linear)
        with torch.inference_mode(), scope:
            return self._generate(prompt_ids, max_new_tokens, seed)

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> DecodeResult:
        start = time.perf_counter()
        prompt = list(prompt_ids)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        res = DecodeResult(tokens=[], k=self.k, accepted_at=[0] * self.k, reached_at=[0] * self.k)
        t_cache = new_cache(self.target)
        self._prefill(self.target, self._target_kw, t_cache, prompt)
        d_cache = None
        if self.draft is not None:
            d_cache = new_cache(self.draft)
            self._prefill(self.draft, self._draft_kw, d_cache, prompt)

        seq = prompt  # committed tokens; the caches hold a prefix of seq[:-1]
        done = False
        while not done:
            budget = max_new_tokens - len(res.tokens)
            # never draft past the budget: a round emits at most k_round + 1 tokens
            k_round = min(self.k, budget - 1)
            if k_round > 0:
                drafted, q = self._propose(seq, d_cache, k_round, gen, res)
            else:
                drafted, q = torch.empty(0, dtype=torch.long, device=self.device), None
            n_target = t_cache.get_seq_length()
            n_acc, nxt = self._verify(seq, t_cache, drafted, q, gen, res)
            new, done = self._emit(seq, drafted, n_acc, nxt, budget)
            self._record_round(res, k_round, n_acc, new)
            seq = seq + new
            res.tokens.extend(new)
            if not done:
                self._crop(t_cache, n_target + 1 + n_acc)
                if d_cache is not None:
                    self._crop(d_cache, min(d_cache.get_seq_length(), n_target + 1 + n_acc))
        res.stop_reason = "eos" if res.tokens and res.tokens[-1] in self.eos_ids else "length"
        res.wall_time = time.perf_counter() - start
        return res

    _crop = staticmethod(crop_cache)

    @staticmethod
    def _record_round(res: DecodeResult, k_round: int, n_acc: int, new: list[int]) -> None:
        """Acceptance counts for one round, counting only draft tokens that were emitted."""
        emitted_drafts = min(n_acc, len(new))
        cut_inside_drafts = len(new) <= n_acc  # an EOS among the accepted drafts ended it
        reached = emitted_drafts if cut_inside_drafts else min(emitted_drafts + 1, k_round)
        res.proposed += k_round
        res.accepted += emitted_drafts
        for i in range(reached):
            res.reached_at[i] += 1
        for i in range(emitted_drafts):
            res.accepted_at[i] += 1
