"""Metrics against hand-computed cases."""

from __future__ import annotations

import pytest

from draftsmith.evaluate import metrics as m


def _res(tokens, proposed, accepted, acc_at, reached_at, forwards, wall, **kw):
    base = dict(
        tokens=tokens,
        proposed=proposed,
        accepted=accepted,
        accepted_at=acc_at,
        reached_at=reached_at,
        target_forwards=forwards,
        wall_time=wall,
        draft_1tok_time=0.0,
        draft_1tok_n=0,
        target_1tok_time=0.0,
        target_1tok_n=0,
        target_verify_time=0.0,
        target_verify_n=0,
        category="c",
    )
    base.update(kw)
    return base


def test_modelled_speedup_closed_form():
    # a = 0.5, k = 2, c = 0.25: (1 - 0.125) / (0.5 * 1.5) = 1.1666...
    assert m.modelled_speedup(0.5, 2, 0.25) == pytest.approx(0.875 / 0.75)
    assert m.modelled_speedup(1.0, 4, 0.0) == 5.0  # perfect free draft: k+1 tokens a forward
    assert m.modelled_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)
    assert m.modelled_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert m.modelled_speedup(None, 4, 0.1) is None
    assert m.expected_tokens_per_round(0.5, 1) == pytest.approx(1.5)
    # a verify forward costing 1.5 one-token forwards: (1 - 0.125) / (0.5 * (0.5 + 1.5))
    assert m.modelled_speedup(0.5, 2, 0.25, verify_cost=1.5) == pytest.approx(0.875 / 1.0)


def test_modelled_request_speedup_closed_form():
    # no prefills: the per-round model itself
    assert m.modelled_request_speedup(2.0, 100, 0.2, 0.0, 0.0) == pytest.approx(2.0)
    # 64 tokens x 0.2 s = 12.8 s of decoding at 3x, prefills 0.5 s (target) and 0.2 s (draft):
    # (0.5 + 12.8) / (0.5 + 0.2 + 12.8 / 3)
    assert m.modelled_request_speedup(3.0, 64, 0.2, 0.5, 0.2) == pytest.approx(
        13.3 / (0.7 + 12.8 / 3)
    )
    assert m.modelled_request_speedup(3.0, 64, 0.2, None, 0.2) is None


def test_draft_share_and_free_draft_speedup_closed_forms():
    # 3 draft steps of c = 0.2 beside a verify of 1.4: 0.6 of a 2.0 round
    assert m.draft_share(3, 0.2, 1.4) == pytest.approx(0.3)
    assert m.free_draft_speedup(3.0, 1.5) == pytest.approx(2.0)
    # the model factors into the ceiling and the share it loses to drafting
    a, k, c, v = 0.7, 4, 0.15, 1.2
    tokens = m.expected_tokens_per_round(a, k)
    assert m.modelled_speedup(a, k, c, v) == pytest.approx(
        m.free_draft_speedup(tokens, v) * (1 - m.draft_share(k, c, v))
    )
    assert m.draft_share(4, 0.0, 1.0) == 0.0  # a free draft: the ceiling itself


def test_alpha_counts_verified_drafts_only():
    # k=4, four rounds accepting 0, 1, 2 and 4 drafts.
    # verified positions: 1 (reject at 1), 2 (accept 1, reject 2), 3, 4 -> 10; accepted 7.
    accepted_at, reached_at = [3, 2, 1, 1], [4, 3, 2, 1]
    assert m.alpha(accepted_at, reached_at) == pytest.approx(7 / 10)
    # accepted / proposed counts the never-verified drafts after each rejection: 7 / 16
    assert m.acceptance_rate(7, 16) == pytest.approx(7 / 16)
    assert m.alpha([0, 0], [0, 0]) is None


