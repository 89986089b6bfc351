"""The native evaluation run: the models, its cached results and the NativeEvaluator.

NativeEvaluator runs and caches the torch engine, each kind's teacher-forced replay and the
cost timing for the evaluate stage (evaluate/stage.py has the flow, evaluate/board.py turns
results into leaderboard rows). Cache files live in <out>/eval/results/:
`target-only-<set>-<settings>.json`, `<draft>-<set>-tf.json` (the teacher-forced pass;
`-tf-k<k>.json` for a kind whose pass depends on k), `<draft>-<set>-k<k>[-stop<t>]-t<temperature>.json`
(the engine), `costs-<draft>-<settings>.json` (the timing), `kernels-<settings>.json` (the
linear layers' form per forward width) and `turn1-answers-<set>-<settings>.json`, each holding the settings
they were measured under; a file whose settings differ (other prompts, max_new_tokens,
target, a rewritten checkpoint) is measured again. Models are identified by content
(models.model_fingerprint), so a copied run dir reuses its results. Writes are atomic, so a
killed run leaves no half result.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from pathlib import Path

from tqdm.auto import tqdm

from draftsmith.config import Config
from draftsmith.evaluate import teacher_forced, timing
from draftsmith.evaluate.board import build_row
from draftsmith.evaluate.engine import SamplingConfig, SpeculativeDecoder
from draftsmith.evaluate.prompts import select_prompts
from draftsmith.evaluate.ranking import (
    check_lossless,
    costed_sweep_entry,
    dynamic_sweep_entry,
    near_tie_tolerance,
    target_tie_gap,
)
from draftsmith.evaluate.records import DraftEntry
from draftsmith.fast_linear import FEW_ROW, FORMS, choose_linear_forms, few_row_counts
from draftsmith.io import cached_json, kill_hook
from draftsmith.kinds import kind_of
from draftsmith.models import (
    check_tokenizers_compatible,
    eos_token_ids,
    hardware,
    load_model,
    load_target,
    load_target_tokenizer,
    load_tokenizer,
    model_key,
    pick_device,
    pick_dtype,
    resolve_model,
)
from draftsmith.quant_draft import quantize_draft
from draftsmith.vocab_rows import token_id_count

# ----------------------------------------------------------------------------- cache keys


def prompts_key(prompts: list[dict]) -> str:
    ids = [[p["id"], p["prompt_ids"]] for p in prompts]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def run_settings(cfg: Config, prompts: list[dict], target_path: str) -> dict:
    ev = cfg.evaluate
    return {
        "backend": ev.backend,
        "target": model_key(target_path),
        "revision": cfg.target.revision,
        "prompts": prompts_key(prompts),
        "max_new_tokens": ev.max_new_tokens,
        "temperature": ev.temperature,
        "top_p": ev.top_p,
        "top_k": ev.top_k,
        "seed": cfg.run.seed,
        "device": cfg.run.device,
        "dtype": cfg.target.dtype,
        "cpu_few_row_linear": ev.cpu_few_row_linear,  # changes timings, not tokens
        "linear_forms": list(FORMS),  # the forms it picks from (timings made without one differ)
        # the machine: every timing is its own, and bf16 kernels may round ties otherwise; a
        # run dir moved to another CPU is measured again rather than mixing two machines
        "hardware": hardware(),
    }


def settings_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-")


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

    def draft(self, draft: DraftEntry):
        """A draft on the target's device and dtype, once its tokenizer matches the target's.
        The target drafting for itself is a second copy loaded as the target is (revision,
        dtype), so the check exercises what the target run uses."""
        if draft.role == "sanity":
            return load_target(self.cfg.target, self.device, self.dtype)
        key, trust = draft.config_key, self.cfg.target.trust_remote_code
        tok = load_tokenizer(draft.ref, trust_remote_code=trust, key=key)
        model = load_model(
            draft.ref, device=self.device, dtype=self.dtype, trust_remote_code=trust, key=key
        )
        for note in check_tokenizers_compatible(
            self.tokenizer(),
            tok,
            self.cfg.target.model,
            draft.name,
            draft_vocab_rows=model.get_input_embeddings().num_embeddings,
        ):
            print(f"[evaluate] {draft.name}: note: {note}")
        return model


def sampling_of(cfg: Config) -> SamplingConfig:
    ev = cfg.evaluate
    return SamplingConfig(temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k)


def _warm_up(decoder: SpeculativeDecoder, prompts: list[dict], cfg: Config) -> None:
    """One short untimed decode, so no prompt's timing pays first-call costs."""
    decoder.generate(prompts[0]["prompt_ids"], min(4, cfg.evaluate.max_new_tokens), seed=0)


