"""Speculative decoding is lossless: greedy equals the target's own greedy decoding, and
sampling draws from exactly the target's distribution (a wrong sampler fails the same test)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from transformers import LlamaForCausalLM

from draftsmith.evaluate import engine
from draftsmith.evaluate.engine import (
    SamplingConfig,
    SpeculativeDecoder,
    rejection_sample,
    sampling_probs,
    second_choice_leaves,
    tree_inputs,
)
from draftsmith.evaluate.metrics import greedy_rounds
from draftsmith.kinds.independent.export import fixed_k_assistant
from draftsmith.kv_cache import cache_kwarg, new_cache
from draftsmith.models import tiny_llama_config

# float64 removes kernel noise (a (k+1)-token forward vs 1-token forwards can flip a near-tied
# argmax in fp32), so a mismatch here is an algorithm bug, never rounding.
DTYPE = torch.float64


def tiny_target(seed: int, vocab: int = 32, layers: int = 3):
    """A random float64 Llama of `layers` layers (untied head), seeded."""
    torch.manual_seed(seed)
    cfg = tiny_llama_config(
        vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).to(DTYPE).eval()


def tiny_pair(seed: int, vocab: int = 32, noise: float = 0.1, layers: int = 2):
    """A random target and a draft = the target with weight noise (noise 0: a perfect draft)."""
    target = tiny_target(seed, vocab, layers)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return target, draft


def hf_greedy(model, prompt, max_new, eos):
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 8),
    noise=st.sampled_from([0.0, 0.05, 0.3, 2.0]),
    prompt=st.lists(st.integers(3, 31), min_size=1, max_size=6),
    max_new=st.integers(1, 20),
    eos_at=st.integers(0, 15),
)
def test_greedy_speculative_equals_target_greedy(seed, k, noise, prompt, max_new, eos_at):
    target, draft = tiny_pair(seed, noise=noise)
    plain = SpeculativeDecoder(target).generate(prompt, max_new).tokens
    # an EOS in the middle of a block: declare a token the target emits at position eos_at
    eos = [plain[min(eos_at, len(plain) - 1)]]
    ref = SpeculativeDecoder(target, eos_ids=eos).generate(prompt, max_new).tokens
    assert ref[-1] == eos[0] and ref.count(eos[0]) == 1
    spec = SpeculativeDecoder(target, draft, k=k, eos_ids=eos).generate(prompt, max_new)
    assert spec.tokens == ref
    assert ref == hf_greedy(target, prompt, max_new, eos)
    assert spec.accepted <= spec.proposed
    assert spec.target_forwards <= len(ref)
    if noise == 0.0:  # a perfect draft: every verified token accepted
        assert spec.accepted_at == spec.reached_at


def test_full_accept_feeds_the_missing_draft_token():
    """With a perfect draft, each round emits k+1 tokens: the draft must catch up on d_k."""
    target, draft = tiny_pair(1, noise=0.0)
    spec = SpeculativeDecoder(target, draft, k=4).generate([5, 6, 7], 25)
    assert spec.tokens == SpeculativeDecoder(target).generate([5, 6, 7], 25).tokens
    assert spec.target_forwards == 5 and spec.accepted == spec.proposed == 20
    assert spec.draft_forwards == 20  # k per round; the catch-up token rides along


def test_greedy_equals_transformers_assisted_generation():
    target, draft = tiny_pair(7, noise=0.3)
    draft.generation_config.update(**fixed_k_assistant(3))  # k=3 every round, like the engine
    for prompt in ([4, 9, 12], [20], [3, 3, 8, 30, 11]):
        spec = SpeculativeDecoder(target, draft, k=3, eos_ids=[2]).generate(prompt, 16).tokens
        out = target.generate(
            torch.tensor([prompt]),
            assistant_model=draft,
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=0,
            num_assistant_tokens=3,
            num_assistant_tokens_schedule="constant",
        )
        assert spec == out[0, len(prompt) :].tolist()


# ----------------------------------------------------------------------------- sampling


def _always_accept(p, q, drafted, generator):
    """WRONG: keeps every draft token, i.e. samples the draft's distribution."""
    k = drafted.numel()
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def _no_residual(p, q, drafted, generator):
    """WRONG: on rejection samples from p instead of normalize(max(0, p - q))."""
    k = drafted.numel()
    u = torch.rand(k, generator=generator)
    rows = torch.arange(k)
    n = int((u * q[rows, drafted] < p[rows, drafted]).long().cumprod(0).sum())
    return n, int(torch.multinomial(p[n], 1, generator=generator))


