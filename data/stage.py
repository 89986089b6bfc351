"""`draftsmith generate`: prompts -> split -> target completions, in resumable shards.

run_generate(cfg)
  1. load every prompt source, dedupe, split train/eval by each source's role
     (data/split.py), drop training prompts that near-duplicate an eval prompt
     (data/neardup.py); eval prompts form named eval sets: each role=eval source its
     own (named after the source), the held-out split of role=both sources `heldout`,
     each capped by data.max_eval_prompts on its own
  2. render with the target's chat template, tokenize, drop/refuse too-long prompts
     (all checks happen before anything is written)
  3. generate the train prompts shard by shard (skipping finished shards)
  4. concatenate into <out>/data/dataset, write eval_prompts.jsonl, then meta.json
     (meta.json last: its presence marks the stage finished)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from draftsmith.config import Config, PromptSource
from draftsmith.data import HELDOUT, load_data_meta, shards
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
from draftsmith.io import atomic_dir, atomic_write_json, atomic_write_text
from draftsmith.models import (
    eos_token_ids,
    load_target,
    load_target_config,
    load_target_generation_config,
    load_target_tokenizer,
    model_fingerprint,
    pick_batch_dtype,
    pick_device,
    resolve_model,
)
from draftsmith.rundir import differing_keys, record_config

TOPK_DTYPE = "float32"


@dataclass
class Encoded:
    id: str
    key: str
    text: str  # the rendered prompt (chat template applied)
    ids: list[int]
    category: str
    source: str
    # kind=score: the source's reply to score, tokenized and cut to max_new_tokens (+ EOS
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


# ----------------------------------------------------------------------------- fingerprints


def settings(cfg: Config) -> dict:
    """Everything that changes what generate writes (batch size and device only add float noise)."""
    data = dataclasses.asdict(cfg.data)
    for k in ("batch_size", "max_batch_tokens", "vllm"):
        data.pop(k)
    return {"target": dataclasses.asdict(cfg.target), "seed": cfg.run.seed, "data": data}


# ----------------------------------------------------------------------------- backends


def make_backend(cfg: Config, tokenizer, model_path: str):
    if cfg.data.backend == "vllm":
        from draftsmith.data.vllm_backend import VllmBackend

        eos = eos_token_ids(tokenizer, load_target_generation_config(cfg.target))
        return VllmBackend(cfg, model_path, eos)

    from draftsmith.data.hf_backend import HFBackend

    device = pick_device(cfg.run.device)
    model = load_target(cfg.target, device, pick_batch_dtype(cfg.target, device))
    return HFBackend(model, tokenizer, cfg.data)


# ----------------------------------------------------------------------------- shards


def shard_seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i) % (2**31)


def chunk(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def shard_rows(shard: list[Encoded], comps, tokenizer, topk: bool) -> dict[str, list]:
    cols = list(shards.features(topk))
    rows = {c: [] for c in cols}
    for p, samples in zip(shard, comps):
        for j, c in enumerate(samples):
            row = dict(
                prompt_id=p.id,
                prompt_ids=p.ids,
                completion_ids=c.token_ids,
                prompt_text=p.text,
                completion_text=tokenizer.decode(c.token_ids, skip_special_tokens=True),
                category=p.category,
                source=p.source,
                split="train",
                sample_index=j,
                finish_reason=c.finish_reason,
                kind="target" if p.reply_ids is None else "score",
                topk_ids=c.topk_ids,
                topk_logprobs=c.topk_logprobs,
            )
            for col in cols:
                rows[col].append(row[col])
    return rows


def generate_shards(
    cfg: Config, data_dir: Path, plan: list[list[Encoded]], tokenizer, model_path: str
):
    todo = [i for i in range(len(plan)) if not shards.is_done(data_dir, i)]
    if not todo:
        return
    done_prompts = sum(len(plan[i]) for i in range(len(plan)) if i not in todo)
    print(f"generate: {len(todo)} of {len(plan)} shards to go ({cfg.data.backend} backend)")
    backend = make_backend(cfg, tokenizer, model_path)
    bar = tqdm(total=sum(map(len, plan)), initial=done_prompts, unit="prompt", desc="generate")
    tokens, t0 = 0, time.perf_counter()

    def on_batch(n_prompts: int, n_tokens: int) -> None:
        nonlocal tokens
        tokens += n_tokens
        bar.update(n_prompts)
        bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - t0, 1e-9):.1f}")

    topk = cfg.data.topk_logprobs > 0
    for i in todo:
        comps, info = complete_shard(backend, plan[i], shard_seed(cfg.run.seed, i), on_batch)
        rows = shard_rows(plan[i], comps, tokenizer, topk)
        info |= {"prompts": len(plan[i]), "completions": len(rows["completion_ids"])}
        shards.write_shard(data_dir, i, rows, info, topk)
    bar.close()


def complete_shard(backend, shard: list[Encoded], seed: int, on_batch):
    """Per prompt its completions (written by the target, or its reply scored), and the
    shard's cost per kind: tokens, wall and process CPU seconds (CPU time is what the
    README's per-kind comparison charges, since wall time depends on the machine's load)."""
    comps: list = [None] * len(shard)
    info = {"completion_tokens": 0, "wall_time_s": 0.0, "cpu_time_s": 0.0, "by_kind": {}}
    written = [j for j, p in enumerate(shard) if p.reply_ids is None]
    scored = [j for j, p in enumerate(shard) if p.reply_ids is not None]
    for kind, idx in (("target", written), ("score", scored)):
        if not idx:
            continue
        wall, cpu = time.perf_counter(), time.process_time()
        if kind == "target":
            got = backend.generate([shard[j].ids for j in idx], seed, on_batch)
        else:
            pairs = [(shard[j].ids, shard[j].reply_ids) for j in idx]
            got = [[c] for c in backend.score(pairs, on_batch)]
        cost = {
            "prompts": len(idx),
            "tokens": sum(len(c.token_ids) for cs in got for c in cs),
            "wall_time_s": time.perf_counter() - wall,
            "cpu_time_s": time.process_time() - cpu,
        }
        for j, cs in zip(idx, got):
            comps[j] = cs
        info["by_kind"][kind] = cost
        info["completion_tokens"] += cost["tokens"]
        info["wall_time_s"] += cost["wall_time_s"]
        info["cpu_time_s"] += cost["cpu_time_s"]
    return comps, info


# ----------------------------------------------------------------------------- finishing


def eval_records(evals: list[Encoded]) -> str:
    lines = [
        json.dumps(
            {
                "id": e.id,
                "prompt_text": e.text,
                "prompt_ids": e.ids,
                "category": e.category,
                "source": e.source,
                "eval_set": e.eval_set,
                "messages": [list(m) for m in e.messages],
                "followups": list(e.followups),
            },
            ensure_ascii=False,
        )
        for e in evals
    ]
    return "".join(line + "\n" for line in lines)


def build_meta(cfg: Config, prep: PreparedPrompts, infos: list[dict], ds, model_path: str) -> dict:
    wall = sum(i["wall_time_s"] for i in infos)
    completion_tokens = sum(i["completion_tokens"] for i in infos)
    cats = Counter(e.category for e in prep.train)
    eval_cats = Counter(e.category for e in prep.eval)
    return {
        "target": {
            "model": cfg.target.model,
            "path": model_path,
            "revision": cfg.target.revision,
            "fingerprint": model_fingerprint(model_path),
        },
        "backend": cfg.data.backend,
        "sampling": {
            k: getattr(cfg.data, k)
            for k in ("temperature", "top_p", "top_k", "n", "max_new_tokens")
        }
        | {"seed": cfg.run.seed},
        "num_prompts": len(prep.train),
        "num_train": len(prep.train),
        "num_eval_prompts": len(prep.eval),
        "eval_sets": dict(Counter(e.eval_set for e in prep.eval)),
        "num_completions": len(ds),
        "num_prompt_tokens": sum(len(e.ids) for e in prep.train),
        "num_completion_tokens": completion_tokens,
        "num_finished_with_eos": sum(r == "stop" for r in ds["finish_reason"]),
        "num_skipped": prep.skipped,
        "duplicates_dropped": prep.duplicates,
        "near_duplicates_dropped": prep.near_duplicates,
        "categories": {
            c: {"train": cats[c], "eval": eval_cats[c]} for c in sorted(cats | eval_cats)
        },
        "topk_logprobs": cfg.data.topk_logprobs,
        "topk_dtype": TOPK_DTYPE,
        "eos_policy": "completion_ids end with the EOS token when one was generated; nothing after it",
        "num_shards": len(infos),
        "wall_time_s": round(wall, 3),
        "cpu_time_s": round(sum(i.get("cpu_time_s", 0.0) for i in infos), 3),
        "tokens_per_s": round(completion_tokens / wall, 2) if wall > 0 else None,
        "by_kind": cost_by_kind(infos),
        "batch_dtype": str(pick_batch_dtype(cfg.target, pick_device(cfg.run.device))),
        "settings": settings(cfg),
    }


def cost_by_kind(infos: list[dict]) -> dict:
    """Prompts, tokens and seconds per data kind over all shards (+ tokens per CPU-second)."""
    out: dict[str, dict] = {}
    for info in infos:
        for kind, cost in info.get("by_kind", {}).items():
            acc = out.setdefault(kind, dict.fromkeys(cost, 0))
            for key, value in cost.items():
                acc[key] += value
    for cost in out.values():
        cpu = cost["cpu_time_s"]
        cost["tokens_per_cpu_s"] = round(cost["tokens"] / cpu, 2) if cpu > 0 else None
    return out


def finish(
    cfg: Config, data_dir: Path, prep: PreparedPrompts, num_shards: int, model_path: str
) -> dict:
    ds = shards.concat_shards(data_dir, num_shards)
    with shards.quiet_datasets(), atomic_dir(data_dir / "dataset", overwrite=True) as tmp:
        ds.save_to_disk(str(tmp))
    atomic_write_text(data_dir / "eval_prompts.jsonl", eval_records(prep.eval))
    infos = [shards.read_shard_info(data_dir, i) for i in range(num_shards)]
    meta = build_meta(cfg, prep, infos, ds, model_path)
    atomic_write_json(data_dir / "meta.json", meta)  # last: marks the stage finished
    shutil.rmtree(shards.shards_dir(data_dir), ignore_errors=True)
    return meta


def finished_meta(cfg: Config, data_dir: Path) -> dict | None:
    meta_file = data_dir / "meta.json"
    if not (meta_file.is_file() and (data_dir / "dataset").is_dir()):
        return None
    meta = load_data_meta(cfg.output_dir)
    if meta.get("settings") != settings(cfg):
        keys = differing_keys(meta.get("settings") or {}, settings(cfg))
        raise DraftsmithError(
            f"{data_dir}: holds data generated with other target/data settings "
            f"({', '.join(keys)} differ); delete it or use a new run.output_dir"
        )
    return meta


# ----------------------------------------------------------------------------- entry point


def run_generate(cfg: Config) -> None:
    data_dir = cfg.output_dir / "data"
    meta = finished_meta(cfg, data_dir)
    if meta is not None:
        print(f"generate: {data_dir} is complete ({meta['num_completions']} completions); skipping")
        return
    if cfg.data.backend == "vllm":
        from draftsmith.vllm_compat import import_vllm

        import_vllm("data.backend")  # a missing or old vLLM: say so before anything is written
    model_path = resolve_model(cfg.target.model, "target.model")
    model_config = load_target_config(cfg.target)
    tokenizer = load_target_tokenizer(cfg.target)
    prep = prepare_prompts(cfg, tokenizer, model_config)  # every user error is raised by here
    plan = chunk(prep.train, cfg.data.shard_size)
    shards.prepare(
        data_dir, {"settings": settings(cfg), "shards": [[p.id for p in s] for s in plan]}
    )
    record_config(cfg)  # every check passed and the plan is written: the config is this run's
    sets = ", ".join(f"{n} {c}" for n, c in Counter(e.eval_set for e in prep.eval).items())
    print(
        f"generate: {len(prep.train)} train prompts in {len(plan)} shards, {len(prep.eval)} eval "
        f"prompts held out ({sets}; {prep.duplicates} duplicates dropped, {prep.near_duplicates} "
        f"near-duplicates of eval prompts dropped from training, {prep.skipped} too long skipped)"
    )
    generate_shards(cfg, data_dir, plan, tokenizer, model_path)
    meta = finish(cfg, data_dir, prep, len(plan), model_path)
    print(
        f"generate: wrote {meta['num_completions']} completions ({meta['num_completion_tokens']} "
        f"tokens, {meta['tokens_per_s']} tokens/s) to {data_dir / 'dataset'}"
    )
