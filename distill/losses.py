"""Token-level distillation losses: pure functions, fp32, summed over valid tokens.

Every loss takes the draft's (student's) logits `(..., V)`, the target's signal
(full logits `(..., V)`, or a `TopK` of stored log-probs), a boolean mask `(...)`
of the completion tokens, and a temperature. It returns a `TokenSum`: the SUM of
the per-token loss over masked tokens and the token COUNT. Dividing by the count
of the whole global batch (all micro-batches of a gradient-accumulation step, on
all processes) gives the exact token mean, which a per-micro-batch mean does not
when micro-batches hold different numbers of tokens.

Notation: p = target (teacher) distribution, q = draft (student) distribution,
both softened by the temperature T (logits / T). No T^2 factor is applied: the
losses are exactly the divergences they are named for, so they are 0 when the
distributions match and comparable across temperatures only as divergences.

Offline teacher (`TopK`): generate stores only the target's k most likely ids
and their log-probs, at temperature 1. The divergence is then computed over k+1
buckets: the k stored tokens, plus one "rest" bucket holding the remaining mass
(1 - sum of the k probabilities for the target; the draft's own mass outside those
k ids for the draft). Both sides are bucketed at temperature 1, from the draft's
logsumexp and k gathered logits (no extra (N, V) tensor). This is exact when k
covers the vocabulary and otherwise a coarser (lower-bound, by the data-processing
inequality) version of the full divergence.

Temperature with the offline teacher: the tempered bucket distribution is
b_T(j) = b(j)^(1/T) / sum_i b(i)^(1/T) over the k+1 buckets b (at temperature 1), that
is, the temperature applied to the coarse distribution with "rest" as ONE outcome. It
is not the bucketing of the tempered full distribution (that needs the rest mass's
spread over the vocabulary, which is not stored), and equals it only when the rest
bucket is empty or one token. Student and teacher go through exactly this same map,
so every divergence is 0 at student = teacher and has a stationary point there.
(Tempering the student over the full vocabulary before bucketing, as an earlier
version did, left the loss > 0 at student = teacher for any T != 1 with k < V.)

Stored ids past the student's logits (rows the tokenizer never produces: a random
tiny target can rank them in its top-k; see draftsmith/vocab_rows.py) are dropped from both
sides; the teacher's mass on them counts in its rest bucket.
"""

from __future__ import annotations

import math
from typing import NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from draftsmith.config import LossName

LOSSES = get_args(LossName)  # the config's choices; distill_loss dispatches each

# A "rest" bucket lighter than _REST_NOISE is fp32 rounding of 1 - sum(k probs), not mass:
# it is set to _MIN_REST_MASS, which keeps its log (and the gradients) finite and stops the
# temperature from inflating rounding noise into real mass.
_REST_NOISE = 1e-6
_MIN_REST_MASS = 1e-12
# The log-prob of a stored id that is not a token of the student: exp() is exactly 0 in fp32
# even after division by a temperature, yet finite, so KL's p * (log p - log q) stays 0, not nan.
_ABSENT = -1e4


class TokenSum(NamedTuple):
    """A loss summed over valid tokens, with the number of tokens it was summed over."""

    total: Tensor  # () fp32
    count: Tensor  # () fp32

    def mean(self) -> Tensor:
        return self.total / self.count.clamp_min(1.0)

    def __add__(self, other: TokenSum) -> TokenSum:  # type: ignore[override]
        return TokenSum(self.total + other.total, self.count + other.count)


class TopK(NamedTuple):
    """The offline teacher: the target's top-k ids and log-probs (temperature 1) per token."""

    ids: Tensor  # (..., k) int64
    logprobs: Tensor  # (..., k) float


# ----------------------------------------------------------------------------- supports


def _log_rest(logprobs: Tensor) -> Tensor:
    """log(1 - sum exp(logprobs)) over the last dim, floored: the mass outside the k ids."""
    rest = 1.0 - logprobs.exp().sum(-1)  # (...)
    rest = torch.where(rest > _REST_NOISE, rest, torch.full_like(rest, _MIN_REST_MASS))
    return rest.log()


def _buckets(top: Tensor) -> Tensor:
    """(..., k) log-probs of the stored ids -> (..., k+1): those k, then the rest bucket."""
    return torch.cat([top, _log_rest(top).unsqueeze(-1)], -1)


def _temper(logp: Tensor, temperature: float) -> Tensor:
    """Log-probs of a distribution -> those of p^(1/T) renormalised, on the same outcomes."""
    return logp if temperature == 1.0 else F.log_softmax(logp / temperature, -1)


def _on_stored_ids(student: Tensor, teacher: TopK) -> tuple[Tensor, Tensor]:
    """(student, teacher) log-probs at temperature 1 on the stored ids: (..., k) each.

    Ids past the student's logits get _ABSENT on both sides: no mass, finite gradients.
    """
    width = student.shape[-1]
    inside = teacher.ids < width  # (..., k)
    ids = teacher.ids.clamp_max(width - 1)
    s_top = student.gather(-1, ids) - torch.logsumexp(student, -1, keepdim=True)
    t_top = teacher.logprobs.float()
    return s_top.masked_fill(~inside, _ABSENT), t_top.masked_fill(~inside, _ABSENT)


