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

Second-choice leaves (`second_choice_min`): the verify forward also carries the draft's
second choice beside drafted tokens where the draft itself rates it likely to be emitted
(second_choice_leaves), each a leaf that sees only its own prefix (tree_inputs, a 4D
attention mask). Greedy: where the top choice misses and the target's token is that leaf,
the round emits it and the leaf row's own next token: one token more from the same forward.
Sampling: the drafted token is judged as in a chain; where it is rejected and a leaf stands
there, the leaf is emitted with its probability under the rejection's residual law, and
then a token drawn from the leaf row (sample_with_leaf), so the output law stays the
target's. The emitted leaf's keys and values move beside its prefix before the crop
(kv_cache.move_entry). Alpha still counts the drafted tokens only; the leaves show in tokens
per target forward.

With no draft (or k = 0) the same loop is the target-only baseline: one 1-token target
forward per emitted token, same caches, same sampling code, so speed comparisons are fair.

The draft side is a `Proposer` (one per kind of draft, draftsmith/kinds/): prefill,
propose (tokens and q over the target vocabulary), crop, observe. CausalLMProposer is
the causal-LM draft described above (any draft that is a model of its own, baselines
included). A kind whose draft reads the target's hidden states (a head on the target)
says so (Proposer.aux_layer_ids): the engine then asks the target's prefill and verify
passes for those layers' states and hands them over. The invariant every
proposer keeps: with n committed tokens the target's cache holds n-1 and the first round
feeds seq[-1] + drafts.

Timing: every draft and target forward is timed on its own (perf_counter; cuda synchronize),
split into single-token forwards and multi-token ones, so the draft cost ratio
c = mean draft 1-token forward / mean target 1-token forward can be measured.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.decode_step import decode_logits
from draftsmith.evaluate.metrics import token_outcomes
from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.kv_cache import cache_kwarg, crop_cache, move_entry, new_cache
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
    # per emitted token: 1 an accepted draft, 0 the target's token where its draft was judged
    # and rejected, -1 no draft judged there (a bonus token, target-only decoding)
    outcome: list[int] = field(default_factory=list)
    target_forwards: int = 0  # decode/verify forwards (the prompt prefill not counted)
    draft_forwards: int = 0
    draft_1tok_time: float = 0.0  # summed seconds of single-token draft forwards
    draft_1tok_n: int = 0
    target_1tok_time: float = 0.0  # summed seconds of single-token target forwards
    target_1tok_n: int = 0
    target_verify_time: float = 0.0  # summed seconds of (k+1)-token verify forwards
    target_verify_n: int = 0
    second_proposed: int = 0  # the draft's second choices put to the target as leaves
    second_accepted: int = 0  # of those, emitted (the target's token where its top choice missed)
    # the prompt's prefills: paid once per request, outside the per-round cost model
    target_prefill_time: float = 0.0
    draft_prefill_time: float = 0.0
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
    n_acc = accepted_prefix(p, q, drafted, generator)
    dist = next_token_law(p, q, n_acc, drafted.numel())
    return n_acc, int(torch.multinomial(dist, 1, generator=generator))


def accepted_prefix(
    p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor, generator: torch.Generator
) -> int:
    """How many drafts pass: d_i is kept with probability min(1, p_i(d_i)/q_i(d_i)), in order."""
    k = drafted.numel()
    if not k:
        return 0
    rows = torch.arange(k, device=p.device)
    p_d, q_d = p[rows, drafted], q[rows, drafted]  # (k,), q_d > 0: d was sampled from q
    u = torch.rand(k, generator=generator, device=p.device)
    accept = u * q_d < p_d  # u < p/q, i.e. accept with probability min(1, p/q)
    return int(accept.long().cumprod(0).sum())


def next_token_law(p: torch.Tensor, q: torch.Tensor, n_acc: int, k: int) -> torch.Tensor:
    """(V,) the law of the token after n_acc accepted drafts: normalize(max(0, p - q)) at a
    rejection, p_{k+1} after a full accept."""
    if n_acc == k:
        return p[k]
    residual = (p[n_acc] - q[n_acc]).clamp_min(0.0)
    total = residual.sum()
    # total == 0 only when p == q at this row, where rejection has probability 0 anyway
    return residual / total if total > 0 else p[n_acc]