def _decode_one(decoder: SpeculativeDecoder, p: dict, cfg: Config) -> dict:
    """One prompt's result dict, under its own seed."""
    seed = prompt_seed(cfg.run.seed, p["id"])
    res = decoder.generate(p["prompt_ids"], cfg.evaluate.max_new_tokens, seed=seed)
    return {"id": p["id"], "category": p["category"], **res.to_dict()}


def decode_prompts(decoder: SpeculativeDecoder, prompts: list[dict], cfg: Config, desc: str):
    """Decode every prompt (after one short untimed warm-up) -> per-prompt result dicts."""
    _warm_up(decoder, prompts, cfg)
    return [
        _decode_one(decoder, p, cfg)
        for p in tqdm(prompts, desc=desc, leave=False, dynamic_ncols=True)
    ]


def decode_paired(
    decoder: SpeculativeDecoder,
    alone: SpeculativeDecoder,
    prompts: list[dict],
    cfg: Config,
    desc: str,
) -> tuple[list[dict], list[dict]]:
    """decode_prompts with `decoder` and with the target `alone`, prompt by prompt, the two
    back to back in an order that alternates: (speculative results, target-only results)
    timed in the same minutes, so a drift in the machine's speed hits both alike."""
    _warm_up(decoder, prompts, cfg)
    _warm_up(alone, prompts, cfg)
    spec, base = [], []
    for i, p in enumerate(tqdm(prompts, desc=desc, leave=False, dynamic_ncols=True)):
        if i % 2:
            spec.append(_decode_one(decoder, p, cfg))
            base.append(_decode_one(alone, p, cfg))
        else:
            base.append(_decode_one(alone, p, cfg))
            spec.append(_decode_one(decoder, p, cfg))
    return spec, base


# The target-only fields a paired engine run replaces in the set's baseline rows: its timings
PAIRED_TIMINGS = ("wall_time", "target_1tok_time", "target_1tok_n", "target_prefill_time")


def timing_base(base: list[dict], data: dict) -> list[dict]:
    """The baseline rows an engine run's speedups divide by: with its paired target-only
    decodes (evaluate.paired_baseline), their timings; else the set's baseline as it is."""
    paired = data.get("paired")
    if paired is None:
        return base
    return [{**b, **{k: p[k] for k in PAIRED_TIMINGS}} for b, p in zip(base, paired)]


