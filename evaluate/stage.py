"""`draftsmith evaluate CONFIG`: every checkpoint as a real speculative decoder, ranked.

Flow: eval prompts (capped by evaluate.max_prompts) -> the target-only baseline (cached once
per prompt set and settings) -> each draft at k = evaluate.num_speculative_tokens (cached per
draft) with a greedy losslessness check -> ranking by evaluate.select_metric -> a k sweep of
the best draft -> leaderboard.{json,csv}, plots, a printed table and a W&B log.

Cache files live in <out>/eval/results/: `target-only-<settings>.json` and
`<draft>-k<k>-t<temperature>.json`, each holding the settings they were measured under; a
file whose settings differ (other prompts, max_new_tokens, target, a rewritten checkpoint) is
measured again. Models are identified by content (models.model_fingerprint), so a copied
run dir reuses its results. Writes are atomic, so a killed run leaves no half result.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import zlib
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.config import Config
from draftsmith.evaluate import metrics, report
from draftsmith.evaluate.engine import SamplingConfig, SpeculativeDecoder
from draftsmith.evaluate.prompts import list_drafts, load_prompts, select_prompts
from draftsmith.evaluate.ranking import (
    check_lossless,
    draft_path,
    pick_best,
    recommend_k,
    sweep_entry,
)
from draftsmith.io import atomic_write_json, clean_stale_temps, kill_hook
from draftsmith.kinds import proposer_for
from draftsmith.models import (
    check_tokenizers_compatible,
    eos_token_ids,
    load_model,
    load_target,
    load_target_tokenizer,
    load_tokenizer,
    model_fingerprint,
    pick_device,
    pick_dtype,
    resolve_model,
)
from draftsmith.vocab import token_id_count

# ----------------------------------------------------------------------------- cache keys


def _fingerprint(ref: str) -> str:
    """A model's content fingerprint; a hub id or registry name stands for itself."""
    return model_fingerprint(ref) or ref


def _settings(cfg: Config, prompts: list[dict], target_path: str) -> dict:
    ev = cfg.evaluate
    ids = hashlib.sha256(
        json.dumps([[p["id"], p["prompt_ids"]] for p in prompts]).encode()
    ).hexdigest()[:16]
    return {
        "backend": ev.backend,
        "target": _fingerprint(target_path),
        "revision": cfg.target.revision,
        "prompts": ids,
        "max_new_tokens": ev.max_new_tokens,
        "temperature": ev.temperature,
        "top_p": ev.top_p,
        "top_k": ev.top_k,
        "seed": cfg.run.seed,
        "device": cfg.run.device,
        "dtype": cfg.target.dtype,
        "cpu_few_row_linear": ev.cpu_few_row_linear,  # changes timings, not tokens
    }


def _settings_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-")


def _load_cached(path: Path, settings: dict) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return data if data.get("settings") == settings else None


def prompt_seed(seed: int, prompt_id) -> int:
    """A per-prompt seed that does not depend on which other prompts are evaluated."""
    return zlib.crc32(f"{seed}:{prompt_id}".encode())


# ----------------------------------------------------------------------------- the native run


