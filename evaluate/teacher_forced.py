"""Greedy acceptance from one teacher-forced draft pass: the engine's counts without decoding.

Greedy speculative decoding only ever extends the target's own greedy output, so whether a
drafted token is accepted is fixed by one question per output position i: does the draft's
argmax, fed the prompt and the target's first i output tokens, equal the target's token i?
One forward of the draft over prompt + target output answers all of them at once, and
`metrics.greedy_rounds` replays the rounds the engine would take (tests/test_specdec.py
and tests/test_teacher_forced.py check the counts equal the engine's).

What it cannot give: timings (so no measured speedup or cost ratio) and the lossless
check (nothing is decoded). The evaluate stage uses it to rank every checkpoint on every
prompt cheaply and runs the real engine on the best drafts; each leaderboard row says
which one measured it (`measured_by`).

The one caveat is numerical: a batched pass over T positions and the engine's cached
1-token steps sum in different orders, so a near-tied argmax can flip. In fp32 that is
rare (the equality test uses float64 to rule it out; on the real target the two agreed
exactly on the runs compared in the README).

That is the replay of a draft that is a causal LM of its own (CAUSAL_LM_REPLAY). A draft
kind whose later drafts in a round read
its own earlier states (a head on the target) brings its own pass through the kinds
registry (`KindReplay`, DraftKind.replay): one target forward, then the head's steps
round by round, at each k.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics, timing
from draftsmith.io import atomic_write_json
from draftsmith.models import eos_token_ids, load_target, load_target_tokenizer


@torch.inference_mode()
def agreement_and_margin(
    draft, prompt_ids: Sequence[int], target_tokens: Sequence[int], vocab: int | None = None
) -> tuple[list[bool], float | None]:
    """Per target output token: does the draft's teacher-forced argmax equal it? And the
    smallest gap between the draft's two highest logits over those positions, relative to
    the top logit's size (None without tokens): where it is within float rounding, the
    engine's cached forwards may argmax the other way (a near-tie, see the module doc).

    `vocab`: the target's vocabulary size; like the engine, the draft's argmax is taken over
    the target's ids only (a draft may carry padding rows past them).
    """
    n = len(target_tokens)
    if n == 0:
        return [], None
    device = next(draft.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(target_tokens[:-1])], device=device)  # (1, P+n-1)
    logits = draft(input_ids=ids, logits_to_keep=n).logits[0, :, :vocab].float()  # (n, V)
    margin = relative_margin(logits)
    agree = (logits.argmax(-1) == torch.tensor(list(target_tokens), device=device)).tolist()
    return agree, margin


@torch.inference_mode()
def own_token_probs(
    target, prompt_ids: Sequence[int], tokens: Sequence[int], vocab: int | None = None
) -> list[float]:
    """Per output token, the target's probability of it given the prompt and the tokens
    before it: one teacher-forced forward (metrics.confidence_split reads them)."""
    n = len(tokens)
    if n == 0:
        return []
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(tokens[:-1])], device=device)  # (1, P+n-1)
    logits = target(input_ids=ids, logits_to_keep=n).logits[0, :, :vocab].float()  # (n, V)
    probs = logits.softmax(-1)
    return probs.gather(1, torch.tensor(list(tokens), device=device)[:, None])[:, 0].tolist()


def relative_margin(logits: torch.Tensor) -> float:
    """The smallest gap between the two highest logits of any row (n, V), relative to the
    top logit's size: within float rounding, another summation order may argmax otherwise."""
    top = logits.float().topk(2, dim=-1).values  # (n, 2)
    return ((top[:, 0] - top[:, 1]) / top[:, 0].abs().clamp_min(1.0)).min().item()


COUNT_KEYS = ("proposed", "accepted", "accepted_at", "reached_at", "target_forwards")


def counts_result(tokens: Sequence[int], k: int, counts: dict) -> dict:
    """A per-prompt result dict with the engine's count fields and zero timings."""
    return {
        "tokens": list(tokens),
        "k": k,
        **{key: counts[key] for key in (*COUNT_KEYS, "draft_forwards")},
        "outcome": counts.get("outcome"),  # per token (metrics.token_outcomes): echo split
        "draft_1tok_time": 0.0,
        "draft_1tok_n": 0,
        "target_1tok_time": 0.0,
        "target_1tok_n": 0,
        "target_verify_time": 0.0,
        "target_verify_n": 0,
        "wall_time": 0.0,
    }


def replay(agree: Sequence[bool], tokens: Sequence[int], k: int, budget: int) -> dict:
    """A per-prompt result dict with the engine's count fields (no timings) for k drafts/round."""
    rounds = metrics.greedy_rounds(agree, k, budget)
    counts = {**rounds, "target_forwards": rounds["rounds"], "draft_forwards": rounds["proposed"]}
    return counts_result(tokens, k, counts)