def test_basic_ratios():
    assert m.acceptance_rate(3, 4) == 0.75 and m.acceptance_rate(0, 0) is None
    assert m.mean_accepted_length(10, 4) == 2.5
    assert m.per_position_acceptance([4, 2, 1], [5, 4, 2]) == [0.8, 0.5, 0.5]
    assert m.per_position_acceptance([0], [0]) == [None]
    assert m.speedup(30.0, 20.0) == 1.5 and m.speedup(30.0, 0.0) is None
    assert m.cost_ratio(0.2, 10, 1.0, 10) == pytest.approx(0.2)
    assert m.cost_ratio(0.2, 0, 1.0, 10) is None


def test_summarize_hand_computed():
    # prompt A: k=2, rounds: accept 2 (+bonus), accept 0 (+fix) -> 4 tokens, 2 forwards
    # prompt B: k=2, one round accepting 1 (+fix) -> 2 tokens, 1 forward
    spec = [
        _res(
            [1, 2, 3, 4],
            4,
            2,
            [1, 1],
            [2, 1],
            2,
            0.4,
            draft_1tok_time=0.04,
            draft_1tok_n=4,
            target_verify_time=0.6,
            target_verify_n=2,
        ),
        _res(
            [5, 6],
            2,
            1,
            [1, 0],
            [1, 1],
            1,
            0.2,
            draft_1tok_time=0.02,
            draft_1tok_n=2,
            target_verify_time=0.3,
            target_verify_n=1,
        ),
    ]
    base = [
        _res([1, 2, 3, 4], 0, 0, [], [], 4, 0.8, target_1tok_time=0.8, target_1tok_n=4),
        _res([5, 6], 0, 0, [], [], 2, 0.4, target_1tok_time=0.4, target_1tok_n=2),
    ]
    s = m.summarize(spec, base, k=2)
    assert s["tokens_proposed"] == 6 and s["tokens_accepted"] == 3
    assert s["acceptance_rate"] == 0.5
    assert s["alpha"] == pytest.approx(3 / 5)  # 3 accepted of 5 verified drafts
    assert s["mean_accepted_length"] == 2.0  # 6 tokens / 3 forwards
    assert s["per_position_acceptance"] == [2 / 3, 0.5]
    assert s["tokens_per_s"] == pytest.approx(10.0) and s["target_tokens_per_s"] == pytest.approx(
        5.0
    )
    assert s["speedup"] == pytest.approx(2.0)
    assert s["draft_cost_ratio"] == pytest.approx(0.01 / 0.2)
    # alpha 0.6, k 2, c 0.05: (1 - 0.6^3) / ((1 - 0.6)(2 x 0.05 + 1)) = 0.784 / 0.44
    assert s["modelled_speedup"] == pytest.approx(0.784 / 0.44)
    assert s["verify_cost_ratio"] == pytest.approx(0.3 / 0.2)  # mean verify / mean 1-token
    # the same with v = 1.5: 0.784 / (0.4 x (0.1 + 1.5))
    assert s["modelled_speedup_verify"] == pytest.approx(0.784 / 0.64)
    assert s["modelled_speedup_request"] is None  # no prefill timers recorded: no figure
    for r, pre in zip(spec + base, (0.05, 0.03, 0.2, 0.1)):  # draft prefills, target prefills
        r["draft_prefill_time" if r in spec else "target_prefill_time"] = pre
    for r in spec:
        r["target_prefill_time"] = 99.0  # the spec run's own target prefill is not read
    s = m.summarize(spec, base, k=2)
    # P_t 0.3, P_d 0.08, 6 tokens x t 0.2 = 1.2 of decoding at 0.784 / 0.64 steady:
    # (0.3 + 1.2) / (0.3 + 0.08 + 1.2 x 0.64 / 0.784)
    assert s["modelled_speedup_request"] == pytest.approx(1.5 / (0.38 + 1.2 * 0.64 / 0.784))
    cats = m.per_category(spec, base, ["x", "y"], k=2)
    assert cats["x"]["acceptance_rate"] == 0.5 and cats["y"]["acceptance_rate"] == 0.5
    assert cats["y"]["mean_accepted_length"] == 2.0 and cats["x"]["num_prompts"] == 1