class _Models:
    """The target (and its tokenizer) loaded on first need: a fully cached rerun loads nothing."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.device = pick_device(cfg.run.device)
        self.dtype = pick_dtype(cfg.target.dtype, self.device)
        self._target = self._tok = None

    def tokenizer(self):
        if self._tok is None:
            self._tok = load_target_tokenizer(self.cfg.target)
        return self._tok

    def target(self):
        if self._target is None:
            self._target = load_target(self.cfg.target, self.device, self.dtype)
        return self._target

    def draft(self, draft: dict):
        """A draft on the target's device and dtype, once its tokenizer matches the target's."""
        key, trust = draft.get("key", "checkpoint"), self.cfg.target.trust_remote_code
        tok = load_tokenizer(draft["ref"], trust_remote_code=trust, key=key)
        model = load_model(
            draft["ref"], device=self.device, dtype=self.dtype, trust_remote_code=trust, key=key
        )
        for note in check_tokenizers_compatible(
            self.tokenizer(),
            tok,
            self.cfg.target.model,
            draft["name"],
            draft_vocab_rows=model.get_input_embeddings().num_embeddings,
        ):
            print(f"[evaluate] {draft['name']}: note: {note}")
        return model


def _sampling(cfg: Config) -> SamplingConfig:
    ev = cfg.evaluate
    return SamplingConfig(temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k)


def decode_prompts(decoder: SpeculativeDecoder, prompts: list[dict], cfg: Config, desc: str):
    """Decode every prompt (after one short untimed warm-up) -> per-prompt result dicts."""
    decoder.generate(prompts[0]["prompt_ids"], min(4, cfg.evaluate.max_new_tokens), seed=0)
    out = []
    for p in tqdm(prompts, desc=desc, leave=False, dynamic_ncols=True):
        res = decoder.generate(
            p["prompt_ids"], cfg.evaluate.max_new_tokens, seed=prompt_seed(cfg.run.seed, p["id"])
        )
        out.append({"id": p["id"], "category": p["category"], **res.to_dict()})
    return out


class NativeEvaluator:
    """Runs and caches target-only and speculative decoding with the torch engine."""

    def __init__(self, cfg: Config, prompts: list[dict], results_dir: Path):
        self.cfg, self.prompts, self.dir = cfg, prompts, results_dir
        self.models = _Models(cfg)
        self.target_path = resolve_model(cfg.target.model, "target.model")
        self.settings = _settings(cfg, prompts, self.target_path)
        self.sampling = _sampling(cfg)
        self._draft_cache: dict[str, object] = {}

    def _eos(self):
        return eos_token_ids(self.models.tokenizer(), self.models.target().generation_config)

    def baseline(self) -> list[dict]:
        path = self.dir / f"target-only-{_settings_key(self.settings)}.json"
        cached = _load_cached(path, self.settings)
        if cached:
            return cached["results"]
        decoder = SpeculativeDecoder(
            self.models.target(),
            None,
            sampling=self.sampling,
            eos_ids=self._eos(),
            few_row_linear=self.cfg.evaluate.cpu_few_row_linear,
            num_ids=token_id_count(self.models.tokenizer()),
        )
        results = decode_prompts(decoder, self.prompts, self.cfg, "target-only")
        atomic_write_json(path, {"settings": self.settings, "results": results})
        return results

    def result_path(self, draft: dict, k: int) -> Path:
        return self.dir / f"{_safe(draft['name'])}-k{k}-t{self.cfg.evaluate.temperature:g}.json"

    def cached(self, draft: dict, k: int) -> dict | None:
        settings = {**self.settings, "draft": _fingerprint(draft["ref"]), "k": k}
        return _load_cached(self.result_path(draft, k), settings)

    def evaluate(self, draft: dict, k: int, base: list[dict]) -> dict:
        """Per-prompt results of `draft` at k (from the cache when the settings match)."""
        settings = {**self.settings, "draft": _fingerprint(draft["ref"]), "k": k}
        hit = self.cached(draft, k)
        if hit:
            return hit
        if draft["name"] not in self._draft_cache:  # keep one draft loaded, as its kind's proposer
            self._draft_cache = {draft["name"]: proposer_for(draft, self.models)}
        decoder = SpeculativeDecoder(
            self.models.target(),
            self._draft_cache[draft["name"]],
            k=k,
            sampling=self.sampling,
            eos_ids=self._eos(),
            few_row_linear=self.cfg.evaluate.cpu_few_row_linear,
            num_ids=token_id_count(self.models.tokenizer()),
        )
        results = decode_prompts(decoder, self.prompts, self.cfg, f"{draft['name']} k={k}")
        rate = None
        if self.sampling.greedy:
            rate = check_lossless(draft["name"], results, base, self.cfg.evaluate.on_mismatch)
        data = {"settings": settings, "lossless_match_rate": rate, "results": results}
        atomic_write_json(self.result_path(draft, k), data)
        kill_hook(f"evaluate:{draft['name']}:k{k}")
        return data


# ----------------------------------------------------------------------------- rows and ranking


def build_row(draft: dict, path: str, data: dict, base: list[dict], cfg: Config, k: int) -> dict:
    spec = data["results"]
    summary = metrics.summarize(spec, base, k)
    cats = [r["category"] for r in spec]
    return {
        "checkpoint": draft["name"],
        "kind": draft.get("kind", "independent"),
        "path": path,
        "step": draft["step"],
        "role": draft.get("role"),
        "trained_steps": draft["trained_steps"],
        **summary,
        "per_category": metrics.per_category(spec, base, cats, k),
        "lossless_match_rate": data.get("lossless_match_rate"),
        "num_speculative_tokens": k,
        "temperature": cfg.evaluate.temperature,
        "backend": cfg.evaluate.backend,
    }


def hardware() -> str:
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def _native_rows(cfg: Config, prompts: list[dict], drafts: list[dict], results_dir: Path):
    ev = cfg.evaluate
    runner = NativeEvaluator(cfg, prompts, results_dir)
    todo = [d for d in drafts if runner.cached(d, ev.num_speculative_tokens) is None]
    print(
        f"[evaluate] {len(drafts)} drafts, {len(todo)} to evaluate "
        f"({len(drafts) - len(todo)} cached), {len(prompts)} prompts, k={ev.num_speculative_tokens}"
    )
    base = runner.baseline()
    rows, per_prompt = [], {}
    for d in tqdm(drafts, desc="drafts", dynamic_ncols=True):
        data = runner.evaluate(d, ev.num_speculative_tokens, base)
        per_prompt[d["name"]] = data["results"]
        rows.append(build_row(d, draft_path(d), data, base, cfg, ev.num_speculative_tokens))
    best = pick_best(rows, ev.select_metric)
    best_draft = next(d for d in drafts if d["name"] == best["checkpoint"])
    sweep = []
    for k in tqdm(ev.k_sweep, desc=f"k sweep {best['checkpoint']}", dynamic_ncols=True):
        data = runner.evaluate(best_draft, k, base)
        sweep.append(sweep_entry(build_row(best_draft, best["path"], data, base, cfg, k)))
    return rows, best, sweep, compare_drafts(drafts, per_prompt, cfg.run.seed)


def compare_drafts(drafts: list[dict], per_prompt: dict[str, list[dict]], seed: int) -> list[dict]:
    """The last distilled checkpoint against the CE twin and the untrained init, paired by prompt.

    These are the two claims a run's report makes (the loss beats plain cross-entropy, the
    training beats doing nothing); the paired bootstrap interval says whether the prompts
    measured can tell the drafts apart.
    """
    out = []
    for kind in dict.fromkeys(d.get("kind", "independent") for d in drafts):  # each kind's own
        mine = [d for d in drafts if d.get("kind", "independent") == kind]
        distilled = [d for d in mine if d.get("role") == "distilled"]
        if not distilled:
            continue
        last = distilled[-1]
        for other in (d for d in mine if d.get("role") in ("ce_twin", "init")):
            diff = metrics.paired_acceptance_diff(
                per_prompt[last["name"]], per_prompt[other["name"]], seed=seed
            )
            if diff is not None:
                out.append(
                    {"draft": last["name"], "against": other["name"], "role": other["role"], **diff}
                )
    return out


def run_evaluate(cfg: Config) -> None:
    ev = cfg.evaluate
    eval_dir = cfg.output_dir / "eval"
    results_dir = eval_dir / "results"
    clean_stale_temps(eval_dir)
    clean_stale_temps(results_dir)
    prompts = select_prompts(load_prompts(cfg.output_dir), ev.max_prompts)
    drafts = list_drafts(cfg.output_dir, ev.baselines, cfg.distill.ce_baseline, cfg.draft.kinds)
    if ev.backend == "vllm":
        from draftsmith.evaluate.vllm_backend import vllm_rows

        rows, best, sweep = vllm_rows(cfg, prompts, drafts)
        comparisons = []  # vLLM reports pooled counters, not per-prompt ones
    else:
        rows, best, sweep, comparisons = _native_rows(cfg, prompts, drafts, results_dir)
    board = {
        "select_metric": ev.select_metric,
        "best": best["checkpoint"],
        "best_path": best["path"],
        "recommended_k": recommend_k(sweep) if sweep else ev.num_speculative_tokens,
        "k_sweep": sweep,
        "hardware": hardware(),
        "target": cfg.target.model,
        "backend": ev.backend,
        "rows": rows,
        "comparisons": comparisons,
    }
    report.write_reports(cfg, board, eval_dir)
