"""Distillation losses against closed forms and torch references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from draftsmith.distill.losses import (
    TokenSum,
    TopK,
    cross_entropy,
    distill_loss,
    forward_kl,
    jsd,
    reverse_kl,
    tvd,
)

V = 11


def _logits(*shape, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, V, generator=g) * scale


def _all(*shape):
    return torch.ones(*shape, dtype=torch.bool)


@pytest.mark.parametrize("fn", [forward_kl, reverse_kl, jsd, tvd])
def test_zero_for_identical_distributions(fn):
    x = _logits(3, 5)
    out = fn(x, x.clone(), _all(3, 5))
    assert out.count.item() == 15
    assert abs(out.total.item()) < 1e-5


def test_kls_match_torch_kl_div():
    s, t = _logits(4, 6, seed=1), _logits(4, 6, seed=2)
    mask = _all(4, 6)
    ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
    # kl_div(input=log q, target=log p, log_target) = sum p (log p - log q) = KL(p || q)
    ref_fwd = F.kl_div(ls, lt, reduction="sum", log_target=True) / 24
    ref_rev = F.kl_div(lt, ls, reduction="sum", log_target=True) / 24
    torch.testing.assert_close(forward_kl(s, t, mask).mean(), ref_fwd)
    torch.testing.assert_close(reverse_kl(s, t, mask).mean(), ref_rev)


def test_temperature_softens_both_sides():
    s, t = _logits(2, 3, seed=3), _logits(2, 3, seed=4)
    mask = _all(2, 3)
    ref = F.kl_div(
        F.log_softmax(s / 2, -1), F.log_softmax(t / 2, -1), reduction="sum", log_target=True
    )
    torch.testing.assert_close(forward_kl(s, t, mask, temperature=2.0).total, ref)


def test_jsd_symmetric_at_half_and_bounded_by_log2():
    s, t = _logits(5, 7, scale=6, seed=5), _logits(5, 7, scale=6, seed=6)
    mask = _all(5, 7)
    a, b = jsd(s, t, mask, beta=0.5), jsd(t, s, mask, beta=0.5)
    torch.testing.assert_close(a.total, b.total)
    # disjoint one-hot-like distributions reach the bound log 2
    far = torch.full((1, V), -1e4)
    far[0, 0] = 0.0
    near = torch.full((1, V), -1e4)
    near[0, 1] = 0.0
    per_tok = jsd(s, t, mask, beta=0.5).total / 35
    assert per_tok.item() <= math.log(2) + 1e-6
    assert jsd(far, near, _all(1), beta=0.5).total.item() == pytest.approx(math.log(2), abs=1e-5)


def test_jsd_closed_form_and_limits():
    s, t = _logits(3, seed=7), _logits(3, seed=8)
    p, q = t.softmax(-1), s.softmax(-1)
    for beta in (0.1, 0.5, 0.9):
        m = beta * p + (1 - beta) * q
        ref = beta * (p * (p / m).log()).sum() + (1 - beta) * (q * (q / m).log()).sum()
        torch.testing.assert_close(jsd(s, t, _all(3), beta=beta).total, ref)
    # JSD/beta -> forward KL as beta -> 0, JSD/(1-beta) -> reverse KL as beta -> 1
    fwd, rev = forward_kl(s, t, _all(3)).total, reverse_kl(s, t, _all(3)).total
    eps = 1e-4
    torch.testing.assert_close(jsd(s, t, _all(3), beta=eps).total / eps, fwd, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(
        jsd(s, t, _all(3), beta=1 - eps).total / eps, rev, rtol=1e-2, atol=1e-3
    )
    with pytest.raises(ValueError):
        jsd(s, t, _all(3), beta=0.0)


def test_one_minus_tvd_is_acceptance_probability():
    s, t = _logits(4, 3, seed=9), _logits(4, 3, seed=10)
    p, q = t.softmax(-1), s.softmax(-1)
    accept = torch.minimum(p, q).sum(-1)  # (4, 3)
    out = tvd(s, t, _all(4, 3))
    torch.testing.assert_close(1 - out.mean(), accept.mean())
    torch.testing.assert_close(out.total, 0.5 * (p - q).abs().sum())


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd", "tvd", "ce"])
def test_gradients_finite_for_peaked_and_flat_logits(name, scale):
    s = (_logits(2, 4, seed=11) * scale).requires_grad_()
    t = _logits(2, 4, seed=12) * scale
    labels = torch.randint(0, V, (2, 4))
    out = distill_loss(name, s, t, labels, _all(2, 4), beta=0.3, ce_weight=0.5)
    out.mean().backward()
    assert torch.isfinite(out.total)
    assert torch.isfinite(s.grad).all()


def test_masking_and_token_averaging_with_uneven_masks():
    s, t = _logits(3, 6, seed=13), _logits(3, 6, seed=14)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]).bool()
    per_tok = F.kl_div(
        F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="none", log_target=True
    ).sum(-1)
    ref_mean = per_tok[mask].mean()
    out = forward_kl(s, t, mask)
    assert out.count.item() == 9
    torch.testing.assert_close(out.mean(), ref_mean)
    # garbage under the mask never leaks in
    s2 = s.clone()
    s2[~mask] = float("nan")
    torch.testing.assert_close(forward_kl(s2, t, mask).total, out.total)
    # micro-batches summed then divided by the global count = mean over all tokens
    parts = [forward_kl(s[i : i + 1], t[i : i + 1], mask[i : i + 1]) for i in range(3)]
    total = parts[0] + parts[1] + parts[2]
    torch.testing.assert_close(total.total / total.count, ref_mean)
    # while averaging per-micro-batch means would not be
    naive = sum(p.mean() for p in parts) / 3
    assert abs(naive.item() - ref_mean.item()) > 1e-4


def test_cross_entropy_matches_torch():
    s = _logits(2, 5, seed=15)
    labels = torch.randint(0, V, (2, 5))
    mask = _all(2, 5)
    mask[1, 3:] = False
    ref = F.cross_entropy(s[mask], labels[mask], reduction="sum")
    torch.testing.assert_close(cross_entropy(s, labels, mask).total, ref)
    # ce_weight adds the CE sum to the divergence sum, same count
    t = _logits(2, 5, seed=16)
    both = distill_loss("forward_kl", s, t, labels, mask, ce_weight=0.25)
    fwd = forward_kl(s, t, mask)
    torch.testing.assert_close(both.total, fwd.total + 0.25 * ref)
    assert isinstance(both, TokenSum) and both.count == fwd.count


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd", "tvd"])
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_offline_topk_matches_online_when_k_covers_vocab(name, temperature):
    s, t = _logits(3, 4, seed=17), _logits(3, 4, seed=18)
    mask = _all(3, 4)
    mask[2, 1:] = False
    logp = F.log_softmax(t, -1)
    vals, ids = logp.sort(-1, descending=True)  # k = V, in the teacher's order
    topk = TopK(ids, vals)
    labels = torch.zeros(3, 4, dtype=torch.long)
    online = distill_loss(name, s, t, labels, mask, temperature=temperature, beta=0.3)
    offline = distill_loss(name, s, topk, labels, mask, temperature=temperature, beta=0.3)
    torch.testing.assert_close(offline.total, online.total, atol=1e-5, rtol=1e-5)


def test_offline_topk_is_a_coarsening_of_the_full_kl():
    s, t = _logits(6, seed=19), _logits(6, seed=20)
    logp = F.log_softmax(t, -1)
    vals, ids = logp.topk(3, -1)
    full = forward_kl(s, t, _all(6)).total
    coarse = forward_kl(s, TopK(ids, vals), _all(6)).total
    # grouping outcomes never increases a KL (data-processing inequality)
    assert 0 <= coarse.item() <= full.item() + 1e-6
    # and it equals the KL of the explicitly bucketed distributions
    p, q = t.softmax(-1), s.softmax(-1)
    pk, qk = p.gather(-1, ids), q.gather(-1, ids)
    pb = torch.cat([pk, 1 - pk.sum(-1, keepdim=True)], -1)
    qb = torch.cat([qk, 1 - qk.sum(-1, keepdim=True)], -1)
    torch.testing.assert_close(coarse, (pb * (pb / qb).log()).sum(), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- offline, T != 1
# k < V and T != 1: the case the k = V test above cannot see. V = 1000, k = 32 and logits of
# scale 3.25 leave the teacher ~13% of its mass outside the top 32 (the "rest" bucket).

OFFLINE = {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "jsd": jsd, "tvd": tvd}


def _offline_teacher(n: int = 16, vocab: int = 1000, k: int = 32, seed: int = 30):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 3.25
    vals, ids = F.log_softmax(logits, -1).topk(k, -1)
    return logits, TopK(ids, vals)


def _rest_mass(student_logits: torch.Tensor, top: TopK) -> torch.Tensor:
    """The student's mass outside the stored ids, at temperature 1: (N,)."""
    return 1 - student_logits.softmax(-1).gather(-1, top.ids).sum(-1)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_offline_tempered_buckets_are_the_closed_form(temperature):
    """Both sides: bucket at T = 1 (k ids + rest), then b^(1/T) renormalised over k+1."""
    from draftsmith.distill.losses import log_probs_on_support

    t, top = _offline_teacher()
    s = torch.randn(16, 1000, generator=torch.Generator().manual_seed(31)) * 3.0  # any student

    def tempered_buckets(probs_on_ids):
        b = torch.cat([probs_on_ids, 1 - probs_on_ids.sum(-1, keepdim=True)], -1)  # (N, k+1)
        bt = b ** (1 / temperature)
        return bt / bt.sum(-1, keepdim=True)

    q = tempered_buckets(s.softmax(-1).gather(-1, top.ids))
    p = tempered_buckets(top.logprobs.exp())
    s_logp, t_logp = log_probs_on_support(s, top, temperature)
    torch.testing.assert_close(s_logp.exp(), q, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(t_logp.exp(), p, atol=1e-6, rtol=1e-4)
    mask = _all(16)
    torch.testing.assert_close(
        forward_kl(s, top, mask, temperature).total, (p * (p / q).log()).sum(), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("name", list(OFFLINE))
def test_offline_divergence_is_zero_and_minimal_at_student_equals_teacher(name, temperature):
    t, top = _offline_teacher()
    fn, mask = OFFLINE[name], _all(16)
    s = t.clone().requires_grad_(True)
    at_teacher = fn(s, top, mask, temperature=temperature).mean()
    assert abs(at_teacher.item()) < 1e-5
    at_teacher.backward()
    if name != "tvd":  # |p - q| has no gradient at its minimum, only a subgradient
        assert s.grad.abs().max().item() < 1e-6
    g = torch.Generator().manual_seed(32)
    for _ in range(5):  # perturbed students: strictly worse
        moved = t + 0.3 * torch.randn(t.shape, generator=g)
        assert fn(moved, top, mask, temperature=temperature).mean().item() > 1e-4


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd"])
def test_offline_gradient_descent_from_the_teacher_stays_there(name, temperature):
    """The bug this pins: started at the teacher, descent moved the student's rest mass
    from 0.13 to ~0.5 (T = 0.5) or to 0 (T = 2)."""
    t, top = _offline_teacher()
    s = t.clone().requires_grad_(True)
    opt = torch.optim.SGD([s], lr=10.0)
    for _ in range(50):
        opt.zero_grad()
        OFFLINE[name](s, top, _all(16), temperature=temperature).mean().backward()
        opt.step()
    with torch.no_grad():
        torch.testing.assert_close(_rest_mass(s, top), _rest_mass(t, top), atol=1e-4, rtol=0)
        torch.testing.assert_close(s, t, atol=1e-4, rtol=0)


def test_offline_ids_past_the_student_logits_count_as_rest():
    """A stored id the student has no logit for (a target padding row) is dropped from both
    sides: the same loss as without it, finite gradients, no out-of-bounds gather."""
    t, top = _offline_teacher(n=4, vocab=60, k=6)
    s = torch.randn(4, 50, generator=torch.Generator().manual_seed(33)).requires_grad_(True)
    past = top.ids >= 50
    assert past.any() and not past.all(-1).any()
    for name, fn in OFFLINE.items():
        for temperature in (0.5, 1.0, 2.0):
            got = fn(s, top, _all(4), temperature=temperature).total
            want = 0.0
            for r in range(4):  # row by row, with the past-the-end ids left out
                keep = ~past[r]
                row = TopK(top.ids[r, keep][None], top.logprobs[r, keep][None])
                want = want + fn(s[r : r + 1], row, _all(1), temperature=temperature).total
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
            (grad,) = torch.autograd.grad(got, s)
            assert torch.isfinite(grad).all()
