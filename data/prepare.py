"""What generate does before the target runs: prompts loaded, split, guarded and encoded.

`prepare_prompts(cfg, tokenizer, model_config)` loads every prompt source, dedupes, splits
train/eval by each source's role (data/split.py), drops training prompts that
near-duplicate an eval prompt (data/neardup.py), tags the eval prompts with their eval
sets, renders everything with the target's chat template, tokenizes, and drops or
refuses too-long prompts: every check happens before anything is written
(data/generate.py then runs the target).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from draftsmith.config import Config, PromptSource
from draftsmith.data import HELDOUT
from draftsmith.data.neardup import EvalIndex
from draftsmith.data.sources import (
    Prompt,
    dedupe,
    encode,
    load_source,
    render,
    source_label,
    source_name,
)
from draftsmith.data.split import balanced_take, split_prompts
from draftsmith.errors import ConfigError, DraftsmithError


@dataclass
class Encoded:
    id: str
    key: str
    text: str  # the rendered prompt (chat template applied)
    ids: list[int]
    category: str
    source: str
    # replies=score: the source's reply to score, tokenized and cut to max_new_tokens (+ EOS
    # when it ends within them); None: the target writes the completion.
    reply_ids: list[int] | None = None
    messages: tuple[tuple[str, str], ...] = ()  # the conversation before rendering
    followups: tuple[str, ...] = ()  # later user turns (MT-bench turn 2)
    eval_set: str | None = None  # eval prompts: the named set it is measured in


@dataclass
class PreparedPrompts:
    train: list[Encoded]
    eval: list[Encoded]
    duplicates: int
    skipped: int  # prompts over the length limit (data.too_long=skip)
    near_duplicates: int  # training prompts dropped as near-duplicates of eval prompts


# ----------------------------------------------------------------------------- prompts


def prompt_id(p: Prompt) -> str:
    if p.id is not None:  # the source's own id (MT-bench question_id)
        return f"{p.source}-{p.id}"
    return f"{p.source}-{hashlib.sha256(p.key.encode()).hexdigest()[:12]}"


def context_limit(cfg: Config, model_config) -> int | None:
    """Longest prompt allowed: data.max_prompt_tokens, else context minus max_new_tokens."""
    if cfg.data.max_prompt_tokens is not None:
        return cfg.data.max_prompt_tokens
    ctx = cfg.data.vllm.max_model_len if cfg.data.backend == "vllm" else None
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        ctx = ctx or getattr(model_config, name, None)
    if ctx is None:
        return None
    if ctx <= cfg.data.max_new_tokens:
        raise DraftsmithError(
            f"data.max_new_tokens: {cfg.data.max_new_tokens} leaves no room for a prompt in the "
            f"target's {ctx}-token context"
        )
    return ctx - cfg.data.max_new_tokens


def encode_reply(reply: str, tokenizer, max_new_tokens: int) -> list[int]:
    """A source's reply as a completion: its tokens, cut to max_new_tokens, ending with the
    EOS that closes the turn when the whole reply fits (as the target's own completions do)."""
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    if len(ids) < max_new_tokens and tokenizer.eos_token_id is not None:
        return ids + [tokenizer.eos_token_id]
    return ids[:max_new_tokens]


def encode_all(prompts: list[Prompt], cfg: Config, tokenizer) -> list[Encoded]:
    templated = cfg.data.chat_template and bool(getattr(tokenizer, "chat_template", None))
    out = []
    for p in prompts:
        text = render(p, tokenizer, cfg.data.chat_template, cfg.data.system_prompt)
        reply = None
        if p.reply is not None:
            reply = encode_reply(p.reply, tokenizer, cfg.data.max_new_tokens)
        ids = encode(text, tokenizer, templated)
        out.append(
            Encoded(
                prompt_id(p),
                p.key,
                text,
                ids,
                p.category,
                p.source,
                reply_ids=reply,
                messages=p.messages,
                followups=p.followups,
            )
        )
    return out


def drop_too_long(
    items: list[Encoded], limit: int | None, policy: str
) -> tuple[list[Encoded], int]:
    if limit is None:
        return items, 0
    kept = [e for e in items if len(e.ids) <= limit]
    if policy == "error" and len(kept) < len(items):
        bad = next(e for e in items if len(e.ids) > limit)
        raise DraftsmithError(
            f"data.too_long: prompt {bad.id} has {len(bad.ids)} tokens, over the limit of {limit} "
            "(set data.too_long=skip, data.max_prompt_tokens or a smaller data.max_new_tokens)"
        )
    return kept, len(items) - len(kept)


# ----------------------------------------------------------------------------- roles and guard


@dataclass
class Pools:
    """The prompts of all sources by role, each pool deduplicated (the first source wins)."""

    train_only: list[Prompt]
    both: list[Prompt]
    eval_only: list[Prompt]
    duplicates: int
    near_duplicates: int  # training candidates dropped as near-duplicates of eval-only prompts


def eval_texts(prompts: list) -> list[str]:
    """What no training prompt may copy: each eval prompt and its followup turns."""
    return [t for p in prompts for t in (p.text, *p.followups)]


def load_pools(sources: list[PromptSource], seed: int) -> Pools:
    """Load every source, then drop the training candidates that near-duplicate an eval-only
    prompt; a source left with nothing to train on is a config error."""
    loaded = [(i, src, load_source(src, seed, i)) for i, src in enumerate(sources)]
    eval_only, eval_dups = dedupe([p for _, src, ps in loaded if src.role == "eval" for p in ps])
    learners = [(i, src, ps) for i, src, ps in loaded if src.role != "eval"]
    candidates, dups = dedupe([p for _, _, ps in learners for p in ps])
    index = EvalIndex(eval_texts(eval_only))
    near = {p.key for p in candidates if index.is_near_duplicate(p.text)}
    for i, src, ps in learners:
        if all(p.key in near for p in ps):
            raise ConfigError(
                f"{source_label(src, i)}: all {len(ps)} of its prompts are "
                "duplicates or near-duplicates of eval prompts, nothing is left to train on "
                "(give it role: eval, or remove it)"
            )
    role_of = {}
    for _, src, ps in learners:
        for p in ps:
            role_of.setdefault(p.key, src.role)  # the source whose copy dedupe kept
    kept = [p for p in candidates if p.key not in near]
    return Pools(
        [p for p in kept if role_of[p.key] == "train"],
        [p for p in kept if role_of[p.key] == "both"],
        eval_only,
        eval_dups + dups,
        len(near),
    )


def drop_near_duplicates(train: list, evals: list, prompt_of: dict) -> tuple[list, int]:
    """Training items that near-duplicate none of `evals`, and how many did."""
    index = EvalIndex(eval_texts([prompt_of[e.key] for e in evals]))
    kept = [t for t in train if not index.is_near_duplicate(prompt_of[t.key].text)]
    return kept, len(train) - len(kept)


def prepare_prompts(cfg: Config, tokenizer, model_config) -> PreparedPrompts:
    """Load, dedupe, render, drop (or refuse) too-long prompts, split by role, then drop
    training prompts that near-duplicate a held-out one.

    Length filtering comes before the split so the caps give exact sizes; the
    training cap comes after the near-duplicate guard for the same reason.
    """
    pools = load_pools(cfg.data.sources, cfg.run.seed)
    limit = context_limit(cfg, model_config)
    usable, skipped = {}, 0
    for role in ("train_only", "both", "eval_only"):
        items = encode_all(getattr(pools, role), cfg, tokenizer)
        usable[role], n = drop_too_long(items, limit, cfg.data.too_long)
        skipped += n
    train, held_out = split_prompts(
        usable["both"],
        cfg.data.eval_fraction,
        cfg.run.seed,
        cfg.data.max_eval_prompts,
        train_only=usable["train_only"],
    )
    evals = tag_eval_sets(usable["eval_only"], held_out, cfg)
    prompt_of = {p.key: p for role in ("train_only", "both") for p in getattr(pools, role)}
    # eval-only prompts were guarded in load_pools already
    train, near = drop_near_duplicates(train, held_out, prompt_of)
    cap = cfg.data.max_train_prompts
    if cap is not None and len(train) > cap:
        train = balanced_take(train, cap, cfg.run.seed)
    loaded = len(pools.train_only) + len(pools.both) + len(pools.eval_only)
    if not train:
        raise DraftsmithError(
            f"data.sources: no training prompts left ({loaded} loaded, {skipped} too long, "
            f"{pools.near_duplicates + near} near-duplicates of eval prompts)"
        )
    return PreparedPrompts(train, evals, pools.duplicates, skipped, pools.near_duplicates + near)


def tag_eval_sets(eval_only: list[Encoded], held_out: list[Encoded], cfg: Config) -> list[Encoded]:
    """Every eval prompt tagged with its set: a role=eval source's prompts form a set named
    after the source, the held-out split `heldout`. data.max_eval_prompts caps each set on
    its own (the held-out split was capped by split_prompts, its surplus trained on; an
    eval-only surplus is dropped: its source said it is never trained on). Sets in the
    order of data.sources, `heldout` last; each ordered by split rank."""
    for i, src in enumerate(cfg.data.sources):
        if src.role == "eval" and source_name(src) == HELDOUT and held_out:
            raise ConfigError(
                f"{source_label(src, i)}: an eval source named {HELDOUT!r} would merge with the "
                "held-out split's eval set; rename the file"
            )
    by_set: dict[str, list[Encoded]] = {}
    for e in eval_only:
        by_set.setdefault(e.source, []).append(e)
    out = []
    for name, items in by_set.items():
        cap = cfg.data.max_eval_prompts
        kept = balanced_take(items, min(cap or len(items), len(items)), cfg.run.seed)
        out += [dataclasses.replace(e, eval_set=name) for e in kept]
    return out + [dataclasses.replace(e, eval_set=HELDOUT) for e in held_out]