def joint_pvalue(decoder, prompt: list[int], expected: dict, n: int = 1000) -> float:
    """Chi-square p-value of the first two new tokens of n seeded decodes against the exact
    joint law `expected` (seeds 0..n-1: deterministic, not flaky)."""
    return joint_pvalues(decoder, prompt, expected, (n,))[-1]


def joint_pvalues(decoder, prompt: list[int], expected: dict, looks, stop_below=None) -> list:
    """joint_pvalue at each n of `looks` (increasing), over one run of seeds 0..max(looks)-1;
    stops after the first look whose p-value is below `stop_below`."""
    counts: dict = {}
    out, drawn = [], 0
    for n in looks:
        for seed in range(drawn, n):
            toks = tuple(decoder.generate(prompt, 3, seed=seed).tokens[:2])
            counts[toks] = counts.get(toks, 0) + 1
        drawn = n
        out.append(_chi_square_p(counts, expected, n))
        if stop_below is not None and out[-1] < stop_below:
            break
    return out


def rejects(decoder, prompt: list[int], expected: dict) -> bool:
    """A wrong sampler fails the joint-law test: rejected at ALPHA after 300 draws, or else
    after the 1,000 a correct sampler is tested on (the gross errors need no more than 300;
    `_no_residual` on the peaky pair needs the 1,000)."""
    return joint_pvalues(decoder, prompt, expected, (300, 1000), stop_below=ALPHA)[-1] < ALPHA


def _chi_square_p(counts: dict, expected_probs: dict, n: int) -> float:
    """Pearson chi-square goodness of fit; cells expected < 5 are pooled into one.

    A draw in a cell of probability 0 is impossible under the null: p-value 0.
    """
    if any(expected_probs.get(cell, 0.0) == 0.0 for cell in counts):
        return 0.0
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for cell, prob in expected_probs.items():
        if prob * n < 5:
            pool_o, pool_e = pool_o + counts.get(cell, 0), pool_e + prob * n
        else:
            obs.append(counts.get(cell, 0))
            exp.append(prob * n)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)  # float rounding of the exact probabilities
    return stats.chisquare(obs, [e * scale for e in exp]).pvalue


