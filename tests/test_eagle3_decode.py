"""The eagle3 kind in the real engine: lossless greedy and exact sampling, caches cropped
right, and a teacher-forced replay that gives the engine's counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_specdec import (
    JOINT_LAW_CASES,
    _always_accept,
    _exact_joint,
    _no_residual,
    hf_greedy,
    joint_pvalue,
    rejects,
    tiny_target,
)

from draftsmith.evaluate.engine import SamplingConfig, SpeculativeDecoder
from draftsmith.kinds.eagle3.head import Eagle3Head, head_inputs, select_aux_hidden
from draftsmith.kinds.eagle3.proposer import Eagle3Proposer, replay_greedy
from draftsmith.kinds.eagle3.vocab import build_draft_vocab

DTYPE = torch.float64  # as tests/test_specdec.py: a mismatch is an algorithm bug, not rounding
AUX = [0, 1, 2]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one thread decodes them faster, and far faster on a shared CPU
    (the sampling tests decode 3000 prompts)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def tiny_head(target, seed: int, draft_vocab: int, scale: float = 1.0) -> Eagle3Head:
    """A random head over the draft_vocab ids the target's own greedy text uses most."""
    g = torch.Generator().manual_seed(seed)
    V = target.config.vocab_size
    vocab = build_draft_vocab(torch.randint(0, 100, (V,), generator=g), draft_vocab, V)
    torch.manual_seed(seed)
    head = Eagle3Head.from_target(target, vocab, AUX).to(DTYPE).eval()
    with torch.no_grad():
        head.lm_head.weight.mul_(scale)
    return head


def decode(target, head, prompt, max_new, k, **kw):
    return SpeculativeDecoder(target, Eagle3Proposer(head), k=k, **kw).generate(prompt, max_new)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 6),
    draft_vocab=st.sampled_from([4, 16, 32]),
    prompt=st.lists(st.integers(3, 31), min_size=1, max_size=6),
    max_new=st.integers(1, 20),
    eos_at=st.integers(0, 15),
)
def test_greedy_eagle3_equals_target_greedy(seed, k, draft_vocab, prompt, max_new, eos_at):
    target = tiny_target(seed % 7)
    head = tiny_head(target, seed, draft_vocab)
    plain = SpeculativeDecoder(target).generate(prompt, max_new).tokens
    eos = [plain[min(eos_at, len(plain) - 1)]]  # an EOS that can land inside a block
    ref = SpeculativeDecoder(target, eos_ids=eos).generate(prompt, max_new).tokens
    assert ref == hf_greedy(target, prompt, max_new, eos)
    spec = decode(target, head, prompt, max_new, k, eos_ids=eos)
    assert spec.tokens == ref
    assert spec.accepted <= spec.proposed and spec.target_forwards <= len(ref)
    # one head forward per proposed token (a 1-token prompt's first round proposes none)
    assert spec.draft_forwards == spec.proposed


def _trained_head(target, steps: int = 60) -> Eagle3Head:
    """A head trained a little on the target's own greedy text (forward KL, 2 TTT steps),
    through the training code's own pieces (collate, target_pass, ttt_loss_parts)."""
    from draftsmith.distill.batching import Example, collate
    from draftsmith.kinds.eagle3.train import target_pass, ttt_loss_parts

    g = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(16):
        prompt = torch.randint(3, 32, (3,), generator=g).tolist()
        examples.append(Example(prompt, SpeculativeDecoder(target).generate(prompt, 13).tokens))
    batch = collate(examples, pad_id=0)
    counts = torch.bincount(batch.labels, minlength=32)
    vocab = build_draft_vocab(counts, 24, 32)
    torch.manual_seed(0)
    head = Eagle3Head.from_target(target, vocab, AUX).to(DTYPE)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    aux, teacher = target_pass(target, batch, AUX, vocab.target_ids())
    for _ in range(steps):
        tgt, feats, mask = head_inputs(batch.input_ids, aux, batch.attention_mask)
        logits = [o.logits for o in head.unroll(feats, tgt, mask, steps=2)]
        parts = ttt_loss_parts("forward_kl", logits, teacher, batch, vocab.t2d)
        loss = sum(p.mean() for p in parts)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def trained():
    target = tiny_target(3)  # varied greedy text (seeds like 11 repeat one token)
    return target, _trained_head(target)


