"""Teacher-forced greedy acceptance equals the real engine's counts, row for row."""

from __future__ import annotations

import pytest
import torch
from test_specdec import tiny_pair

from draftsmith.evaluate import metrics
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.evaluate.teacher_forced import teacher_forced_results

PROMPTS = [[5, 9, 3, 17, 11], [1, 2], [30, 7, 7, 7, 2, 19, 4]]
COUNTS = (
    "tokens",
    "proposed",
    "accepted",
    "accepted_at",
    "reached_at",
    "target_forwards",
    "outcome",  # per token: accepted draft / rejected draft / no draft judged
)


@pytest.mark.parametrize(
    "seed,k,noise,eos", [(0, 4, 0.3, ()), (2, 2, 0.2, (18,)), (3, 6, 0.25, (8,))]
)
def test_teacher_forced_counts_equal_the_engine(seed, k, noise, eos):
    target, draft = tiny_pair(seed, noise=noise)
    base = SpeculativeDecoder(target, eos_ids=eos)
    refs = [
        {"id": i, "category": "c", "prompt_ids": p, "tokens": base.generate(p, 30).tokens}
        for i, p in enumerate(PROMPTS)
    ]
    if eos:  # some output ends with EOS before the budget: rounds there still draft k
        assert any(len(r["tokens"]) < 30 for r in refs)
    fast = teacher_forced_results(draft, refs, k, 30)
    spec = SpeculativeDecoder(target, draft, k=k, eos_ids=eos)
    engine = [spec.generate(p, 30).to_dict() for p in PROMPTS]
    for f, e in zip(fast, engine):
        assert {c: f[c] for c in COUNTS} == {c: e[c] for c in COUNTS}
    # pooled figures agree too, so a ranking by either is the same ranking
    ids = [r["prompt_ids"] for r in refs]  # the echo split too
    s_fast, s_engine = (
        metrics.summarize(fast, fast, k, ids),
        metrics.summarize(engine, engine, k, ids),
    )
    for key in (
        "acceptance_rate",
        "alpha",
        "mean_accepted_length",
        "per_position_acceptance",
        "echo_share",
        "alpha_echo",
        "alpha_new",
    ):
        assert s_fast[key] == s_engine[key]
    assert 0 < s_fast["tokens_accepted"] < s_fast["tokens_proposed"]  # neither perfect nor useless


def test_padding_rows_of_the_draft_are_ignored_like_the_engine_does():
    target, draft = tiny_pair(1, noise=0.0)  # a perfect draft ...
    vocab = target.config.vocab_size
    big = torch.nn.Linear(draft.lm_head.in_features, vocab + 8, bias=False, dtype=draft.dtype)
    with torch.no_grad():
        big.weight[:vocab] = draft.lm_head.weight
        big.weight[vocab:] = 0.0
        big.weight[vocab:, 0] = 1e4  # ... whose padding rows would win every argmax
    draft.lm_head = big
    prompt = [4, 6, 8]
    ref = SpeculativeDecoder(target).generate(prompt, 12).tokens
    refs = [{"id": 0, "category": "c", "prompt_ids": prompt, "tokens": ref}]
    (row,) = teacher_forced_results(draft, refs, 3, 12, vocab=vocab)
    engine = SpeculativeDecoder(target, draft, k=3).generate(prompt, 12)
    assert row["accepted"] == engine.accepted == engine.proposed  # still perfect within the vocab


def test_replay_mismatches_tell_near_ties_from_bugs():
    from draftsmith.evaluate.teacher_forced import replay_mismatches

    counts = {"proposed": 6, "accepted": 2, "accepted_at": [2, 0], "reached_at": [3, 1]}
    same = {**counts, "target_forwards": 4}
    other = {**same, "accepted": 3, "accepted_at": [2, 1]}
    engine = [
        {"id": "same", "tokens": [1, 2], **same},
        {"id": "bug", "tokens": [1, 2], **other},
        {"id": "tie", "tokens": [1, 2], **other},
        {"id": "lossy", "tokens": [1, 3], **other},  # not the target's output: reported elsewhere
    ]
    replayed = [
        {"margin": 0.0, **same},
        {"margin": 0.5, **same},
        {"margin": 1e-6, **same},
        {"margin": 0.5, **same},
    ]
    base = [{"tokens": [1, 2]}] * 4
    assert replay_mismatches(engine, replayed, base, near_tie=1e-4) == (["bug"], ["tie"])
    assert replay_mismatches(engine, replayed, base, near_tie=0.6) == ([], ["bug", "tie"])


def test_each_kind_brings_its_replay_through_the_registry():
    from draftsmith.errors import ConfigError
    from draftsmith.evaluate.records import DraftEntry
    from draftsmith.evaluate.teacher_forced import CAUSAL_LM_REPLAY
    from draftsmith.kinds import FALLBACK_KIND, get_kind, kind_of
    from draftsmith.kinds.eagle3.proposer import EAGLE3_REPLAY

    def draft(kind):
        return DraftEntry(name="d", ref="d", kind=kind)

    # a draft always names its kind; baselines and unclaimed folders get the fallback
    assert FALLBACK_KIND == "independent"
    assert (
        kind_of(draft(FALLBACK_KIND)).replay()
        is get_kind("independent").replay()
        is CAUSAL_LM_REPLAY
    )
    assert get_kind("eagle3").replay() is EAGLE3_REPLAY
    # one pass serves every k for a causal-LM draft; a head's later drafts read its own states
    assert (CAUSAL_LM_REPLAY.per_k, EAGLE3_REPLAY.per_k) == (False, True)
    with pytest.raises(ConfigError, match="^draft.kind: unknown kind 'medusa'"):
        kind_of(draft("medusa"))


def test_own_token_probs_equal_the_targets_step_by_step_softmax():
    from draftsmith.evaluate.teacher_forced import own_token_probs

    target, _ = tiny_pair(0, noise=0.0)
    prompt, tokens = [4, 6, 8], [9, 2, 2, 17, 5]
    probs = own_token_probs(target, prompt, tokens)
    assert len(probs) == len(tokens) and own_token_probs(target, prompt, []) == []
    with torch.inference_mode():
        for i, tok in enumerate(tokens):
            logits = target(input_ids=torch.tensor([prompt + tokens[:i]])).logits[0, -1]
            assert probs[i] == pytest.approx(logits.softmax(-1)[tok].item(), rel=1e-5)
    # a vocab cut renormalises over the target's ids only
    cut = own_token_probs(target, prompt, tokens, vocab=20)
    assert all(c >= p for c, p in zip(cut, probs)) and cut != probs