def test_rejection_sample_matches_target_distribution():
    """The rule itself on fixed p, q (k=1): first emitted token ~ p exactly."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.1, 0.1, 0.1, 0.2, 0.5]])
    n = 4000
    for fn, should_pass in (
        (rejection_sample, True),
        (_always_accept, False),
        (_no_residual, False),
    ):
        counts: dict = {}
        for _ in range(n):
            d = torch.multinomial(q[0], 1, generator=gen)
            acc, nxt = fn(p, q, d, gen)
            first = int(d) if acc else nxt
            counts[first] = counts.get(first, 0) + 1
        pval = _chi_square_p(counts, {i: float(v) for i, v in enumerate(p[0])}, n)
        assert (pval > 1e-3) == should_pass, (fn.__name__, pval)


ALPHA = 1e-3  # significance; with fixed seeds the outcome is deterministic


def _exact_joint(target, prompt, sampling):
    """P(first two new tokens) under the target with the same filtering: sum over the chain."""
    with torch.no_grad():
        logits = target(torch.tensor([prompt])).logits[0, -1]
        p1 = sampling_probs(logits, sampling)
        vocab = p1.numel()
        batch = torch.tensor([prompt + [t] for t in range(vocab)])
        p2 = sampling_probs(target(batch).logits[:, -1], sampling)  # (V, V)
    return {(a, b): float(p1[a] * p2[a, b]) for a, b in itertools.product(range(vocab), repeat=2)}


# (sampling, whether the wrong samplers are run too): plain and filtered sampling
JOINT_LAW_CASES = [
    (SamplingConfig(temperature=1.0), True),
    (SamplingConfig(temperature=0.8, top_k=5, top_p=0.9), False),
]


def _peaky_pair():
    """vocab 8: a target and an independent draft, heads scaled so p and q differ clearly."""
    target, _ = tiny_pair(3, vocab=8, noise=0.0, layers=1)
    draft, _ = tiny_pair(4, vocab=8, noise=0.0, layers=1)
    with torch.no_grad():
        for m in (target, draft):
            m.lm_head.weight.mul_(4.0)
    return target, draft


@pytest.mark.parametrize("sampling,check_wrong", JOINT_LAW_CASES)
def test_speculative_sampling_matches_target_joint_distribution(sampling, check_wrong):
    """End to end on vocab 8: the joint law of the first 2 new tokens equals the target's.

    Chi-square goodness of fit at ALPHA against the exact joint computed from the target, for
    the speculative sampler (k=2: 3 tokens are decoded so the first round drafts 2 and the
    rejection, residual and bonus paths all feed the first two tokens) and the target-only
    sampler; two deliberately wrong samplers (always accept, no residual) must fail it.
    Fixed seeds: the outcome is deterministic, not flaky.
    """
    target, draft = _peaky_pair()
    prompt = [1, 5, 3]
    expected = _exact_joint(target, prompt, sampling)

    def pvalue(decoder):
        return joint_pvalue(decoder, prompt, expected)

    assert pvalue(SpeculativeDecoder(target, draft, k=2, sampling=sampling)) > ALPHA
    if not check_wrong:
        return
    assert pvalue(SpeculativeDecoder(target, sampling=sampling)) > ALPHA
    for wrong in (_always_accept, _no_residual):
        dec = SpeculativeDecoder(target, draft, k=2, sampling=sampling, verify_fn=wrong)
        assert rejects(dec, prompt, expected), wrong.__name__


def test_dynamic_lookahead_under_sampling_keeps_the_target_joint_distribution():
    """Stopping a round on the draft's own confidence changes how many tokens are drafted,
    never the law of what is emitted: the same chi-square test as fixed k (k=2 drafts at most
    2, so rounds of 1 and of 2 drafts both feed the first two tokens)."""
    target, draft = _peaky_pair()
    prompt, sampling = [1, 5, 3], SamplingConfig(temperature=1.0)
    expected = _exact_joint(target, prompt, sampling)
    dec = SpeculativeDecoder(target, draft, k=2, sampling=sampling, stop_below=0.5)
    assert joint_pvalue(dec, prompt, expected) > ALPHA
    res = dec.generate(prompt, 24, seed=3)
    assert res.proposed < 2 * res.target_forwards  # some rounds stopped early


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_lookahead_greedy_is_lossless_and_drafts_less(seed):
    target, draft = tiny_pair(seed, noise=0.3)
    prompt = [3, 9, 4]
    ref = SpeculativeDecoder(target).generate(prompt, 30).tokens
    fixed = SpeculativeDecoder(target, draft, k=6).generate(prompt, 30)
    never = SpeculativeDecoder(target, draft, k=6, stop_below=0.0).generate(prompt, 30)
    assert {k: v for k, v in never.to_dict().items() if "time" not in k} == {
        k: v for k, v in fixed.to_dict().items() if "time" not in k
    }  # a threshold of 0 never stops: the fixed-k decode, count for count
    dyn = SpeculativeDecoder(target, draft, k=6, stop_below=0.6).generate(prompt, 30)
    assert dyn.tokens == fixed.tokens == ref
    assert dyn.proposed < fixed.proposed
    always = SpeculativeDecoder(target, draft, k=6, stop_below=1.01).generate(prompt, 30)
    assert always.tokens == ref and always.proposed <= always.target_forwards
    assert always.reached_at[1:] == [0] * 5  # no token is that sure: one draft per round


def test_sampling_is_reproducible_per_seed():
    target, draft = tiny_pair(5, noise=0.5)
    dec = SpeculativeDecoder(target, draft, k=3, sampling=SamplingConfig(temperature=1.0))
    a, b = dec.generate([4, 5], 12, seed=11).tokens, dec.generate([4, 5], 12, seed=11).tokens
    assert a == b and a != dec.generate([4, 5], 12, seed=12).tokens


def test_sampling_probs_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert torch.allclose(sampling_probs(logits, SamplingConfig(1.0)), logits.softmax(-1))
    top2 = sampling_probs(logits, SamplingConfig(1.0, top_k=2))
    assert top2[2:].sum() == 0 and torch.allclose(top2[:2], logits[:2].softmax(-1))
    # softmax = [.644, .237, .087, .032]: top_p 0.8 keeps the first two, 0.5 only the first
    assert (sampling_probs(logits, SamplingConfig(1.0, top_p=0.8)) > 0).tolist() == [1, 1, 0, 0]
    assert (sampling_probs(logits, SamplingConfig(1.0, top_p=0.5)) > 0).tolist() == [1, 0, 0, 0]
    cold = sampling_probs(logits, SamplingConfig(0.5))
    assert torch.allclose(cold, (logits / 0.5).softmax(-1))


@pytest.mark.parametrize("seed,k,noise", [(0, 4, 0.3), (2, 2, 0.2), (3, 6, 0.2), (4, 3, 0.3)])
def test_acceptance_counts_match_teacher_forced_agreement(seed, k, noise):
    """The engine's counts equal what one teacher-forced draft pass over the target's output
    predicts: every accept/reject and per-position figure, not just the output text."""
    target, draft = tiny_pair(seed, noise=noise)
    prompt = [5, 9, 3, 17, 11]
    ref = SpeculativeDecoder(target).generate(prompt, 40).tokens
    with torch.no_grad():
        logits = draft(torch.tensor([prompt + ref[:-1]])).logits[0, len(prompt) - 1 :]  # (40, V)
    agree = (logits.argmax(-1) == torch.tensor(ref)).tolist()
    assert 0 < sum(agree) < len(agree)  # a draft that is neither perfect nor useless
    res = SpeculativeDecoder(target, draft, k=k).generate(prompt, 40)
    want = greedy_rounds(agree, k)
    assert res.tokens == ref
    assert (res.proposed, res.accepted, res.target_forwards) == (
        want["proposed"],
        want["accepted"],
        want["rounds"],
    )
    assert res.accepted_at == want["accepted_at"] and res.reached_at == want["reached_at"]


# ----------------------------------------------------------------------------- second choices


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 6),
    noise=st.sampled_from([0.0, 0.3, 1.0]),
    min_gain=st.sampled_from([0.0, 0.1, 0.3]),
    max_new=st.integers(1, 24),
    eos_at=st.integers(0, 20),
)
def test_second_choice_leaves_are_lossless(seed, k, noise, min_gain, max_new, eos_at):
    target, draft = tiny_pair(seed, noise=noise)
    prompt = [4, 9, 12]
    plain = SpeculativeDecoder(target).generate(prompt, max_new).tokens
    eos = [plain[min(eos_at, len(plain) - 1)]]
    ref = SpeculativeDecoder(target, eos_ids=eos).generate(prompt, max_new).tokens
    chain = SpeculativeDecoder(target, draft, k=k, eos_ids=eos).generate(prompt, max_new)
    tree = SpeculativeDecoder(target, draft, k=k, eos_ids=eos, second_choice_min=min_gain)
    res = tree.generate(prompt, max_new)
    assert res.tokens == ref
    assert res.second_accepted <= res.second_proposed
    assert len(res.outcome) == len(ref)
    if res.second_accepted == 0:  # no leaf emitted: the chain's rounds, count for count
        assert (res.target_forwards, res.accepted) == (chain.target_forwards, chain.accepted)


def _leaf_rounds(agree: list[bool], second: list[bool], k: int) -> dict:
    """Greedy rounds with a leaf at every drafted depth, from teacher-forced agreement of
    the draft's top choice (`agree`) and of its second choice (`second`) with the target's
    tokens: a round's top-choice run stops at its first miss, where a second-choice hit
    emits that token and the target's next one."""
    n, pos, out = len(agree), 0, {"rounds": 0, "proposed": 0, "accepted": 0, "hits": 0}
    while pos < n:
        k_round = min(k, n - pos - 1)
        run = 0
        while run < k_round and agree[pos + run]:
            run += 1
        hit = run < k_round and second[pos + run]
        out["rounds"] += 1
        out["proposed"] += k_round
        out["accepted"] += run
        out["hits"] += hit
        pos += run + 1 + hit
    return out