def test_a_trained_head_is_lossless_and_accepts_more_than_a_random_one(trained):
    target, head = trained
    random = tiny_head(target, 5, 24)
    prompts = [[5, 9, 3], [7], [30, 4, 4, 12, 6]]
    got = {"trained": [0, 0], "random": [0, 0]}
    for name, h in (("trained", head), ("random", random)):
        for p in prompts:
            ref = SpeculativeDecoder(target).generate(p, 24).tokens
            res = decode(target, h, p, 24, 3)
            assert res.tokens == ref
            got[name][0] += res.accepted
            got[name][1] += res.proposed
    assert got["trained"][0] / got["trained"][1] > got["random"][0] / got["random"][1] + 0.2


def _eos_late(tokens: list[int], at: int) -> list[int]:
    """An EOS id the output first writes at or after position `at` (so it ends there)."""
    return [next(t for i, t in enumerate(tokens) if i >= at and t not in tokens[:i])]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_replay_counts_equal_the_engine(trained, k):
    target, head = trained
    V = target.config.vocab_size
    keys = (
        "tokens",
        "proposed",
        "accepted",
        "accepted_at",
        "reached_at",
        "target_forwards",
        "outcome",
    )
    accepted = 0
    for prompt, stop in (([5, 9, 3], False), ([7], False), ([30, 4, 4, 12, 6], True)):
        plain = SpeculativeDecoder(target).generate(prompt, 24).tokens
        eos = _eos_late(plain, 3) if stop else []
        ref = SpeculativeDecoder(target, eos_ids=eos).generate(prompt, 24).tokens
        assert len(ref) < 24 if stop else len(ref) == 24
        engine = decode(target, head, prompt, 24, k, eos_ids=eos)
        fast = replay_greedy(head, target, prompt, ref, k, 24, V)
        assert {c: getattr(fast, c) for c in keys} == {c: getattr(engine, c) for c in keys}
        assert fast.draft_forwards == engine.draft_forwards
        accepted += engine.accepted
    assert accepted > 0  # the replay covers accepting rounds, not only misses


class _Spy(Eagle3Proposer):
    """Records each round's first draft logits (from the head's cache) and the committed length."""

    def __init__(self, head):
        super().__init__(head)
        self.seen, self._n = [], None

    def propose(self, seq, k, gen, res):
        self._n = len(seq)
        return super().propose(seq, k, gen, res)

    def _select(self, logits, gen):
        if self._n is not None:
            self.seen.append((self._n, logits.clone()))
            self._n = None
        return super()._select(logits, gen)


def test_cached_decoding_after_rejections_equals_the_full_forward(trained):
    """Each round's first draft comes from the head's cache after every earlier crop; its
    logits equal one full head forward over the final sequence's target features."""
    target, head = trained
    prompt = [30, 4, 4, 12, 6]
    spy = _Spy(head)
    res = SpeculativeDecoder(target, spy, k=4).generate(prompt, 30)
    assert 0 < res.accepted < res.proposed  # rejections happened, and acceptances
    seq = torch.tensor([prompt + res.tokens])
    with torch.no_grad():
        hs = target(seq, output_hidden_states=True).hidden_states
        tgt, aux, _ = head_inputs(seq, select_aux_hidden(hs, AUX))
        full = head(tgt, aux_hidden=aux).logits[0]  # (N-1, Vd): pair i predicts x_{i+2}
    assert len(spy.seen) == res.target_forwards
    for n, logits in spy.seen:  # n committed tokens: pair n-2 predicts x_n, the first draft
        torch.testing.assert_close(logits, full[n - 2], atol=1e-9, rtol=0)


def test_perfect_head_every_verified_draft_accepted():
    """A target with zero embeddings writes token 0 forever (all logits 0, the first
    maximum wins); a head reading zeros scores its draft vocabulary all 0 and proposes its
    first draft id, target id 0: every round accepts all k and adds the bonus token."""
    target = tiny_target(3)
    with torch.no_grad():
        target.get_input_embeddings().weight.zero_()
    vocab = build_draft_vocab(torch.arange(32, 0, -1), 8, 32)  # ids 0..7
    head = Eagle3Head.from_target(target, vocab, AUX).to(DTYPE).eval()
    res = decode(target, head, [5, 6, 7], 25, 4)
    assert res.tokens == [0] * 25
    assert res.accepted == res.proposed == 20 and res.target_forwards == 5
    assert res.accepted_at == res.reached_at == [5, 5, 5, 5]


# ----------------------------------------------------------------------------- sampling

ALPHA = 1e-3