def sample_with_leaf(
    law: torch.Tensor, alt: int, leaf_p: torch.Tensor, generator: torch.Generator
) -> list[int]:
    """The tokens a rejection emits when a second candidate `alt` stands at that position:
    [alt, a draw from leaf_p] with probability law(alt), else [a draw from law without alt].

    Exact: the first token is law-distributed either way (alt with law(alt), any other t with
    (1 - law(alt)) x law(t) / (1 - law(alt))), and after alt the next token is drawn from the
    target's own distribution after the prefix + alt, which is the leaf row's `leaf_p`. The
    candidate is the draft's choice, fixed before this draw, so it may be any token.
    """
    rest = law.clone()
    rest[alt] = 0.0
    hit = float(torch.rand(1, generator=generator, device=law.device)) < float(law[alt])
    if hit or float(rest.sum()) <= 0.0:  # all of law on alt: the draw cannot miss it
        return [alt, int(torch.multinomial(leaf_p, 1, generator=generator))]
    return [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]


def argmax_ids(scores: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """scores (..., V) -> the argmax over the last dim, taken in fp32: torch's CPU argmax over
    bf16 measured ~3x slower than a cast and an argmax over the 151,936-id vocab (0.55 ms
    against 0.19 per row), and the index is the same (bf16 -> fp32 is exact; the first
    maximum wins either way)."""
    return scores.float().argmax(-1, keepdim=keepdim)


def greedy_accept(target_logits: torch.Tensor, drafted: torch.Tensor) -> tuple[int, int]:
    """target_logits (k+1, V), drafted (k,): longest agreeing prefix, then the target's token."""
    best = argmax_ids(target_logits)  # (k+1,)
    k = drafted.numel()
    n_acc = int((best[:k] == drafted).long().cumprod(0).sum()) if k else 0
    return n_acc, int(best[n_acc])


# ----------------------------------------------------------------------------- leaves


def second_choice_leaves(runner_up: torch.Tensor, min_gain: float) -> list[tuple[int, int]]:
    """(j, token): the draft's second choice for drafted token j (0-based), wherever the
    draft's own estimate of it being emitted, reach_j x p2_j with reach_j the product of its
    top probabilities before j, is at least `min_gain`. runner_up (k', 3) rows of top_two()
    (sampling: of sampled_runner_up(), the drafted token's q for the top probability and the
    most likely other token as the second choice).

    A verify row costs the target little (the 1.5B's bf16 forward measured 219 ms over 2 rows,
    263 over 6, here), and misses concentrate where the draft hesitates: there its second
    choice is often the target's.
    """
    leaves, reach = [], 1.0
    for j, (p1, alt, p2) in enumerate(runner_up.tolist()):
        if reach * p2 >= min_gain:
            leaves.append((j, int(alt)))
        reach *= p1
    return leaves


def tree_inputs(past: int, k: int, depths: list[int], device) -> dict:
    """attention_mask (1, 1, q, past + q) and position_ids (1, q) for one verify forward over
    [seq[-1], d_1..d_k, one leaf per depth j in `depths`] on a cache of `past` tokens.

    The first k+1 rows are the usual causal chain. A leaf stands in for d_{j+1} (drafted
    index j): it sits at d_{j+1}'s position and sees the cache, seq[-1], d_1..d_j and itself,
    so its logits are the target's next-token distribution after that alternative prefix.
    """
    q = k + 1 + len(depths)
    mask = torch.zeros(q, past + q, dtype=torch.bool, device=device)
    mask[:, :past] = True
    mask[: k + 1, past : past + k + 1] = torch.ones(k + 1, k + 1, device=device).tril().bool()
    positions = list(range(past, past + k + 1))
    for i, j in enumerate(depths):
        row = k + 1 + i
        mask[row, past : past + j + 1] = True  # seq[-1], d_1..d_j
        mask[row, past + row] = True  # itself
        positions.append(past + j + 1)
    return {
        "attention_mask": mask.view(1, 1, q, past + q),
        "position_ids": torch.tensor([positions], device=device),
    }


# ----------------------------------------------------------------------------- forwards


def timed(fn: Callable, sync_device: torch.device | None):
    """(fn(), seconds); with a CUDA device the clock waits for the kernels on both ends."""
    if sync_device is not None:
        torch.cuda.synchronize(sync_device)
    start = time.perf_counter()
    out = fn()
    if sync_device is not None:
        torch.cuda.synchronize(sync_device)
    return out, time.perf_counter() - start


@dataclass
class DraftContext:
    """What a proposer needs from the decoder driving it (handed over at every prefill)."""

    vocab: int  # token ids that may be proposed: 0..vocab-1 (the tokenizer's ids)
    sampling: SamplingConfig
    device: torch.device
    sync_device: torch.device | None  # CUDA: synchronize around timed forwards
    # dynamic lookahead: a round stops drafting after a token the draft gave less than this
    # probability (None: always k). The rule reads only the draft's own distribution, so
    # rejection sampling stays exact (tests/test_specdec.py checks the joint law).
    stop_below: float | None = None
    # keep, per drafted token, its probability and the draft's second choice with its
    # probability (Proposer.runner_up), for the engine's second-choice leaves
    runner_up: bool = False

    def select(self, scores: torch.Tensor, gen: torch.Generator):
        """scores (V,) over target ids -> (token (1,), q (V,) or None when greedy)."""
        if self.sampling.greedy:
            return argmax_ids(scores, keepdim=True), None  # stays on device, no sync
        q = sampling_probs(scores, self.sampling)  # (V,)
        return torch.multinomial(q, 1, generator=gen), q

    def keep_drafting(self, scores: torch.Tensor, index: torch.Tensor, q, prob=None) -> bool:
        """Whether the round drafts on after the token at `index` of `scores` (the draft's
        logits in its own id space): its probability is `prob` when the caller has it
        already, q[index] when sampling, else the softmax of the scores there; True when no
        threshold is set."""
        if self.stop_below is None:
            return True
        if prob is None:
            prob = q[index] if q is not None else torch.softmax(scores.float(), -1)[index]
        return bool(prob >= self.stop_below)


def top_two(scores: torch.Tensor) -> torch.Tensor:
    """scores (V,) -> (3,) floats: the draft's probability of its top token, its second
    choice's id and that one's probability (ids below 2^24 are exact in float32)."""
    probs, ids = torch.softmax(scores.float(), -1).topk(2)
    return torch.stack([probs[0], ids[1].float(), probs[1]])


def sampled_runner_up(q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """q (V,) the draft's law, token (1,) its draw -> (3,) as top_two(): q of the draw, the
    most likely other token (the leaf candidate) and its q."""
    probs, ids = q.topk(2)
    alt = torch.where(ids[0] == token[0], 1, 0)  # the top one, unless it was drawn
    return torch.stack([q[token[0]], ids[alt].float(), probs[alt]])


def record_draft_forward(res: DecodeResult, seconds: float, n_tokens: int) -> None:
    """Count one draft forward; single-token ones feed the cost ratio c."""
    res.draft_forwards += 1
    if n_tokens == 1:
        res.draft_1tok_time += seconds
        res.draft_1tok_n += 1


# ----------------------------------------------------------------------------- proposers


class Proposer(ABC):
    """One kind of draft as the engine drives it: propose k tokens, learn what was verified.

    Per prompt: `prefill` once (after the target's prefill), then each round `propose`,
    the target's verify pass, and, unless the round ended decoding, `crop` and `observe`.
    A kind that reads the target's hidden states names their layers in `aux_layer_ids`
    (ids into a transformers forward's hidden_states: the input of decoder layer i); the
    engine then hands it those states, concatenated (T, len(ids) x d), for the prompt
    prefill and for each verify pass.
    """

    module: torch.nn.Module  # the draft's weights (timing scope, few-row matmuls)
    aux_layer_ids: Sequence[int] | None = None
    # (k', 3) after a propose with ctx.runner_up: per drafted token top_two() of the draft's
    # scores there (sampling: sampled_runner_up() of its q); None for a proposer that keeps
    # none (the engine then verifies a chain)
    runner_up: torch.Tensor | None = None

    @abstractmethod
    def prefill(self, ctx: DraftContext, prompt: list[int], target_hidden) -> None:
        """Read the prompt (and its target states, for aux readers) into the draft's cache."""

    @abstractmethod
    def propose(self, seq: list[int], k: int, gen, res: DecodeResult):
        """Up to k draft tokens (k',) and their q (k', V) (None when greedy)."""

    @abstractmethod
    def crop(self, keep: int) -> None:
        """The target's cache now holds `keep` tokens: drop what was not verified."""

    def observe(self, new: list[int], target_hidden) -> None:  # noqa: B027 (optional hook)
        """The round's emitted tokens and, for aux readers, the verify pass's states of
        [seq[-1], accepted drafts] (one row per emitted token). A draft that reads only its
        own tokens learns them at the next propose: nothing to do here by default."""


class CausalLMProposer(Proposer):
    """A causal LM with its own KV cache: feed the tokens it lacks, then draft one at a time."""

    def __init__(self, model):
        self.module = model
        self._kw = cache_kwarg(model)
        self.cache = None

    def prefill(self, ctx: DraftContext, prompt: list[int], target_hidden=None) -> None:
        """The cache takes all prompt tokens but the last (the first round feeds that one)."""
        self.ctx, self.cache = ctx, new_cache(self.module)
        if len(prompt) > 1:
            ids = torch.tensor([prompt[:-1]], device=ctx.device)
            self.module(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._kw: self.cache})

    def propose(self, seq: list[int], k: int, gen, res: DecodeResult):
        ctx = self.ctx
        ids = torch.tensor([seq[self.cache.get_seq_length() :]], device=ctx.device)  # (1, 1 or 2)
        tokens, probs, runner_up = [], [], []
        for _ in range(k):
            logits, dt = timed(lambda ids=ids: self._logits(ids), ctx.sync_device)
            record_draft_forward(res, dt, ids.shape[1])
            tok, q = ctx.select(logits, gen)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            prob = None
            if ctx.runner_up:  # the token's probability, and the leaf candidate beside it
                runner_up.append(top_two(logits) if q is None else sampled_runner_up(q, tok))
                prob = runner_up[-1][0]
            if not ctx.keep_drafting(logits, tok[0], q, prob):
                break
            ids = tok.view(1, 1)
        self.runner_up = torch.stack(runner_up) if runner_up else None  # (k', 3)
        return torch.cat(tokens), (torch.stack(probs) if probs else None)  # (k',), (k', V)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        # the fast step where the model has one (draftsmith/decode_step.py), else its forward
        return decode_logits(self.module, ids, self.cache)[: self.ctx.vocab]  # (V,)

    def crop(self, keep: int) -> None:
        # after a full accept the cache lacks d_k: it rides along with the next round's input
        crop_cache(self.cache, min(self.cache.get_seq_length(), keep))


def as_proposer(draft) -> Proposer | None:
    """A Proposer as is; a bare causal LM drafts with its own KV cache; None stays None."""
    if draft is None or isinstance(draft, Proposer):
        return draft
    return CausalLMProposer(draft)


# ----------------------------------------------------------------------------- the engine


class SpeculativeDecoder:
    """Speculative decoding of one prompt at a time; `draft=None` is the target-only baseline.

    `draft`: a Proposer (draftsmith.kinds makes one for each kind of draft) or a causal LM,
    run by CausalLMProposer.
    """

    def __init__(
        self,
        target,
        draft=None,
        *,
        k: int = 4,
        sampling: SamplingConfig | None = None,
        eos_ids: Iterable[int] = (),
        verify_fn: VerifyFn | None = None,
        linear_forms=True,
        num_ids: int | None = None,
        stop_below: float | None = None,
        second_choice_min: float | None = None,
    ):
        self.target = target
        self.stop_below = stop_below  # dynamic lookahead (DraftContext.stop_below)
        # verify the draft's second choices as leaves where second_choice_leaves() rates
        # them at least this (None: a chain, as transformers' assisted generation)
        self.second_choice_min = second_choice_min
        self.proposer = as_proposer(draft)
        self.k = k if self.proposer is not None else 0
        self.sampling = sampling or SamplingConfig()
        self.eos_ids = set(eos_ids)
        # the chain's rule (tests inject wrong ones); a sampled round with leaves runs
        # accepted_prefix and sample_with_leaf instead (_sample_leaves)
        self.verify_fn = verify_fn or rejection_sample
        # on a CPU a verify pass (k+1 rows) through F.linear can cost far more than a
        # one-token forward; as W @ x^T, or on packed weights, it may cost about one
        # (fast_linear.py): {width: form}, or True/False/widths for W @ x^T. Only this
        # decoder's target and draft are switched.
        self.linear_forms = linear_forms
        self.device = next(target.parameters()).device
        self._sync = self.device if self.device.type == "cuda" else None
        self._target_kw = cache_kwarg(target)
        self._aux = None if self.proposer is None else self.proposer.aux_layer_ids
        # Only the tokenizer's ids (`num_ids`, draftsmith.vocab.token_id_count) are ever
        # proposed, sampled or emitted: both models' logits are cut to them, so padding rows
        # (either model's, whatever their weights) never win, and a draft with another row
        # count than the target still gives p and q of one width. Without num_ids: the
        # smaller row count of the two (every token id is below both).
        models = [target] + ([self.proposer.module] if self.proposer is not None else [])
        self.vocab = num_ids or min(m.config.get_text_config().vocab_size for m in models)

    @property
    def draft(self):
        return None if self.proposer is None else self.proposer.module

    # -- target forwards --------------------------------------------------------------------

    def _target(self, cache, ids: torch.Tensor, n_logits: int, tree: dict | None = None):
        """ids (1, T) -> logits (n_logits, V), the aux hidden states (T, 3d) the proposer
        reads (None when it reads none), and seconds. `tree`: tree_inputs() for a verify
        pass with leaves."""

        def run():
            out = self.target(
                input_ids=ids,
                use_cache=True,
                logits_to_keep=n_logits,
                output_hidden_states=self._aux is not None,
                **{self._target_kw: cache},
                **(tree or {}),
            )
            hidden = None
            if self._aux is not None:
                hidden = torch.cat([out.hidden_states[i][0] for i in self._aux], dim=-1)
            return out.logits[0, :, : self.vocab], hidden

        (logits, hidden), dt = timed(run, self._sync)
        return logits, hidden, dt

    def _prefill(self, cache, prompt: list[int]):
        """The target's cache takes all prompt tokens but the last (the first round feeds
        that one); returns their aux hidden states (P-1, 3d) when the proposer reads them."""
        if len(prompt) <= 1:
            return None
        ids = torch.tensor([prompt[:-1]], device=self.device)
        return self._target(cache, ids, 1)[1]

    # -- one round ----------------------------------------------------------------------------

    def _leaves(self, k: int) -> list[tuple[int, int]]:
        """This round's second-choice leaves (with second_choice_min, from a proposer that
        kept its runner-up choices); none otherwise."""
        runner_up = None if self.proposer is None else self.proposer.runner_up
        if self.second_choice_min is None or not k or runner_up is None:
            return []
        return second_choice_leaves(runner_up[:k], self.second_choice_min)

    def _verify(self, seq, cache, drafted, q, gen, res: DecodeResult, leaves=()):
        """One target forward over [seq[-1], drafted..., leaves...] -> (num_accepted drafts,
        the tokens after them, hidden, the row of the leaf that was emitted or None)."""
        k, past = drafted.numel(), cache.get_seq_length()
        last = torch.tensor([seq[-1]], device=self.device)
        alts = torch.tensor([t for _, t in leaves], dtype=torch.long, device=self.device)
        ids = torch.cat([last, drafted, alts]).view(1, -1)
        tree = tree_inputs(past, k, [j for j, _ in leaves], self.device) if leaves else None
        logits, hidden, dt = self._target(cache, ids, ids.shape[1], tree)  # (q, V), (q, 3d)
        res.target_forwards += 1
        if k:
            res.target_verify_time += dt
            res.target_verify_n += 1
        else:
            res.target_1tok_time += dt
            res.target_1tok_n += 1
        res.second_proposed += len(leaves)
        if self.sampling.greedy:
            n_acc, nxt = greedy_accept(logits[: k + 1], drafted)
            for i, (j, alt) in enumerate(leaves):
                if j == n_acc and alt == nxt:  # the top choice missed where the second hit
                    res.second_accepted += 1
                    row = k + 1 + i
                    return n_acc, [nxt, int(argmax_ids(logits[row]))], hidden, row
            return n_acc, [nxt], hidden, None
        p = sampling_probs(logits, self.sampling)  # (k+1+leaves, V)
        if q is None:
            q = p.new_zeros((0, p.shape[-1]))
        if not leaves:
            n_acc, nxt = self.verify_fn(p[: k + 1], q, drafted, gen)
            return n_acc, [nxt], hidden, None
        return self._sample_leaves(p, q, drafted, gen, res, leaves, hidden)

    def _sample_leaves(self, p, q, drafted, gen, res: DecodeResult, leaves, hidden):
        """Rejection sampling over the chain, where the rejection's position carries a leaf:
        its residual law decides between the leaf and the rest (sample_with_leaf)."""
        k = drafted.numel()
        n_acc = accepted_prefix(p, q, drafted, gen)
        law = next_token_law(p, q, n_acc, k)
        for i, (j, alt) in enumerate(leaves):
            if j == n_acc:
                row = k + 1 + i
                tail = sample_with_leaf(law, alt, p[row], gen)
                if len(tail) == 1:
                    return n_acc, tail, hidden, None
                res.second_accepted += 1
                return n_acc, tail, hidden, row
        return n_acc, [int(torch.multinomial(law, 1, generator=gen))], hidden, None

    def _emit(self, seq, drafted, n_acc: int, tail: list[int], budget: int):
        """Tokens this round adds, cut after an EOS or at the budget; and whether to stop."""
        new = drafted[:n_acc].tolist() + tail
        for i, tok in enumerate(new):
            if tok in self.eos_ids:
                return new[: i + 1], True
        return new[:budget], len(new) >= budget

    # -- the loop -----------------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> DecodeResult:
        scope = cpu_few_row_linear(self.target, self.draft, enabled=self.linear_forms)
        with torch.inference_mode(), scope:
            return self._generate(prompt_ids, max_new_tokens, seed)

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> DecodeResult:
        start = time.perf_counter()
        prompt = list(prompt_ids)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        res = DecodeResult(tokens=[], k=self.k, accepted_at=[0] * self.k, reached_at=[0] * self.k)
        t_cache = new_cache(self.target)
        hidden, res.target_prefill_time = timed(lambda: self._prefill(t_cache, prompt), self._sync)
        prop = self.proposer
        if prop is not None:
            ctx = DraftContext(self.vocab, self.sampling, self.device, self._sync, self.stop_below)
            ctx.runner_up = self.second_choice_min is not None
            _, res.draft_prefill_time = timed(lambda: prop.prefill(ctx, prompt, hidden), self._sync)

        seq = prompt  # committed tokens; the target's cache holds seq[:-1]
        done = False
        while not done:
            budget = max_new_tokens - len(res.tokens)
            # never draft past the budget: a round emits at most k_round + 1 tokens
            k_round = min(self.k, budget - 1)
            drafted, q = torch.empty(0, dtype=torch.long, device=self.device), None
            if k_round > 0:
                drafted, q = prop.propose(seq, k_round, gen, res)
            k_round = drafted.numel()  # a proposer may have fewer (a head: no state yet)
            n_target = t_cache.get_seq_length()
            leaves = self._leaves(k_round)
            n_acc, tail, hidden, leaf_row = self._verify(seq, t_cache, drafted, q, gen, res, leaves)
            new, done = self._emit(seq, drafted, n_acc, tail, budget)
            self._record_round(res, k_round, n_acc, new)
            seq = seq + new
            res.tokens.extend(new)
            if not done:
                keep = n_target + 1 + n_acc
                if leaf_row is not None:  # the emitted leaf's keys and values join the prefix
                    move_entry(t_cache, n_target + leaf_row, keep)
                    keep += 1
                crop_cache(t_cache, keep)
                if prop is not None:  # the draft keeps what it drafted and the target took
                    prop.crop(n_target + 1 + n_acc)
                    prop.observe(new, None if hidden is None else hidden[: n_acc + 1])
        res.stop_reason = "eos" if res.tokens and res.tokens[-1] in self.eos_ids else "length"
        res.wall_time = time.perf_counter() - start
        return res

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
        outcome = token_outcomes(emitted_drafts, reached, len(new))
        # an emitted second-choice leaf is the target's token where the top choice missed
        # (outcome 0, alpha unchanged); the token after it is the leaf row's own, a bonus
        res.outcome.extend(outcome + [-1] * (len(new) - len(outcome)))