@pytest.mark.parametrize("seed,k,noise", [(0, 4, 0.5), (2, 3, 0.8), (3, 6, 0.5), (0, 2, 1.0)])
def test_second_choice_rounds_match_teacher_forced_top_two(seed, k, noise):
    """With a leaf at every depth (min gain 0) the engine's rounds are predicted exactly by
    one teacher-forced draft pass: which top choices and which second choices agree."""
    target, draft = tiny_pair(seed, noise=noise)
    prompt = [5, 9, 3, 17, 11]
    ref = SpeculativeDecoder(target).generate(prompt, 40).tokens
    with torch.no_grad():
        logits = draft(torch.tensor([prompt + ref[:-1]])).logits[0, len(prompt) - 1 :]  # (40, V)
    top2 = logits.topk(2, dim=-1).indices  # (40, 2)
    want_ids = torch.tensor(ref)
    agree, second = (top2[:, 0] == want_ids).tolist(), (top2[:, 1] == want_ids).tolist()
    want = _leaf_rounds(agree, second, k)
    assert want["hits"] > 0  # the case under test happens
    res = SpeculativeDecoder(target, draft, k=k, second_choice_min=0.0).generate(prompt, 40)
    assert res.tokens == ref
    assert (res.target_forwards, res.proposed, res.accepted, res.second_accepted) == (
        want["rounds"],
        want["proposed"],
        want["accepted"],
        want["hits"],
    )
    assert res.second_proposed == res.proposed  # a leaf beside every drafted token
    chain = SpeculativeDecoder(target, draft, k=k).generate(prompt, 40)
    assert res.target_forwards < chain.target_forwards


