"""`draftsmith evaluate CONFIG`: every checkpoint ranked exactly, the best ones decoded for real.

Flow, for every named eval set of data/eval_prompts.jsonl (each capped by evaluate.max_prompts;
with evaluate.turn2 also `<set>-turn2`, evaluate/turn2.py):
  1. the target-only baseline: every prompt decoded by the engine without a draft (its
     timings, and at temperature 0 the target's own greedy output);
  2. every draft on every prompt at k = evaluate.num_speculative_tokens: greedy, one
     teacher-forced pass over the target's output replayed into the engine's exact counts
     (each draft kind's own replay, draftsmith/kinds.py: evaluate/teacher_forced.py for an
     independent draft, one per k for an EAGLE-3 head);
     sampled, the engine itself;
  3. greedy: the real engine on the best draft of each kind and the drafts in
     `comparisons`, on at most evaluate.engine_max_prompts prompts per set: wall clock,
     cost ratios, the losslessness check, and a check that its counts equal the replay's;
  4. the best draft by evaluate.select_metric on evaluate.primary_eval_set, its k sweep on
     that set and its draft/verify costs timed robustly (evaluate/timing.py) -> the
     recommended k (ranking.recommend_k);
  5. leaderboard.{json,csv}, plots, a printed table and a W&B log (evaluate/report.py).

Every row carries `eval_set` and `measured_by`: "teacher_forced" (exact counts over every
prompt of the set, no timings) or "engine" (real decoding of its `num_prompts` prompts).

Cache files live in <out>/eval/results/: `target-only-<set>-<settings>.json`,
`<draft>-<set>-tf.json` (the teacher-forced pass; `-tf-k<k>.json` for a kind whose pass
depends on k), `<draft>-<set>-k<k>-t<temperature>.json`
(the engine), `costs-<draft>-<settings>.json` (the timing) and
`turn1-answers-<set>-<settings>.json`, each holding the settings they were measured under;
a file whose settings differ (other prompts, max_new_tokens, target, a rewritten
checkpoint) is measured again. Models are identified by content
(models.model_fingerprint), so a copied run dir reuses its results. Writes are atomic, so a
killed run leaves no half result.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import zlib
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics, report, teacher_forced, timing, turn2
from draftsmith.evaluate.engine import SamplingConfig, SpeculativeDecoder
from draftsmith.evaluate.prompts import (
    check_drafts,
    eval_sets,
    list_drafts,
    load_prompts,
    primary_set,
    select_prompts,
)
from draftsmith.evaluate.ranking import (
    check_lossless,
    costed_sweep_entry,
    draft_path,
    dynamic_sweep_entry,
    pick_best,
    rankable,
    recommend_k,
)
from draftsmith.fast_linear import few_row_counts
from draftsmith.io import atomic_write_json, clean_stale_temps, kill_hook
from draftsmith.kinds import kind_of
from draftsmith.models import (
    check_tokenizers_compatible,
    eos_token_ids,
    load_model,
    load_target,
    load_target_config,
    load_target_tokenizer,
    load_tokenizer,
    model_fingerprint,
    pick_device,
    pick_dtype,
    resolve_model,
)
from draftsmith.rundir import record_config
from draftsmith.vocab import token_id_count

# ----------------------------------------------------------------------------- cache keys


def _fingerprint(ref: str) -> str:
    """A model's content fingerprint; a hub id or registry name stands for itself."""
    return model_fingerprint(ref) or ref


