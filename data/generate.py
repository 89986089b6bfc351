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
import json
import shutil
import time
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from draftsmith.config import Config
from draftsmith.data import load_data_meta, load_train_dataset, shards
from draftsmith.data.prepare import Encoded, PreparedPrompts, prepare_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_dir, atomic_write_json, atomic_write_text
from draftsmith.models import (
    eos_token_ids,
    load_target,
    load_target_config,
    load_target_generation_config,
    load_target_tokenizer,
    model_fingerprint,
    model_key,
    pick_batch_dtype,
    pick_device,
    resolve_model,
)
from draftsmith.rundir import differing_keys, record_config
from draftsmith.vocab_rows import token_id_count

TOPK_DTYPE = "float32"
# the decode steps' linear-layer forms as timed (data.cpu_few_row_linear: auto), kept so a
# resumed generate takes the killed run's choice
LINEAR_FORMS = "linear_forms.json"


# ----------------------------------------------------------------------------- fingerprints


def settings(cfg: Config) -> dict:
    """Everything that changes what generate writes (batch size and device only add float noise)."""
    data = dataclasses.asdict(cfg.data)
    for k in ("batch_size", "max_batch_tokens", "cpu_few_row_linear", "vllm"):
        data.pop(k)
    return {"target": dataclasses.asdict(cfg.target), "seed": cfg.run.seed, "data": data}


# ----------------------------------------------------------------------------- backends


def make_backend(cfg: Config, tokenizer, model_path: str, data_dir: Path | None = None):
    if cfg.data.backend == "vllm":
        from draftsmith.data.vllm_backend import VllmBackend

        eos = eos_token_ids(tokenizer, load_target_generation_config(cfg.target))
        return VllmBackend(cfg, model_path, eos)

    from draftsmith.data.hf_backend import HFBackend, decode_linear_forms

    device = pick_device(cfg.run.device)
    model = load_target(cfg.target, device, pick_batch_dtype(cfg.target, device))
    record = data_dir / LINEAR_FORMS if data_dir is not None else None
    vocab = token_id_count(tokenizer)
    forms = decode_linear_forms(model, cfg.data, vocab, record, model_key(model_path))
    return HFBackend(model, tokenizer, cfg.data, linear_forms=forms)


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
    backend = make_backend(cfg, tokenizer, model_path, data_dir)
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
        load_train_dataset(cfg.output_dir)  # a truncated arrow file is not complete: one line
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