def log_probs_on_support(
    student_logits: Tensor, teacher: Tensor | TopK, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """(student log q, teacher log p), both tempered, on one support: the vocab, or k+1 buckets."""
    s = student_logits.float()
    if not isinstance(teacher, TopK):
        t = teacher.float()
        return F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1)  # (..., V)
    s_top, t_top = _on_stored_ids(s, teacher)  # temperature 1, like the stored log-probs
    return _temper(_buckets(s_top), temperature), _temper(_buckets(t_top), temperature)


# ----------------------------------------------------------------------------- per-token divergences


def _kl(a_logp: Tensor, b_logp: Tensor) -> Tensor:
    """KL(a || b) per token over the last dim."""
    return (a_logp.exp() * (a_logp - b_logp)).sum(-1)


def _jsd(s_logp: Tensor, t_logp: Tensor, beta: float) -> Tensor:
    """beta * KL(p || m) + (1 - beta) * KL(q || m), m = beta p + (1 - beta) q."""
    log_m = torch.logaddexp(t_logp + math.log(beta), s_logp + math.log1p(-beta))
    return beta * _kl(t_logp, log_m) + (1.0 - beta) * _kl(s_logp, log_m)


def _tvd(s_logp: Tensor, t_logp: Tensor) -> Tensor:
    return 0.5 * (t_logp.exp() - s_logp.exp()).abs().sum(-1)


def _masked_sum(per_token: Tensor, mask: Tensor) -> TokenSum:
    mask = mask.to(per_token.device, torch.bool)
    total = torch.where(mask, per_token, torch.zeros_like(per_token)).sum()
    return TokenSum(total, mask.sum().to(torch.float32))


# ----------------------------------------------------------------------------- public losses


def forward_kl(
    student_logits: Tensor, teacher: Tensor | TopK, mask: Tensor, temperature: float = 1.0
) -> TokenSum:
    """KL(p || q) = sum_x p(x) log(p(x) / q(x)): mass-covering, the usual distillation loss."""
    s, t = log_probs_on_support(student_logits, teacher, temperature)
    return _masked_sum(_kl(t, s), mask)


def reverse_kl(
    student_logits: Tensor, teacher: Tensor | TopK, mask: Tensor, temperature: float = 1.0
) -> TokenSum:
    """KL(q || p) = sum_x q(x) log(q(x) / p(x)): mode-seeking."""
    s, t = log_probs_on_support(student_logits, teacher, temperature)
    return _masked_sum(_kl(s, t), mask)


def jsd(
    student_logits: Tensor,
    teacher: Tensor | TopK,
    mask: Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> TokenSum:
    """Generalized Jensen-Shannon divergence (GKD, Agarwal et al. 2024), 0 < beta < 1.

    JSD_beta = beta KL(p || m) + (1 - beta) KL(q || m) with m = beta p + (1 - beta) q.
    It is bounded (by the binary entropy H(beta) <= log 2), symmetric at beta = 0.5 (the
    classic JSD), and interpolates between the KLs: JSD_beta / beta -> KL(p || q)
    (forward) as beta -> 0 and JSD_beta / (1 - beta) -> KL(q || p) (reverse) as beta -> 1.
    The endpoints themselves are the `forward_kl` and `reverse_kl` losses.
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd: beta must be strictly between 0 and 1, got {beta}")
    s, t = log_probs_on_support(student_logits, teacher, temperature)
    return _masked_sum(_jsd(s, t, beta), mask)


def tvd(
    student_logits: Tensor, teacher: Tensor | TopK, mask: Tensor, temperature: float = 1.0
) -> TokenSum:
    """Total variation distance 1/2 sum_x |p(x) - q(x)|.

    Why it matters: under exact speculative sampling the draft's token is accepted with
    probability sum_x min(p(x), q(x)) = 1 - TVD(p, q) (Leviathan et al. 2023), so
    minimising TVD directly maximises the per-token acceptance rate; DistillSpec (Zhou
    et al. 2024) uses it as a distillation objective.
    """
    s, t = log_probs_on_support(student_logits, teacher, temperature)
    return _masked_sum(_tvd(s, t), mask)


def cross_entropy(student_logits: Tensor, labels: Tensor, mask: Tensor) -> TokenSum:
    """Hard-label cross-entropy -log q(label) on the target's tokens (temperature 1)."""
    logp = F.log_softmax(student_logits.float(), -1)  # (..., V)
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (...)
    return _masked_sum(nll, mask)


def distill_loss(
    name: str,
    student_logits: Tensor,
    teacher: Tensor | TopK | None,
    labels: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    beta: float = 0.5,
    ce_weight: float = 0.0,
) -> TokenSum:
    """The configured loss: a divergence (+ ce_weight * hard-label CE), or plain CE ("ce")."""
    if name == "ce":
        return cross_entropy(student_logits, labels, mask)
    if teacher is None:
        raise ValueError(f"loss {name!r} needs a teacher signal")
    if name == "forward_kl":
        out = forward_kl(student_logits, teacher, mask, temperature)
    elif name == "reverse_kl":
        out = reverse_kl(student_logits, teacher, mask, temperature)
    elif name == "jsd":
        out = jsd(student_logits, teacher, mask, beta, temperature)
    elif name == "tvd":
        out = tvd(student_logits, teacher, mask, temperature)
    else:
        raise ValueError(f"unknown loss {name!r} (known: {', '.join(LOSSES)})")
    if ce_weight > 0:
        ce = cross_entropy(student_logits, labels, mask)
        out = TokenSum(out.total + ce_weight * ce.total, out.count)
    return out