def _prompts_key(prompts: list[dict]) -> str:
    ids = [[p["id"], p["prompt_ids"]] for p in prompts]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def _settings(cfg: Config, prompts: list[dict], target_path: str) -> dict:
    ev = cfg.evaluate
    return {
        "backend": ev.backend,
        "target": _fingerprint(target_path),
        "revision": cfg.target.revision,
        "prompts": _prompts_key(prompts),
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


class Models:
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
        """A draft on the target's device and dtype, once its tokenizer matches the target's.
        The target drafting for itself is a second copy loaded as the target is (revision,
        dtype), so the check exercises what the target run uses."""
        if draft.get("role") == "sanity":
            return load_target(self.cfg.target, self.device, self.dtype)
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
    """Runs and caches the torch engine, the teacher-forced replay and the cost timing."""

    def __init__(self, cfg: Config, results_dir: Path, models: Models | None = None):
        self.cfg, self.dir = cfg, results_dir
        self.models = models or Models(cfg)
        self.target_path = resolve_model(cfg.target.model, "target.model")
        self.sampling = _sampling(cfg)
        self._draft_cache: dict[str, object] = {}
        self._passes: dict[tuple, list[dict]] = {}
        self.kernels: dict | None = None  # evaluate.cpu_few_row_linear's choice (few_rows)

    def settings(self, prompts: list[dict]) -> dict:
        return _settings(self.cfg, prompts, self.target_path)

    def _cached(self, path: Path, settings: dict, make) -> dict:
        """The file's data when its settings match, else make() written there (atomically)."""
        hit = _load_cached(path, settings)
        if hit is not None:
            return hit
        data = {"settings": settings, **make()}
        atomic_write_json(path, data)
        return data

    def _eos(self):
        return eos_token_ids(self.models.tokenizer(), self.models.target().generation_config)

    def _decoder(self, proposer, k: int, stop_below: float | None = None) -> SpeculativeDecoder:
        return SpeculativeDecoder(
            self.models.target(),
            proposer,
            k=k,
            sampling=self.sampling,
            eos_ids=self._eos(),
            few_row_linear=self.few_rows() if proposer is not None else False,
            num_ids=token_id_count(self.models.tokenizer()),
            stop_below=stop_below,
        )

    def few_rows(self) -> list[int]:
        """The forward widths whose matmuls take the W @ x^T form (evaluate.cpu_few_row_linear;
        auto: timed against F.linear on the target once per run and machine, cached)."""
        if self.kernels is None:
            self.kernels = self._kernels()
        return self.kernels["few_rows"]

    def _kernels(self) -> dict:
        ev, device = self.cfg.evaluate, self.models.device
        if ev.cpu_few_row_linear != "auto" or device.type != "cpu":
            rows = sorted(few_row_counts(ev.cpu_few_row_linear and device.type == "cpu"))
            return {"few_rows": rows, "by": "config" if device.type == "cpu" else "device"}
        widths = list(range(2, max([*ev.k_sweep, ev.num_speculative_tokens]) + 2))
        settings = {
            "target": _fingerprint(self.target_path),
            "dtype": self.cfg.target.dtype,
            "device": self.cfg.run.device,
            "hardware": hardware(),
            "widths": widths,
        }
        path = self.dir / f"kernels-{_settings_key(settings)}.json"

        def make():
            # the cost does not depend on the token values: a fixed 128-token context
            vocab = token_id_count(self.models.tokenizer())
            context = [t % vocab for t in range(1000, 1128)]
            repeats = max(5, ev.cost_repeats // 3)
            return {**timing.choose_few_rows(self.models.target(), context, widths, repeats)}

        data = self._cached(path, settings, make)
        print(
            f"[evaluate] few-row matmuls (W @ x^T) measured faster at widths "
            f"{data['few_rows'] or 'none'} of {widths}; F.linear elsewhere"
        )
        return {**data, "by": "measured"}

    def draft_model(self, draft: dict):
        """The module `draft`'s kind runs (an HF model, or an EAGLE-3 head on the target)."""
        if draft["name"] not in self._draft_cache:  # keep one draft loaded
            self._draft_cache = {draft["name"]: kind_of(draft).load(draft, self.models)}
        return self._draft_cache[draft["name"]]

    # -- the target alone -------------------------------------------------------------------

    def baseline(self, name: str, prompts: list[dict]) -> list[dict]:
        settings = self.settings(prompts)
        path = self.dir / f"target-only-{_safe(name)}-{_settings_key(settings)}.json"

        def make():
            decoder = self._decoder(None, 0)
            return {"results": decode_prompts(decoder, prompts, self.cfg, f"target-only {name}")}

        return self._cached(path, settings, make)["results"]

    # -- the teacher-forced replay (greedy) -------------------------------------------------

    def teacher_forced(self, draft: dict, name: str, prompts: list[dict], base: list[dict], k):
        """Per prompt the kind's teacher-forced record (with "margin") over the target's greedy
        output (`base`): one pass for every k, or one per k for a kind whose pass depends on it."""
        kind = kind_of(draft)
        replay = kind.replay()
        at = k if replay.per_k else None
        key = (draft["name"], name, at)
        if key in self._passes:
            return self._passes[key]
        settings = {
            **self.settings(prompts),
            "draft": _fingerprint(draft["ref"]),
            "replay": kind.name,
        }
        suffix = ""
        if at is not None:
            settings["k"], suffix = at, f"-k{at}"
        path = self.dir / f"{_safe(draft['name'])}-{_safe(name)}-tf{suffix}.json"

        def make():
            model, vocab = self.draft_model(draft), token_id_count(self.models.tokenizer())
            budget = self.cfg.evaluate.max_new_tokens
            out = []
            for p, b in zip(prompts, base):
                record = replay.teacher_forced_pass(
                    model, self.models.target, p["prompt_ids"], b["tokens"], vocab, k, budget
                )
                out.append({"id": p["id"], **record})
            return {"results": out}

        results = self._cached(path, settings, make)["results"]
        kill_hook(f"evaluate:{draft['name']}:{name}:tf")
        self._passes[key] = results
        return results

    def replayed(self, draft: dict, name: str, prompts: list[dict], base: list[dict], k: int):
        """Per-prompt results with the engine's count fields at k, from the replay."""
        budget, replay = self.cfg.evaluate.max_new_tokens, kind_of(draft).replay()
        return [
            {
                "id": b["id"],
                "category": b["category"],
                "margin": a["margin"],
                **replay.result(a, b["tokens"], k, budget),
            }
            for a, b in zip(self.teacher_forced(draft, name, prompts, base, k), base)
        ]

    # -- the engine ---------------------------------------------------------------------------

    def engine(
        self,
        draft: dict,
        name: str,
        prompts: list[dict],
        base: list[dict],
        k: int,
        stop_below: float | None = None,
    ):
        """{"lossless_match_rate", "results"} of `draft` at k on these prompts (cached);
        `stop_below`: dynamic lookahead (engine.DraftContext.stop_below)."""
        settings = {**self.settings(prompts), "draft": _fingerprint(draft["ref"]), "k": k}
        t = self.cfg.evaluate.temperature
        stop = ""
        if stop_below is not None:
            settings["stop_below"], stop = stop_below, f"-stop{stop_below:g}"
        path = self.dir / f"{_safe(draft['name'])}-{_safe(name)}-k{k}{stop}-t{t:g}.json"

        def make():
            proposer = kind_of(draft).proposer(self.draft_model(draft))
            decoder = self._decoder(proposer, k, stop_below)
            results = decode_prompts(decoder, prompts, self.cfg, f"{draft['name']} {name} k={k}")
            return {"results": results}

        # decoded outputs are cached before they are checked: a failed check loses no
        # decoding, and a rerun (e.g. with on_mismatch=warn) checks the same outputs again
        data = self._cached(path, settings, make)
        kill_hook(f"evaluate:{draft['name']}:{name}:k{k}")
        rate, ties = None, None  # sampled: no token-for-token check
        if self.sampling.greedy:
            prompt_ids = {p["id"]: p["prompt_ids"] for p in prompts}
            rate, ties = check_lossless(
                draft["name"],
                data["results"],
                base,
                self.cfg.evaluate.on_mismatch,
                tie_gap=lambda s, b, pos: self._target_gap(prompt_ids[b["id"]], s, b, pos),
                tolerance=self.near_tie,
                where=f"; decoded outputs kept in {path} (delete it to decode again)",
            )
        return {**data, "lossless_match_rate": rate, "lossless_ties": ties}

    @property
    def near_tie(self) -> float:
        """How close two logits may be for another summation order to argmax otherwise:
        sqrt of the target dtype's machine epsilon, relative (3.5e-4 fp32, 0.088 bf16)."""
        return math.sqrt(torch.finfo(self.models.dtype).eps)

    def _target_gap(self, prompt_ids, spec: dict, base: dict, pos: int) -> float | None:
        """The target's relative logit gap between its own token and the speculative one at
        a first divergence, from one forward over the prompt and the shared prefix (a third
        summation order beside the verify pass and the 1-token decode). None where one
        output merely ends earlier: no two tokens to compare."""
        if pos >= min(len(spec["tokens"]), len(base["tokens"])):
            return None
        target = self.models.target()
        ids = list(prompt_ids) + list(base["tokens"][:pos])
        with torch.no_grad():
            out = target(input_ids=torch.tensor([ids], device=target.device), logits_to_keep=1)
        logits = out.logits[0, -1].float()  # (V,)
        own, other = logits[base["tokens"][pos]], logits[spec["tokens"][pos]]
        return ((own - other).abs() / own.abs().clamp_min(1.0)).item()

    def engine_row(
        self,
        draft: dict,
        name: str,
        prompts: list[dict],
        base: list[dict],
        k: int,
        stop_below: float | None = None,
    ):
        """Greedy: the engine on the set's first evaluate.engine_max_prompts prompts (round
        robin over categories), its counts checked against the replay's (fixed k: the replay
        has no dynamic lookahead to check against)."""
        chosen = {id(p) for p in select_prompts(prompts, self.cfg.evaluate.engine_max_prompts)}
        idx = [i for i, p in enumerate(prompts) if id(p) in chosen]
        sub, sub_base = [prompts[i] for i in idx], [base[i] for i in idx]
        data = self.engine(draft, name, sub, sub_base, k, stop_below)
        row = build_row(
            draft, data["results"], sub_base, self.cfg, k, name, "engine", data, prompts=sub
        )
        if stop_below is not None:
            return {**row, "stop_threshold": stop_below}
        replayed = self.replayed(draft, name, prompts, base, k)
        row["replay_match_rate"] = teacher_forced.check_replay(
            f"{draft['name']} on {name} at k={k}",
            data["results"],
            [replayed[i] for i in idx],
            sub_base,
            near_tie=self.near_tie,
        )
        return row

    # -- costs and the k sweep ----------------------------------------------------------------

    def costs(self, draft: dict, prompts: list[dict], base: list[dict], ks: list[int]) -> dict:
        """c and v_k of `draft`, timed on the set's median-length prompt + the target's output."""
        ev = self.cfg.evaluate
        settings = {
            **self.settings(prompts),
            "draft": _fingerprint(draft["ref"]),
            "ks": sorted(set(ks)),
            "repeats": ev.cost_repeats,
        }
        path = self.dir / f"costs-{_safe(draft['name'])}-{_settings_key(settings)}.json"

        def make():
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]["prompt_ids"]))
            i = order[len(order) // 2]
            output = base[i]["tokens"]
            context = list(prompts[i]["prompt_ids"]) + list(output)
            model = self.draft_model(draft)
            step = kind_of(draft).replay().draft_step(model, self.models.target, context, output[0])
            target = self.models.target()
            few = self.few_rows()
            return timing.measure_costs(
                target, step, context, output, settings["ks"], ev.cost_repeats, few, draft=model
            )

        return self._cached(path, settings, make)

    def sweep(self, draft: dict, name: str, prompts: list[dict], base: list[dict]):
        """The k sweep of `draft` on one set: acceptance per k on every prompt (replayed when
        greedy), the engine's wall clock, and the modelled speedup from the timed costs."""
        ev = self.cfg.evaluate
        costs = self.costs(draft, prompts, base, ev.k_sweep)
        out = []
        for k in ev.k_sweep:
            if self.sampling.greedy:
                results = self.replayed(draft, name, prompts, base, k)
                acc = build_row(
                    draft, results, base, self.cfg, k, name, "teacher_forced", prompts=prompts
                )
                eng = self.engine_row(draft, name, prompts, base, k)
            else:
                data = self.engine(draft, name, prompts, base, k)
                acc = eng = build_row(
                    draft, data["results"], base, self.cfg, k, name, "engine", data, prompts
                )
            out.append(costed_sweep_entry(acc, eng, costs))
        for t in ev.stop_thresholds:  # dynamic lookahead: the engine's own counts
            k = max(ev.k_sweep)
            if self.sampling.greedy:
                row = self.engine_row(draft, name, prompts, base, k, t)
            else:
                data = self.engine(draft, name, prompts, base, k, t)
                row = build_row(draft, data["results"], base, self.cfg, k, name, "engine", data)
                row["stop_threshold"] = t
            out.append(dynamic_sweep_entry(row, costs))
        return out, costs


# ----------------------------------------------------------------------------- rows and ranking


def build_row(
    draft: dict,
    results: list[dict],
    base: list[dict],
    cfg: Config,
    k: int,
    eval_set: str,
    measured_by: str,
    data: dict | None = None,
    prompts: list[dict] | None = None,
) -> dict:
    """One leaderboard row: `draft` at k on `eval_set`, from per-prompt results (`data`: the
    engine's cache entry, for the lossless check; `prompts`, aligned with the results: their
    ids, for the echo split)."""
    engine = measured_by == "engine"
    speedups = metrics.per_prompt_speedups(results, base) if engine else []
    q = metrics.quartiles(speedups) if speedups else None
    ids = [p["prompt_ids"] for p in prompts] if prompts is not None else None
    categories = [r["category"] for r in results]
    return {
        "checkpoint": draft["name"],
        "path": draft_path(draft),
        "step": draft["step"],
        "role": draft.get("role"),
        "kind": draft.get("kind") or "independent",
        "trained_steps": draft["trained_steps"],
        "eval_set": eval_set,
        "measured_by": measured_by,
        **metrics.summarize(results, base, k, ids),
        "speedup_iqr": [q[0], q[2]] if q else None,
        "per_category": metrics.per_category(results, base, categories, k, ids),
        "lossless_match_rate": (data or {}).get("lossless_match_rate"),
        # prompts whose output left the target's at a numerical near-tie (check_lossless)
        "lossless_ties": len(data["lossless_ties"])
        if (data or {}).get("lossless_ties") is not None
        else None,
        "num_speculative_tokens": k,
        "temperature": cfg.evaluate.temperature,
        "backend": cfg.evaluate.backend,
    }


def hardware() -> str:
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def compared(drafts: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Per kind: its last distilled checkpoint and the drafts it is compared with (its own
    CE twin and init; a kind is never compared with another kind's drafts)."""
    out = []
    for kind in dict.fromkeys(d.get("kind") or "independent" for d in drafts):
        mine = [d for d in drafts if (d.get("kind") or "independent") == kind]
        distilled = [d for d in mine if d.get("role") == "distilled"]
        if distilled:
            out.append((distilled[-1], [d for d in mine if d.get("role") in ("ce_twin", "init")]))
    return out


def compare_drafts(drafts: list[dict], per_prompt: dict[str, list[dict]], seed: int) -> list[dict]:
    """Each kind's last distilled checkpoint against its CE twin and untrained init, paired by
    prompt.

    These are the two claims a run's report makes (the loss beats plain cross-entropy, the
    training beats doing nothing); the paired bootstrap interval says whether the prompts
    measured can tell the drafts apart. Greedy per-prompt counts come from the replay: exact.
    """
    out = []
    for last, others in compared(drafts):
        for other in others:
            diff = metrics.paired_diff_by_category(
                per_prompt[last["name"]], per_prompt[other["name"]], seed=seed
            )
            if diff is not None:
                out.append(
                    {"draft": last["name"], "against": other["name"], "role": other["role"], **diff}
                )
    return out


def compare_kinds(rows: list[dict], per_prompt: dict[str, list[dict]], metric: str, seed: int):
    """With drafts of more than one kind: the best of each kind (by `metric` on these rows)
    against the best of every other kind, paired by prompt: which kind pays on this set."""
    ranked = rankable(rows)
    kinds = list(dict.fromkeys(r["kind"] for r in ranked))
    best = [pick_best([r for r in ranked if r["kind"] == k], metric) for k in kinds]
    out = []
    for i, a in enumerate(best):
        for b in best[i + 1 :]:
            diff = metrics.paired_diff_by_category(
                per_prompt[a["checkpoint"]], per_prompt[b["checkpoint"]], seed=seed
            )
            if diff is not None:
                row = {"draft": a["checkpoint"], "against": b["checkpoint"], "role": "other_kind"}
                out.append({**row, **diff})
    return out


def engine_drafts(drafts: list[dict], rows: list[dict], metric: str) -> list[dict]:
    """The drafts the engine decodes when greedy: the best of each kind by `metric` (on the
    primary set's rows, aligned with `drafts`) and the drafts of the comparisons."""
    names = {d["name"] for d in drafts if d.get("role") == "sanity"}
    ranked = rankable(rows)
    for kind in dict.fromkeys(r["kind"] for r in ranked):
        names.add(pick_best([r for r in ranked if r["kind"] == kind], metric)["checkpoint"])
    for last, others in compared(drafts):
        names |= {d["name"] for d in [last, *others]}
    return [d for d in drafts if d["name"] in names]


def check_self_draft(rows: list[dict], on_mismatch: str, exact: bool = True) -> list[dict]:
    """The target drafting for itself (evaluate.baselines: [target]) must accept every token
    it is judged on, by replay and by the engine: anything less means the engine, a loader
    or the config is wrong. Greedy rows only (sampled acceptance is min(1, p/q) of two
    passes' floats). One line per row; a failure is an error unless on_mismatch is warn.
    `exact` False (a bf16/fp16 target): a 1-token draft step and a (k+1)-token verify pass
    round real near-ties differently, so a shortfall is reported as a warning, not an error."""
    checked = []
    for r in rows:
        if r.get("role") != "sanity" or r["temperature"] != 0:
            continue
        ok = r["alpha"] == 1.0
        checked.append({"eval_set": r["eval_set"], "measured_by": r["measured_by"], "pass": ok})
        print(
            f"[evaluate] sanity: the target drafting for itself on {r['eval_set']} "
            f"({r['measured_by']}): alpha {r['alpha']:.4f}, "
            f"{r['mean_accepted_length']:.2f} tokens per target forward "
            f"(k={r['num_speculative_tokens']}): {'pass' if ok else 'FAIL'}"
        )
    failed = [c for c in checked if not c["pass"]]
    if failed and not exact:
        print(
            "[evaluate] WARNING the target rejected some of its own tokens in reduced precision: "
            "near-ties round differently in the draft step and the verify pass; run the check "
            "with target.dtype=float32 to make it exact"
        )
        return checked
    if failed and on_mismatch == "error":
        where = ", ".join(f"{c['eval_set']} ({c['measured_by']})" for c in failed)
        raise DraftsmithError(
            f"evaluate.baselines[target]: the target drafting for itself rejected tokens on "
            f"{where}; its acceptance must be 1: check the target's loading and dtype "
            "(evaluate.on_mismatch=warn to keep going)"
        )
    return checked


def _native_board(cfg: Config, sets: dict, primary: str, drafts: list[dict], runner) -> dict:
    ev, k = cfg.evaluate, cfg.evaluate.num_speculative_tokens
    greedy = runner.sampling.greedy
    how = "teacher-forced replay, engine on the best" if greedy else "engine (sampled)"
    print(
        f"[evaluate] {len(drafts)} drafts on {len(sets)} eval sets "
        f"({', '.join(f'{s}: {len(ps)}' for s, ps in sets.items())} prompts), k={k}: {how}"
    )
    bases = {s: runner.baseline(s, ps) for s, ps in sets.items()}
    by = "teacher_forced" if greedy else "engine"
    ranked, ranking_rows = {}, {}
    for d in tqdm(drafts, desc="drafts", dynamic_ncols=True):
        for s, ps in sets.items():
            if greedy:
                ranked[d["name"], s] = runner.replayed(d, s, ps, bases[s], k)
                data = None
            else:
                data = runner.engine(d, s, ps, bases[s], k)
                ranked[d["name"], s] = data["results"]
            row = build_row(d, ranked[d["name"], s], bases[s], cfg, k, s, by, data, ps)
            ranking_rows[d["name"], s] = row
    engine_rows = {}
    by_speed = ev.select_metric == "speedup"
    if greedy:
        primary_rows = [ranking_rows[d["name"], primary] for d in drafts]
        # speedup needs the engine: the candidates are then the best by tokens per forward
        chosen = engine_drafts(
            drafts, primary_rows, "mean_accepted_length" if by_speed else ev.select_metric
        )
        for d in tqdm(chosen, desc="engine", dynamic_ncols=True):
            for s, ps in sets.items():
                engine_rows[d["name"], s] = runner.engine_row(d, s, ps, bases[s], k)
    pool = (
        [r for (_, s), r in engine_rows.items() if s == primary]
        if greedy and by_speed
        else [ranking_rows[d["name"], primary] for d in drafts]
    )
    best = pick_best(rankable(pool), ev.select_metric)
    best_draft = next(d for d in drafts if d["name"] == best["checkpoint"])
    sweep, costs = runner.sweep(best_draft, primary, sets[primary], bases[primary])
    rows = [
        r
        for s in sets
        for d in drafts
        for r in (ranking_rows[d["name"], s], engine_rows.get((d["name"], s)))
        if r is not None
    ]
    replay_metric = "mean_accepted_length" if by_speed else ev.select_metric  # replay rows
    comparisons = []
    for s in sets:
        per_prompt = {d["name"]: ranked[d["name"], s] for d in drafts}
        set_rows = [ranking_rows[d["name"], s] for d in drafts]
        comparisons += [
            {**c, "eval_set": s}
            for c in compare_drafts(drafts, per_prompt, cfg.run.seed)
            + compare_kinds(set_rows, per_prompt, replay_metric, cfg.run.seed)
        ]
    return {
        "rows": rows,
        "best": best,
        "k_sweep": sweep,
        "costs": costs,
        "comparisons": comparisons,
        "kernels": runner.kernels,
    }


# ----------------------------------------------------------------------------- eval sets


def _turn2_sets(cfg: Config, sets: dict, models: Models, results_dir: Path) -> dict:
    """`<set>-turn2` for every set with followups (evaluate.turn2); answers cached."""
    out = {}
    for name, prompts in sets.items():
        asked = turn2.asked_again(prompts)
        if not asked:
            continue
        settings = {
            "target": _fingerprint(resolve_model(cfg.target.model, "target.model")),
            "revision": cfg.target.revision,
            "dtype": cfg.target.dtype,
            "device": cfg.run.device,
            "prompts": _prompts_key(asked),
            "answer_tokens": cfg.evaluate.turn2_answer_tokens,
        }
        path = results_dir / f"turn1-answers-{_safe(name)}-{_settings_key(settings)}.json"
        data = _load_cached(path, settings)
        if data is None:
            ids = turn2.target_answers(models.target(), models.tokenizer(), cfg, asked)
            texts = [models.tokenizer().decode(t, skip_special_tokens=True).strip() for t in ids]
            data = {"settings": settings, "answers": texts}
            atomic_write_json(path, data)
        ctx = getattr(load_target_config(cfg.target), "max_position_embeddings", None)
        limit = ctx - cfg.evaluate.max_new_tokens if ctx else None
        prompts2, too_long = turn2.turn2_prompts(
            asked, data["answers"], cfg, models.tokenizer(), limit
        )
        if too_long:
            print(
                f"[evaluate] {name}{turn2.SUFFIX}: {too_long} prompts over {limit} tokens left out"
            )
        if prompts2:
            out[name + turn2.SUFFIX] = prompts2
    return out


def choose_primary(cfg: Config, sets: dict) -> str:
    """The primary set's name, checked before any work (turn-2 sets count by name)."""
    names = list(sets)
    if cfg.evaluate.turn2:
        names += [s + turn2.SUFFIX for s, ps in sets.items() if turn2.asked_again(ps)]
    return primary_set(dict.fromkeys(names), cfg.evaluate.primary_eval_set)


def with_turn2(cfg: Config, sets: dict, primary: str, models: Models, results_dir: Path):
    """The sets, the primary first, with `<set>-turn2` added under evaluate.turn2."""
    if cfg.evaluate.turn2:
        sets = sets | _turn2_sets(cfg, sets, models, results_dir)
    if primary not in sets:
        raise DraftsmithError(
            f"evaluate.primary_eval_set: every prompt of {primary!r} is too long for the target"
        )
    return {primary: sets[primary], **sets}


def run_evaluate(cfg: Config) -> None:
    ev = cfg.evaluate
    eval_dir = cfg.output_dir / "eval"
    results_dir = eval_dir / "results"
    clean_stale_temps(eval_dir)
    clean_stale_temps(results_dir)
    sets = eval_sets(load_prompts(cfg.output_dir), ev.max_prompts)
    primary = choose_primary(cfg, sets)
    drafts = list_drafts(
        cfg.output_dir, ev.baselines, cfg.distill.ce_baseline, cfg.draft.kinds, cfg.target.model
    )
    check_drafts(cfg, drafts)  # files whole, tokenizers the target's: before any decoding
    record_config(cfg)
    models = Models(cfg)
    sets = with_turn2(cfg, sets, primary, models, results_dir)
    if ev.backend == "vllm":
        from draftsmith.evaluate.vllm_backend import vllm_rows

        rows, best, sweep = vllm_rows(cfg, sets, drafts, primary)
        out = {"rows": rows, "best": best, "k_sweep": sweep, "costs": None, "comparisons": []}
    else:
        out = _native_board(cfg, sets, primary, drafts, NativeEvaluator(cfg, results_dir, models))
    sweep = out["k_sweep"]
    rec = recommend_k(sweep) if sweep else {"k": ev.num_speculative_tokens, "by": None}
    engine_n = ev.engine_max_prompts if ev.backend == "native" and ev.temperature == 0 else None
    board = {
        "select_metric": ev.select_metric,
        "primary_eval_set": primary,
        "eval_sets": {
            s: {
                "num_prompts": len(ps),
                "engine_prompts": min(engine_n or len(ps), len(ps)),
                "categories": sorted({p["category"] for p in ps}),
            }
            for s, ps in sets.items()
        },
        "best": out["best"]["checkpoint"],
        "best_path": out["best"]["path"],
        "recommended_k": rec["k"],
        "k_recommendation": rec,
        "k_sweep": sweep,
        "costs": out["costs"],
        "kernels": out.get("kernels"),  # which few-row matmul form the engine used, and why
        "hardware": hardware(),
        "target": cfg.target.model,
        "backend": ev.backend,
        "rows": out["rows"],
        "comparisons": out["comparisons"],
    }
    report.write_reports(cfg, board, eval_dir)
    check_self_draft(board["rows"], ev.on_mismatch, exact=models.dtype == torch.float32)