def test_second_choice_leaves_closed_form():
    """A leaf where reach x p2 >= min: reach is the product of the top probabilities before."""
    runner_up = torch.tensor([[0.9, 7, 0.05], [0.5, 3, 0.4], [0.6, 11, 0.3]])
    # gains: 1 x 0.05, 0.9 x 0.4 = 0.36, 0.45 x 0.3 = 0.135
    assert second_choice_leaves(runner_up, 0.1) == [(1, 3), (2, 11)]
    assert second_choice_leaves(runner_up, 0.2) == [(1, 3)]
    assert second_choice_leaves(runner_up, 0.0) == [(0, 7), (1, 3), (2, 11)]
    assert second_choice_leaves(runner_up, 0.5) == []


def test_a_leaf_row_is_the_target_after_its_alternative_prefix():
    """tree_inputs: in one verify pass the chain rows equal a causal forward and each leaf's
    row equals a forward over its own prefix (seq[-1], d_1..d_j, the leaf)."""
    target = tiny_target(3)
    cached, last, drafted = [5, 9, 3, 17], 11, [20, 21, 22]
    leaves = [(0, 30), (2, 31)]  # stand-ins for d_1 and d_3
    kw = {cache_kwarg(target): new_cache(target), "use_cache": True}
    with torch.no_grad():
        target(input_ids=torch.tensor([cached]), **kw)
        ids = torch.tensor([[last, *drafted, 30, 31]])
        tree = tree_inputs(len(cached), 3, [j for j, _ in leaves], torch.device("cpu"))
        got = target(input_ids=ids, **kw, **tree).logits[0]  # (6, V)

        def after(tokens):
            return target(input_ids=torch.tensor([cached + tokens])).logits[0, -1]

        for row, tokens in enumerate([[last], [last, 20], [last, 20, 21], [last, 20, 21, 22]]):
            torch.testing.assert_close(got[row], after(tokens))
        torch.testing.assert_close(got[4], after([last, 30]))
        torch.testing.assert_close(got[5], after([last, 20, 21, 31]))


def _leaf_always(law, alt, leaf_p, generator):
    """WRONG: a rejection always emits the leaf."""
    return [alt, int(torch.multinomial(leaf_p, 1, generator=generator))]


def _leaf_no_exclusion(law, alt, leaf_p, generator):
    """WRONG: on a missed leaf, draws from the residual law with the leaf still in it."""
    if float(torch.rand(1, generator=generator)) < float(law[alt]):
        return [alt, int(torch.multinomial(leaf_p, 1, generator=generator))]
    return [int(torch.multinomial(law, 1, generator=generator))]