def teacher_forced_results(
    draft,
    refs: Sequence[dict],
    k: int,
    max_new_tokens: int,
    vocab: int | None = None,
    kind: KindReplay | None = None,
    load_target: Callable | None = None,
) -> list[dict]:
    """refs: per prompt {"id", "category", "prompt_ids", "tokens": the target's greedy output
    under `max_new_tokens`}. `kind`: the draft kind's replay (default: a causal-LM draft);
    `load_target()` gives the target to a kind that reads it."""
    kind = kind or CAUSAL_LM_REPLAY
    out = []
    for r in refs:
        record = kind.teacher_forced_pass(
            draft, load_target, r["prompt_ids"], r["tokens"], vocab, k, max_new_tokens
        )
        out.append(
            {
                "id": r["id"],
                "category": r["category"],
                **kind.result(record, r["tokens"], k, max_new_tokens),
            }
        )
    return out


def greedy_refs(target, eos_ids, prompts: Sequence[dict], max_new_tokens: int) -> list[dict]:
    """The target's own greedy output per prompt, by the engine's target-only decoding (batch
    1, the same kernels and caches the speculative runs are checked against)."""
    from draftsmith.evaluate.engine import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, eos_ids=eos_ids)
    return [
        {**p, "tokens": decoder.generate(p["prompt_ids"], max_new_tokens).tokens} for p in prompts
    ]


def cached_greedy_refs(target_cfg, prompts: Sequence[dict], path, max_new_tokens: int):
    """greedy_refs of the configured target in fp32 on CPU, cached at `path` (the scripts'
    offline scoring); a cache made for other prompts is an error, not reused."""
    path = Path(path)
    if path.is_file():
        refs = json.loads(path.read_text())
        if [r["id"] for r in refs] == [p["id"] for p in prompts]:
            return refs
        raise DraftsmithError(f"{path}: cached target outputs are for other prompts; delete it")
    target = load_target(target_cfg, torch.device("cpu"), torch.float32)
    eos = eos_token_ids(load_target_tokenizer(target_cfg), target.generation_config)
    refs = greedy_refs(target, eos, prompts, max_new_tokens)
    atomic_write_json(path, refs)
    return refs


# ----------------------------------------------------------------------------- the engine check


def replay_mismatches(
    engine: Sequence[dict], replayed: Sequence[dict], target_only: Sequence[dict], near_tie: float
) -> tuple[list, list]:
    """Prompts whose greedy engine counts differ from the replay's: (ids with no near-tie to
    explain it, ids where the draft's smallest relative logit margin is <= near_tie).

    The three lists are aligned by prompt; `replayed` items carry the pass's "margin". A
    prompt whose engine output is not the target's own is skipped: the lossless check has
    reported it, and the replay assumes the target's tokens.
    """
    bad, tied = [], []
    for e, r, b in zip(engine, replayed, target_only):
        if e["tokens"] != b["tokens"] or all(e[key] == r[key] for key in COUNT_KEYS):
            continue
        margin = r.get("margin")
        (tied if margin is not None and margin <= near_tie else bad).append(e["id"])
    return bad, tied


def check_replay(
    name: str,
    engine: Sequence[dict],
    replayed: Sequence[dict],
    target_only: Sequence[dict],
    near_tie: float,
) -> float:
    """The engine's greedy counts must equal the teacher-forced replay's: raise naming the
    first prompt where they differ beyond a near-tie; return the share that match exactly."""
    bad, tied = replay_mismatches(engine, replayed, target_only, near_tie)
    if bad:
        raise DraftsmithError(
            f"{name}: the engine's greedy counts differ from the teacher-forced replay's on "
            f"{len(bad)} of {len(engine)} prompts (first: prompt {bad[0]!r}) where the draft has "
            "no near-tied logits to explain it: a bug in the engine or the replay"
        )
    if tied:
        print(
            f"[evaluate] {name}: engine and teacher-forced counts differ on {len(tied)} prompts "
            f"with near-tied draft logits (first: {tied[0]!r}); float rounding, not a bug"
        )
    return 1.0 - len(tied) / len(engine) if engine else 1.0


# ----------------------------------------------------------------------------- draft kinds


@dataclass(frozen=True)
class KindReplay:
    """What the evaluate stage needs from a draft kind besides the engine (draftsmith/kinds/
    gives each kind's; `draft` is the module the kind loads, `load_target()` the target for
    kinds that read it).

    teacher_forced_pass(draft, load_target, prompt_ids, target_tokens, vocab, k, budget) ->
        a JSON record per prompt with "margin" (as agreement_and_margin's), cached by the stage
    result(record, target_tokens, k, budget) -> the engine's count fields at k (counts_result)
    per_k: whether the pass depends on k (a causal-LM draft's argmax at a position does
        not, so one pass serves every k; a head's later drafts read its own states)
    draft_step(draft, load_target, context, token) -> timing.Step: one proposal step on a
        cache holding `context`, for the cost timing
    """

    teacher_forced_pass: Callable
    result: Callable
    per_k: bool
    draft_step: Callable


def _causal_lm_pass(draft, load_target, prompt_ids, target_tokens, vocab, k, budget):
    agree, margin = agreement_and_margin(draft, prompt_ids, target_tokens, vocab)
    return {"agree": agree, "margin": margin}


def _causal_lm_result(record: dict, tokens, k: int, budget: int) -> dict:
    return replay(record["agree"], tokens, k, budget)


def _causal_lm_step(draft, load_target, context, token):
    return timing.causal_lm_draft_step(draft, context, token)


CAUSAL_LM_REPLAY = KindReplay(_causal_lm_pass, _causal_lm_result, False, _causal_lm_step)