def test_lossless_helpers():
    assert m.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert m.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert m.first_mismatch([1, 2], [1, 2, 3]) == 2
    assert m.lossless_match_rate([[1], [2], [3], [4]], [[1], [2], [0], [4]]) == 0.75


def test_greedy_rounds_hand_computed():
    # 6 target tokens, k=2. Round 1 at token 0: accepts tokens 0-1, adds token 2.
    # Round 2 at token 3: accepts 3, rejects 4 (the target's token 4 is emitted).
    # Round 3 at token 5: budget 1, nothing drafted, the target emits token 5.
    r = m.greedy_rounds([True, True, False, True, False, False], k=2)
    assert (r["proposed"], r["accepted"], r["rounds"]) == (4, 3, 3)
    assert r["accepted_at"] == [2, 1] and r["reached_at"] == [2, 2]
    # per token: accepted, accepted, bonus; accepted, rejected; no draft
    assert r["outcome"] == [1, 1, -1, 1, 0, -1]


def test_token_outcomes_of_one_round():
    assert m.token_outcomes(accepted=2, reached=3, emitted=3) == [1, 1, 0]  # a miss
    assert m.token_outcomes(accepted=3, reached=3, emitted=4) == [1, 1, 1, -1]  # bonus token
    assert m.token_outcomes(accepted=2, reached=2, emitted=2) == [1, 1]  # EOS among the drafts
    assert m.token_outcomes(accepted=0, reached=0, emitted=1) == [-1]  # target-only


def test_echo_mask_marks_tokens_that_copy_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6]
    assert m.echo_mask(prompt, [3, 4, 5, 6, 9]) == [True] * 4 + [False]  # a 4-token copy
    assert m.echo_mask(prompt, [9, 2, 3, 4, 5, 6, 9]) == [False] + [True] * 5 + [False]
    assert m.echo_mask(prompt, [4, 5, 6, 9]) == [False] * 4  # 3 tokens: too short to count
    assert m.echo_mask(prompt, [6, 5, 4, 3]) == [False] * 4  # the prompt's tokens, not its text
    assert m.echo_mask([1, 2], [1, 2]) == [False, False]


def test_echo_split_on_hand_counts():
    prompt = [1, 2, 3, 4, 5, 6]
    tokens = [9, 3, 4, 5, 6, 9]  # echo mask: F T T T T F
    spec = [{"tokens": tokens, "outcome": [1, 0, 1, 1, -1, 0]}]
    out = m.echo_split(spec, [prompt])
    assert out["echo_share"] == pytest.approx(4 / 6)
    assert out["alpha_echo"] == pytest.approx(2 / 3)  # judged 0, 1, 1 (the -1 never judged)
    assert out["alpha_new"] == pytest.approx(1 / 2)  # judged 1 and 0
    assert m.echo_split([{"tokens": tokens, "outcome": None}], [prompt]) == {}
    assert m.echo_split(spec, None) == {}


def _counts(pairs):
    return [{"accepted": a, "proposed": p} for a, p in pairs]


def test_paired_acceptance_diff_point_value_and_identical_drafts():
    a = _counts([(2, 4), (1, 4)])
    b = _counts([(1, 4), (1, 4)])
    out = m.paired_acceptance_diff(a, b, n_boot=500)
    assert out["diff"] == pytest.approx(3 / 8 - 2 / 8)
    assert out["ci95"][0] <= out["diff"] <= out["ci95"][1]
    same = m.paired_acceptance_diff(a, a, n_boot=500)
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["share_a_better"] == 0.0