def _peaky_eagle3():
    """vocab 8, a draft vocabulary of 6 (two target tokens can never be proposed), heads
    scaled so p and q differ clearly."""
    target = tiny_target(3, vocab=8, layers=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    head = tiny_head(target, 4, 6, scale=4.0)
    assert int(head.t2d.sum()) == 6
    return target, head


@pytest.mark.parametrize("sampling,check_wrong", JOINT_LAW_CASES)
def test_eagle3_sampling_matches_target_joint_distribution(sampling, check_wrong):
    """As tests/test_specdec.py for an independent draft: the first two new tokens follow
    the target's exact joint law (chi-square at ALPHA), wrong samplers fail it."""
    target, head = _peaky_eagle3()
    prompt = [1, 5, 3]
    expected = _exact_joint(target, prompt, sampling)

    def pvalue(decoder):
        return joint_pvalue(decoder, prompt, expected)

    dec = SpeculativeDecoder(target, Eagle3Proposer(head), k=2, sampling=sampling)
    assert pvalue(dec) > ALPHA
    if not check_wrong:
        return
    for wrong in (_always_accept, _no_residual):
        bad = SpeculativeDecoder(
            target, Eagle3Proposer(head), k=2, sampling=sampling, verify_fn=wrong
        )
        assert rejects(bad, prompt, expected), wrong.__name__


def test_q_is_zero_outside_the_draft_vocabulary():
    target, head = _peaky_eagle3()
    seen = []

    def spy(p, q, drafted, gen):
        seen.append(q)
        from draftsmith.evaluate.engine import rejection_sample

        return rejection_sample(p, q, drafted, gen)

    dec = SpeculativeDecoder(
        target, Eagle3Proposer(head), k=3, sampling=SamplingConfig(1.0), verify_fn=spy
    )
    dec.generate([1, 5, 3], 12, seed=0)
    q = torch.cat(seen)  # (rounds x k, 8)
    assert q.shape[1] == 8 and q.shape[0] > 0
    assert torch.all(q[:, ~head.t2d] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[0], dtype=q.dtype))


def test_padding_ids_in_the_draft_vocabulary_are_never_proposed():
    """A draft vocabulary may hold target rows past the tokenizer's ids (num_ids); even with
    the largest logits they are never proposed, greedy or sampled."""
    from draftsmith.evaluate.engine import DraftContext

    target = tiny_target(3)
    vocab = build_draft_vocab(torch.arange(32), 8, 32)  # the 8 highest ids: 24..31
    head = Eagle3Head.from_target(target, vocab, AUX).to(DTYPE).eval()
    prop = Eagle3Proposer(head)
    logits = torch.tensor([0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 9.0, 8.0], dtype=DTYPE)  # 30, 31 win
    gen = torch.Generator().manual_seed(0)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
        prop.prefill(DraftContext(30, sampling, torch.device("cpu"), None), [5], None)
        tok, q = prop._select(logits, gen)
        if sampling.greedy:
            assert tok.tolist() == [25]  # draft id 1: the best logit among ids < 30
        else:
            assert q.shape == (30,) and q[:24].sum() == 0
            want = torch.softmax(logits[:6], -1).float()
            torch.testing.assert_close(q[24:], want)
    # and end to end: lossless with the cut
    ref = SpeculativeDecoder(target, num_ids=30).generate([5, 9, 3], 16).tokens
    res = SpeculativeDecoder(target, Eagle3Proposer(head), k=3, num_ids=30).generate([5, 9, 3], 16)
    assert res.tokens == ref


def test_the_cost_step_is_one_speculative_head_step_that_its_reset_undoes():
    """evaluate's timing of an eagle3 draft (EAGLE3_REPLAY.draft_step): the context's
    verified pairs in the head's cache, then a timed 1-token step, cropped back each time."""
    from draftsmith.kinds.eagle3.proposer import EAGLE3_REPLAY

    target = tiny_target(3)
    head = tiny_head(target, 4, 20)
    caches, calls = [], []
    real_new, real_step = head.new_cache, head.step

    def new_cache():
        caches.append(real_new())
        return caches[-1]

    def step(cache, ids, **kw):
        out = real_step(cache, ids, **kw)
        calls.append((ids.shape[1], sorted(kw), out[0].clone()))
        return out

    head.new_cache, head.step = new_cache, step
    context = [5, 9, 3, 7, 2]
    run, reset = EAGLE3_REPLAY.draft_step(head, lambda: target, context, 4)
    assert calls[0][:2] == (len(context) - 1, ["aux_hidden"])  # pairs 0..C-2, target features
    assert caches[0].get_seq_length() == len(context) - 1
    for _ in range(2):
        with torch.inference_mode():
            run()
        assert caches[0].get_seq_length() == len(context)
        reset()
        assert caches[0].get_seq_length() == len(context) - 1
    (n1, kw1, a), (n2, kw2, b) = calls[1:]
    assert (n1, kw1) == (n2, kw2) == (1, ["prev_hidden"]) and torch.equal(a, b)