def _leaf_wrong_row(law, alt, leaf_p, generator):
    """WRONG: after the leaf, draws the next token from the rejection's law, not the leaf row."""
    if float(torch.rand(1, generator=generator)) < float(law[alt]):
        return [alt, int(torch.multinomial(law, 1, generator=generator))]
    rest = law.clone()
    rest[alt] = 0.0
    return [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]


def _scaled_pair(target_scale: float, draft_scale: float):
    """vocab 8: a draft that is the target with its head scaled apart from the target's:
    the same token order, a flatter or a sharper law."""
    target, draft = tiny_pair(3, vocab=8, noise=0.0, layers=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(target_scale)
        draft.lm_head.weight.mul_(draft_scale)
    return target, draft


# (target head scale, draft head scale, sampling, the wrong leaf rule this pair exposes)
LEAF_LAW_CASES = [
    # a flat draft: rejections fall on its odd draws, the residual on the target's top token,
    # the leaf it names: leaves are emitted often, so drawing their successor wrong shows
    (6.0, 0.5, SamplingConfig(temperature=1.0), "_leaf_wrong_row"),
    (6.0, 0.5, SamplingConfig(temperature=0.8, top_k=5, top_p=0.9), None),
    # a sharp draft: its second choice is over-weighted too, the residual there often 0, so
    # a rule that always emits the leaf shows
    (2.0, 6.0, SamplingConfig(temperature=1.0), "_leaf_always"),
]


@pytest.mark.parametrize("target_scale,draft_scale,sampling,wrong", LEAF_LAW_CASES)
def test_second_choice_leaves_under_sampling_keep_the_target_joint_distribution(
    target_scale, draft_scale, sampling, wrong, monkeypatch
):
    """A leaf beside every drafted token (min gain 0) under sampling: the same chi-square test
    of the first two tokens' joint law as the chain (k=2, so a leaf at either depth feeds
    them); a wrong leaf rule must fail it."""
    target, draft = _scaled_pair(target_scale, draft_scale)
    prompt = [1, 5, 3]
    expected = _exact_joint(target, prompt, sampling)
    dec = SpeculativeDecoder(target, draft, k=2, sampling=sampling, second_choice_min=0.0)
    assert joint_pvalue(dec, prompt, expected) > ALPHA
    if target_scale > draft_scale:  # the leaf path carries real weight in the law tested
        assert sum(dec.generate(prompt, 3, seed=s).second_accepted for s in range(200)) > 20
    if wrong is not None:
        monkeypatch.setattr(engine, "sample_with_leaf", globals()[wrong])
        assert rejects(dec, prompt, expected), wrong


@pytest.mark.parametrize(
    "rule,right",
    [
        (engine.sample_with_leaf, True),
        (_leaf_always, False),
        (_leaf_no_exclusion, False),
        (_leaf_wrong_row, False),
    ],
)
def test_sample_with_leaf_closed_form(rule, right):
    """The first token's law is `law` itself and the leaf's successor comes from the leaf
    row; each wrong rule breaks one of the two."""
    gen = torch.Generator().manual_seed(0)
    law = torch.tensor([0.5, 0.3, 0.2, 0.0])
    leaf_p = torch.tensor([0.0, 0.0, 0.0, 1.0])
    n = 4000
    firsts, after_leaf = {}, set()
    for _ in range(n):
        out = rule(law, 1, leaf_p, gen)
        firsts[out[0]] = firsts.get(out[0], 0) + 1
        after_leaf |= set(out[1:])
    law_ok = _chi_square_p(firsts, {i: float(v) for i, v in enumerate(law)}, n) > ALPHA
    assert (law_ok and after_leaf == {3}) == right
    if right:  # a law all on the leaf always emits it; a leaf of law 0 never
        assert rule(torch.tensor([0.0, 1.0]), 1, torch.tensor([0.5, 0.5]), gen)[0] == 1
        assert all(rule(law, 3, leaf_p, gen)[0] != 3 for _ in range(200))


def test_sampled_runner_up_names_the_likeliest_other_token():
    q = torch.tensor([0.1, 0.6, 0.3])
    assert engine.sampled_runner_up(q, torch.tensor([1])).tolist() == pytest.approx([0.6, 2, 0.3])
    assert engine.sampled_runner_up(q, torch.tensor([0])).tolist() == pytest.approx([0.1, 1, 0.6])