def test_paired_acceptance_diff_interval_separates_only_consistent_wins():
    # a beats b by 0.25 on every one of 20 prompts: every resample says so
    a = _counts([(3, 4)] * 20)
    b = _counts([(2, 4)] * 20)
    win = m.paired_acceptance_diff(a, b, n_boot=500)
    assert win["ci95"] == pytest.approx([0.25, 0.25]) and win["share_a_better"] == 1.0
    # a wins big on half the prompts and loses as big on the other half: no verdict
    a = _counts([(4, 4), (0, 4)] * 10)
    b = _counts([(0, 4), (4, 4)] * 10)
    tie = m.paired_acceptance_diff(a, b, n_boot=500)
    assert tie["diff"] == 0.0 and tie["ci95"][0] < 0 < tie["ci95"][1]
    assert 0.2 < tie["share_a_better"] < 0.8
    # seeded: the same call gives the same interval
    assert m.paired_acceptance_diff(a, b, n_boot=500) == tie


def test_paired_alpha_diff_counts_only_judged_drafts():
    # k=4: a accepts 2 of 3 judged drafts on each prompt, b 1 of 2 (the rest never judged)
    a = [{"accepted": 2, "proposed": 4, "reached_at": [1, 1, 1, 0]}] * 10
    b = [{"accepted": 1, "proposed": 4, "reached_at": [1, 1, 0, 0]}] * 10
    out = m.paired_acceptance_diff(a, b, n_boot=200)
    assert out["diff"] == pytest.approx(2 / 4 - 1 / 4)
    assert out["alpha_diff"] == pytest.approx(2 / 3 - 1 / 2)
    assert out["alpha_ci95"] == pytest.approx([2 / 3 - 1 / 2] * 2)  # the same on every prompt
    assert m.paired_acceptance_diff(_counts([(1, 4)]), _counts([(1, 4)]))["alpha_diff"] is None


def test_per_category_differences_need_enough_prompts():
    row = {"accepted": 2, "proposed": 4, "reached_at": [1, 1, 1, 0]}
    worse = {"accepted": 1, "proposed": 4, "reached_at": [1, 1, 0, 0]}
    a = [{**row, "category": "w"}] * 6 + [{**row, "category": "x"}] * 2
    b = [{**worse, "category": "w"}] * 6 + [{**worse, "category": "x"}] * 2
    out = m.paired_diff_by_category(a, b, n_boot=100)
    assert list(out["per_category"]) == ["w"]  # 2 prompts of x: no interval pretends to know
    assert out["per_category"]["w"]["alpha_diff"] == pytest.approx(2 / 3 - 1 / 2)


def test_paired_acceptance_diff_rejects_unpaired_inputs():
    assert m.paired_acceptance_diff(_counts([(1, 4)]), _counts([(1, 4), (1, 4)])) is None
    assert m.paired_acceptance_diff([], []) is None
    assert m.paired_acceptance_diff(_counts([(0, 0)]), _counts([(0, 0)])) is None


def test_confidence_split_on_hand_counts():
    base = [{"tokens": [5, 6, 7, 8, 9], "target_p": [0.9, 0.3, 0.95, 0.5, 0.99]}]
    # sure positions 0, 2, 4: judged 1 (accepted), 0 (rejected), -1 (not judged)
    # unsure positions 1, 3: judged 1 (accepted), 0 (rejected)
    spec = [{"tokens": [5, 6, 7, 8, 9], "outcome": [1, 1, 0, 0, -1]}]
    out = m.confidence_split(spec, base)
    assert out["target_sure_share"] == pytest.approx(2 / 4)
    assert out["alpha_target_sure"] == pytest.approx(1 / 2)
    assert out["alpha_target_unsure"] == pytest.approx(1 / 2)
    assert out["misses_target_unsure"] == pytest.approx(1 / 2)  # misses at 2 (sure), 3 (unsure)
    # the edge belongs to "sure"; a row that left the target's tokens counts up to there
    edge = [{"tokens": [5, 6], "target_p": [m.TARGET_SURE, 0.1]}]
    left = [{"tokens": [5, 4], "outcome": [0, 0]}]
    assert m.confidence_split(left, edge)["misses_target_unsure"] == 0.0
    assert m.confidence_split(spec, [{"tokens": [5], "target_p": None}]) == {}
    assert m.confidence_split([{"tokens": [5], "outcome": None}], base) == {}