class NativeEvaluator:
    """Runs and caches the torch engine, the teacher-forced replay and the cost timing."""

    def __init__(self, cfg: Config, results_dir: Path, models: Models | None = None):
        self.cfg, self.dir = cfg, results_dir
        self.models = models or Models(cfg)
        self.target_path = resolve_model(cfg.target.model, "target.model")
        self.sampling = sampling_of(cfg)
        self._draft_cache: dict[str, object] = {}
        self._passes: dict[tuple, list[dict]] = {}
        self.kernels: dict | None = None  # evaluate.cpu_few_row_linear's choice (forms)
        # evaluate.draft_weights: per draft, quantize_draft's choice
        self.quant: dict[str, dict] = {}

    timing_base = staticmethod(timing_base)  # for evaluate/board.py, which native imports

    def settings(self, prompts: list[dict]) -> dict:
        return run_settings(self.cfg, prompts, self.target_path)

    def draft_settings(self, draft: DraftEntry) -> dict:
        """What identifies a draft's results: its content, and the rounding of its weights
        (evaluate.draft_weights changes its proposals and its cost, not the target's)."""
        return {"draft": model_key(draft.ref), "draft_weights": self.cfg.evaluate.draft_weights}

    def _eos(self):
        return eos_token_ids(self.models.tokenizer(), self.models.target().generation_config)

    def _decoder(
        self, proposer, k: int, stop_below: float | None = None, second_min: float | None = None
    ) -> SpeculativeDecoder:
        return SpeculativeDecoder(
            self.models.target(),
            proposer,
            k=k,
            sampling=self.sampling,
            eos_ids=self._eos(),
            linear_forms=self.linear_forms(),  # target-only too: the baseline at its fastest
            num_ids=token_id_count(self.models.tokenizer()),
            stop_below=stop_below,
            second_choice_min=second_min,
        )

    def linear_forms(self) -> dict[str, str]:
        """{forward width: form of its linear layers} (evaluate.cpu_few_row_linear; auto: each
        form timed against F.linear on the target once per run and machine, cached)."""
        if self.kernels is None:
            self.kernels = self._kernels()
        return self.kernels["forms"]

    def _kernels(self) -> dict:
        ev, device = self.cfg.evaluate, self.models.device
        if ev.cpu_few_row_linear != "auto" or device.type != "cpu":
            rows = few_row_counts(ev.cpu_few_row_linear and device.type == "cpu")
            forms = {str(w): FEW_ROW for w in sorted(rows)}
            return {"forms": forms, "by": "config" if device.type == "cpu" else "device"}
        widths = list(range(1, max([*ev.k_sweep, ev.num_speculative_tokens]) + 2))
        settings = {
            "target": model_key(self.target_path),
            "dtype": self.cfg.target.dtype,
            "device": self.cfg.run.device,
            "hardware": hardware(),
            "widths": widths,
            "forms_timed": list(FORMS),
        }
        path = self.dir / f"kernels-{settings_key(settings)}.json"

        def make():
            # the cost does not depend on the token values: a fixed 128-token context
            vocab = token_id_count(self.models.tokenizer())
            context = [t % vocab for t in range(1000, 1128)]
            repeats = max(5, ev.cost_repeats // 3)
            return choose_linear_forms(self.models.target(), context, widths, repeats)

        data = cached_json(path, settings, make)
        chosen = ", ".join(f"{w}: {form}" for w, form in data["forms"].items())
        print(
            f"[evaluate] linear layers by forward width (timed faster than F.linear): "
            f"{chosen or 'none'} of widths {widths}; F.linear elsewhere"
        )
        return {**data, "by": "measured"}

    def draft_model(self, draft: DraftEntry):
        """The module `draft`'s kind runs (an HF model, or a head on the target)."""
        if draft.name not in self._draft_cache:  # keep one draft loaded
            module = kind_of(draft).load(draft, self.models)
            weights = self.cfg.evaluate.draft_weights
            if weights != "as_loaded":
                earlier = self.quant.get(draft.name)  # reloaded: its first load's widths
                widths = earlier and earlier["kernel_widths"]
                info = quantize_draft(module, weights, self.models.target(), widths)
                self.quant[draft.name] = {**info, "ms": (earlier or info)["ms"]}
                if earlier is None:  # said once per draft
                    print(
                        f"[evaluate] {draft.name}: {info['layers']} linear layers decode with "
                        f"{weights} weights at input widths "
                        f"{info['kernel_widths'] or 'none (timed slower here)'}"
                    )
            self._draft_cache = {draft.name: module}
        return self._draft_cache[draft.name]

    # -- the target alone -------------------------------------------------------------------

    def baseline(self, name: str, prompts: list[dict]) -> list[dict]:
        settings = self.settings(prompts)
        path = self.dir / f"target-only-{safe_name(name)}-{settings_key(settings)}.json"

        def make():
            decoder = self._decoder(None, 0)
            return {"results": decode_prompts(decoder, prompts, self.cfg, f"target-only {name}")}

        rows = cached_json(path, settings, make)["results"]
        if not self.sampling.greedy:  # the split reads greedy outcomes along these tokens
            return rows
        probs = self.own_token_probs(name, prompts, rows)
        return [{**r, "target_p": p} for r, p in zip(rows, probs)]

    def own_token_probs(self, name: str, prompts: list[dict], base: list[dict]) -> list:
        """Per prompt, the target's probability of each token of its own greedy output (one
        teacher-forced forward each, cached): where the target is sure of its token and
        where it is not (metrics.confidence_split)."""
        settings = {**self.settings(prompts), "tokens": settings_key([b["tokens"] for b in base])}
        path = self.dir / f"target-p-{safe_name(name)}-{settings_key(settings)}.json"

        def make():
            target, vocab = self.models.target(), token_id_count(self.models.tokenizer())
            rows = zip(prompts, base)
            return {
                "results": [
                    teacher_forced.own_token_probs(target, p["prompt_ids"], b["tokens"], vocab)
                    for p, b in tqdm(rows, total=len(base), desc=f"target p {name}", leave=False)
                ]
            }

        return cached_json(path, settings, make)["results"]

    # -- the teacher-forced replay (greedy) -------------------------------------------------

    def teacher_forced(
        self, draft: DraftEntry, name: str, prompts: list[dict], base: list[dict], k
    ):
        """Per prompt the kind's teacher-forced record (with "margin") over the target's greedy
        output (`base`): one pass for every k, or one per k for a kind whose pass depends on it."""
        kind = kind_of(draft)
        replay = kind.replay()
        at = k if replay.per_k else None
        key = (draft.name, name, at)
        if key in self._passes:
            return self._passes[key]
        settings = {
            **self.settings(prompts),
            **self.draft_settings(draft),
            "replay": kind.name,
        }
        suffix = ""
        if at is not None:
            settings["k"], suffix = at, f"-k{at}"
        path = self.dir / f"{safe_name(draft.name)}-{safe_name(name)}-tf{suffix}.json"

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

        results = cached_json(path, settings, make)["results"]
        kill_hook(f"evaluate:{draft.name}:{name}:tf")
        self._passes[key] = results
        return results

    def replayed(self, draft: DraftEntry, name: str, prompts: list[dict], base: list[dict], k: int):
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
        draft: DraftEntry,
        name: str,
        prompts: list[dict],
        base: list[dict],
        k: int,
        stop_below: float | None = None,
        second_min: float | None = None,
    ):
        """{"lossless_match_rate", "results"} of `draft` at k on these prompts (cached);
        `stop_below`: dynamic lookahead (engine.DraftContext.stop_below); `second_min`:
        second-choice leaves (engine.second_choice_leaves)."""
        paired = self.cfg.evaluate.paired_baseline
        settings = {**self.settings(prompts), **self.draft_settings(draft), "k": k}
        settings["paired_baseline"] = paired
        t = self.cfg.evaluate.temperature
        suffix = ""
        if stop_below is not None:
            settings["stop_below"], suffix = stop_below, f"-stop{stop_below:g}"
        if second_min is not None:
            settings["second_choice_min"], suffix = second_min, f"{suffix}-2nd{second_min:g}"
        path = self.dir / f"{safe_name(draft.name)}-{safe_name(name)}-k{k}{suffix}-t{t:g}.json"

        def make():
            proposer = kind_of(draft).proposer(self.draft_model(draft))
            decoder = self._decoder(proposer, k, stop_below, second_min)
            desc = f"{draft.name} {name} k={k}"
            if not paired:
                return {"results": decode_prompts(decoder, prompts, self.cfg, desc)}
            alone = self._decoder(None, 0)
            results, base_now = decode_paired(decoder, alone, prompts, self.cfg, desc + " +alone")
            return {"results": results, "paired": base_now}

        # decoded outputs are cached before they are checked: a failed check loses no
        # decoding, and a rerun (e.g. with on_mismatch=warn) checks the same outputs again
        data = cached_json(path, settings, make)
        kill_hook(f"evaluate:{draft.name}:{name}:k{k}")
        rate, ties = None, None  # sampled: no token-for-token check
        if self.sampling.greedy:
            prompt_ids = {p["id"]: p["prompt_ids"] for p in prompts}
            rate, ties = check_lossless(
                draft.name,
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
        return near_tie_tolerance(self.models.dtype)

    def _target_gap(self, prompt_ids, spec: dict, base: dict, pos: int) -> float | None:
        """ranking.target_tie_gap at a first divergence of `spec` from the target's `base`."""
        return target_tie_gap(self.models.target(), prompt_ids, base["tokens"], spec["tokens"], pos)

    def engine_row(
        self,
        draft: DraftEntry,
        name: str,
        prompts: list[dict],
        base: list[dict],
        k: int,
        stop_below: float | None = None,
        second_min: float | None = None,
    ):
        """Greedy: the engine on the set's first evaluate.engine_max_prompts prompts (round
        robin over categories), its counts checked against the replay's (fixed k: the replay
        has no dynamic lookahead or second-choice leaves to check against)."""
        chosen = {id(p) for p in select_prompts(prompts, self.cfg.evaluate.engine_max_prompts)}
        idx = [i for i, p in enumerate(prompts) if id(p) in chosen]
        sub, sub_base = [prompts[i] for i in idx], [base[i] for i in idx]
        data = self.engine(draft, name, sub, sub_base, k, stop_below, second_min)
        timed = timing_base(sub_base, data)
        row = build_row(draft, data["results"], timed, self.cfg, k, name, "engine", data, sub)
        if second_min is not None:
            row.second_choice_min = second_min
            row.second_choices = {
                key: sum(r.get(f"second_{key}", 0) for r in data["results"])
                for key in ("proposed", "accepted")
            }
        if stop_below is not None or second_min is not None:
            row.stop_threshold = stop_below
            return row
        replayed = self.replayed(draft, name, prompts, base, k)
        row.replay_match_rate = teacher_forced.check_replay(
            f"{draft.name} on {name} at k={k}",
            data["results"],
            [replayed[i] for i in idx],
            sub_base,
            near_tie=self.near_tie,
        )
        return row

    # -- costs and the k sweep ----------------------------------------------------------------

    def costs(
        self, draft: DraftEntry, prompts: list[dict], base: list[dict], ks: list[int]
    ) -> dict:
        """c and v_k of `draft`, timed on the set's median-length prompt + the target's output."""
        ev = self.cfg.evaluate
        settings = {
            **self.settings(prompts),
            **self.draft_settings(draft),
            "ks": sorted(set(ks)),
            "repeats": ev.cost_repeats,
        }
        path = self.dir / f"costs-{safe_name(draft.name)}-{settings_key(settings)}.json"

        def make():
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]["prompt_ids"]))
            i = order[len(order) // 2]
            output = base[i]["tokens"]
            context = list(prompts[i]["prompt_ids"]) + list(output)
            model = self.draft_model(draft)
            step = kind_of(draft).replay().draft_step(model, self.models.target, context, output[0])
            target = self.models.target()
            forms = self.linear_forms()
            return timing.measure_costs(
                target, step, context, output, settings["ks"], ev.cost_repeats, forms, draft=model
            )

        return cached_json(path, settings, make)

    def sweep(self, draft: DraftEntry, name: str, prompts: list[dict], base: list[dict]):
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
                timed = timing_base(base, data)
                acc = eng = build_row(
                    draft, data["results"], timed, self.cfg, k, name, "engine", data, prompts
                )
            out.append(costed_sweep_entry(acc, eng, costs))
        for t in ev.stop_thresholds:  # dynamic lookahead: the engine's own counts
            k = max(ev.k_sweep)
            if self.sampling.greedy:
                row = self.engine_row(draft, name, prompts, base, k, t)
            else:
                data = self.engine(draft, name, prompts, base, k, t)
                timed = timing_base(base, data)
                row = build_row(draft, data["results"], timed, self.cfg, k, name, "engine", data)
                row.stop_threshold = t
            out.append(dynamic_sweep_entry(row, costs))
        for m in ev.second_choice_min:  # greedy only (config.py): the replay has no leaves
            for t in ev.stop_thresholds or [None]:
                row = self.engine_row(draft, name, prompts, base, max(ev.k_sweep), t, m)
                out.append(dynamic_sweep_entry(row, costs))
        return out, costs
