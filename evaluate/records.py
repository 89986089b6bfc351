"""The records the evaluate stage passes between its modules: the drafts it evaluates
(DraftEntry) and the leaderboard's rows (LeaderboardRow, with a MetricSummary per category).

Each record's `to_dict` is the JSON the run directory has always held (same keys, same
order), and `from_dict` reads it back: a field it does not know, or one it needs and does
not find, is one line naming the file, not a KeyError deep in a report. The modules read
the fields by name (`draft.kind`, `row.alpha`), so a misspelt field fails where it is
written, not as a silent `None` from `dict.get`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from draftsmith.errors import DraftsmithError

# ----------------------------------------------------------------------------- reading dicts


def _check_fields(d: Any, required: tuple, optional: tuple, where: str) -> None:
    """`d` is an object holding every `required` key and nothing outside the two lists."""
    if not isinstance(d, dict):
        raise DraftsmithError(f"{where}: expected an object, found {type(d).__name__}")
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        raise DraftsmithError(f"{where}: unknown field {unknown[0]!r}")
    missing = [k for k in required if k not in d]
    if missing:
        raise DraftsmithError(f"{where}: missing field {missing[0]!r}")


def _ordered(values: dict, order: tuple) -> dict:
    """`values` in `order`, leaving out the keys it does not have (optional ones unset)."""
    return {k: values[k] for k in order if k in values}


# ----------------------------------------------------------------------------- drafts


@dataclass(kw_only=True)
class DraftEntry:
    """One draft the evaluate stage runs (evaluate/prompts.py list_drafts).

    `kind` names its kind in the registry (draftsmith/kinds/: how it is loaded and run);
    `role` what it is, for reports: "init", "distilled", "ce_twin", "baseline" or "sanity"
    (None: a draft named outside list_drafts, e.g. by a script); `step` its checkpoint step
    (None keeps a CE twin or baseline off the per-step plots); `trained_steps` how far this
    run trained it; `key` the config key that named a baseline (evaluate.baselines[i]).
    """

    name: str
    ref: str
    kind: str
    step: int | None = None
    role: str | None = None
    trained_steps: int | None = None
    key: str | None = None

    # list_drafts' dicts had this order, `key` only on baselines
    ORDER = ("name", "ref", "step", "role", "trained_steps", "key", "kind")

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        if self.key is None:
            del values["key"]
        return _ordered(values, self.ORDER)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> DraftEntry:
        _check_fields(d, ("name", "ref", "kind"), ("step", "role", "trained_steps", "key"), where)
        return cls(**d)

    @property
    def config_key(self) -> str:
        """The config key a loader names in its errors: a baseline's own, else "checkpoint"."""
        return self.key or "checkpoint"


# ----------------------------------------------------------------------------- metric summaries

# vLLM observes no single forward (no forward times) and no per-prompt tokens (no echo
# split, no per-prompt speedups), and its rows have always carried fewer fields, in their
# own order: `to_dict` writes each backend's rows as it always has.
VLLM = "vllm"
ECHO_KEYS = ("echo_share", "alpha_echo", "alpha_new")
CONFIDENCE_KEYS = (
    "target_sure_share",
    "alpha_target_sure",
    "alpha_target_unsure",
    "misses_target_unsure",
)
SPLIT_KEYS = ECHO_KEYS + CONFIDENCE_KEYS


@dataclass(kw_only=True)
class EchoSplit:
    """metrics.echo_split: the share of output tokens that copy the prompt, and alpha on
    those tokens and on the rest."""

    echo_share: float | None
    alpha_echo: float | None
    alpha_new: float | None


@dataclass(kw_only=True)
class ConfidenceSplit:
    """metrics.confidence_split: judged drafts split by the target's probability of its own
    token there (sure: >= metrics.TARGET_SURE), alpha on each side, and the share of the
    draft's misses that fall where the target itself is unsure."""

    target_sure_share: float | None
    alpha_target_sure: float | None
    alpha_target_unsure: float | None
    misses_target_unsure: float | None


def _split_field(split: str, key: str) -> property:
    """A read-only property giving `key` of the summary's `split` group, None without it."""

    def get(self) -> float | None:
        group = getattr(self, split)
        return getattr(group, key) if group is not None else None

    return property(get)


@dataclass(kw_only=True)
class MetricSummary:
    """metrics.summarize over some prompts: a row's figures, and each of its categories'.

    The defaults are a summary of nothing measured (tests and partial rows build on them).
    `echo` is None where no per-token outcomes were kept (vLLM, results cached before they
    were): the JSON then has no echo fields at all, not null ones. `confidence` likewise,
    where the target's probabilities of its own tokens were not measured.
    """

    num_prompts: int = 0
    tokens_generated: int = 0
    tokens_proposed: int = 0
    tokens_accepted: int = 0
    acceptance_rate: float | None = None
    alpha: float | None = None
    mean_accepted_length: float | None = None
    per_position_acceptance: list[float | None] = field(default_factory=list)
    target_forwards: int = 0
    tokens_per_s: float | None = None
    target_tokens_per_s: float | None = None
    speedup: float | None = None
    draft_cost_ratio: float | None = None
    verify_cost_ratio: float | None = None
    modelled_speedup: float | None = None
    modelled_speedup_verify: float | None = None
    draft_forward_ms: float | None = None
    target_forward_ms: float | None = None
    target_verify_ms: float | None = None
    modelled_speedup_request: float | None = None  # prefills counted (metrics)
    echo: EchoSplit | None = None
    confidence: ConfidenceSplit | None = None

    # the order metrics.summarize writes
    NATIVE_KEYS = (
        "num_prompts",
        "tokens_generated",
        "tokens_proposed",
        "tokens_accepted",
        "acceptance_rate",
        "alpha",
        "mean_accepted_length",
        "per_position_acceptance",
        "target_forwards",
        "tokens_per_s",
        "target_tokens_per_s",
        "speedup",
        "draft_cost_ratio",
        "verify_cost_ratio",
        "modelled_speedup",
        "modelled_speedup_verify",
        "draft_forward_ms",
        "target_forward_ms",
        "target_verify_ms",
        "modelled_speedup_request",
    )
    # vllm_backend.summary_from_counts' order; a vLLM category adds num_prompts last
    VLLM_KEYS = (*NATIVE_KEYS[1:16], "num_prompts")

    # each split's fields read flat off the summary (None where the split was not kept)
    echo_share = _split_field("echo", "echo_share")
    alpha_echo = _split_field("echo", "alpha_echo")
    alpha_new = _split_field("echo", "alpha_new")
    target_sure_share = _split_field("confidence", "target_sure_share")
    alpha_target_sure = _split_field("confidence", "alpha_target_sure")
    alpha_target_unsure = _split_field("confidence", "alpha_target_unsure")
    misses_target_unsure = _split_field("confidence", "misses_target_unsure")

    def summary_fields(self) -> dict:
        """The summary's own fields, flat as the JSON holds them (split fields when kept)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(MetricSummary)}
        values["per_position_acceptance"] = list(self.per_position_acceptance)
        for name in SPLITS:
            split = values.pop(name)
            values |= dataclasses.asdict(split) if split is not None else {}
        return values

    def to_dict(self, backend: str | None = None) -> dict:
        keys = self.VLLM_KEYS if backend == VLLM else self.NATIVE_KEYS + SPLIT_KEYS
        return _ordered(self.summary_fields(), keys)

    @classmethod
    def from_dict(cls, d: Any, where: str, backend: str | None = None) -> MetricSummary:
        required = cls.VLLM_KEYS if backend == VLLM else cls.NATIVE_KEYS
        optional = () if backend == VLLM else SPLIT_KEYS
        _check_fields(d, required, optional, where)
        return cls(**summary_args(d))


# MetricSummary's optional groups of fields: the JSON holds them flat, all or none of each
SPLITS = {"echo": (EchoSplit, ECHO_KEYS), "confidence": (ConfidenceSplit, CONFIDENCE_KEYS)}


def summary_args(d: dict) -> dict:
    """MetricSummary's constructor arguments from a flat summary (split fields nested)."""
    args = {k: v for k, v in d.items() if k not in SPLIT_KEYS}
    for name, (split, keys) in SPLITS.items():
        if any(k in d for k in keys):
            args[name] = split(**{k: d.get(k) for k in keys})
    return args


# ----------------------------------------------------------------------------- sweep points


def is_fixed_k(entry: dict) -> bool:
    """A sweep point at a fixed k verifying a chain (what vLLM's speculative_config takes),
    not one with dynamic lookahead or second-choice leaves."""
    return entry.get("stop_threshold") is None and entry.get("second_choice_min") is None


def sweep_label(entry: dict) -> str:
    """k=4; k<=6 stop<0.5 for a dynamic-lookahead point; ` 2nd>=0.05` appended for one
    with second-choice leaves."""
    t, m = entry.get("stop_threshold"), entry.get("second_choice_min")
    label = f"k={entry['k']}" if t is None else f"k<={entry['k']} stop<{t:g}"
    return label if m is None else f"{label} 2nd>={m:g}"


# ----------------------------------------------------------------------------- leaderboard rows


@dataclass(kw_only=True)
class LeaderboardRow(MetricSummary):
    """One draft at one k on one eval set (evaluate/board.py build_row), measured by the
    teacher-forced replay or the engine; its figures are the MetricSummary it extends, and
    `per_category` holds one per category.

    Written only when set: `replay_match_rate` (a greedy engine row at a fixed k: the share
    of prompts whose counts equal the replay's), `stop_threshold` (a dynamic-lookahead sweep
    row), `second_choice_min` and `second_choices` (a sweep row with second-choice leaves:
    the engine's min gain, and how many leaves it verified and emitted) and `trained_with`
    (what a draft this run trained was trained with, added by report.portable_board from
    its checkpoint's record).
    """

    checkpoint: str
    path: str
    step: int | None
    role: str | None
    kind: str
    trained_steps: int | None
    eval_set: str
    measured_by: str
    num_speculative_tokens: int
    temperature: float
    backend: str
    per_category: dict[str, MetricSummary] = field(default_factory=dict)
    speedup_iqr: list[float] | None = None
    lossless_match_rate: float | None = None
    lossless_ties: int | None = None
    replay_match_rate: float | None = None
    stop_threshold: float | None = None
    second_choice_min: float | None = None
    second_choices: dict | None = None  # {"proposed": leaves verified, "accepted": emitted}
    trained_with: dict | None = None

    IDENTITY = ("checkpoint", "path", "step", "role", "kind", "trained_steps")
    WHERE = ("eval_set", "measured_by")
    SETTINGS = ("num_speculative_tokens", "temperature", "backend")
    EXTRAS = (
        "replay_match_rate",
        "stop_threshold",
        "second_choice_min",
        "second_choices",
        "trained_with",
    )
    # the row's own fields that are always written (per_category: one summary per category)
    OWN = (*IDENTITY, *WHERE, *SETTINGS, "speedup_iqr", "lossless_match_rate", "lossless_ties")
    # build_row's order, then the fields written only when set
    ROW_KEYS = (
        *IDENTITY,
        *WHERE,
        *MetricSummary.NATIVE_KEYS,
        *SPLIT_KEYS,
        "speedup_iqr",
        "per_category",
        "lossless_match_rate",
        "lossless_ties",
        *SETTINGS,
    )
    # vllm_backend._row's order
    VLLM_ROW_KEYS = (
        "checkpoint",
        "kind",
        "path",
        "step",
        "role",
        "trained_steps",
        "num_prompts",
        *MetricSummary.VLLM_KEYS[:-1],
        "per_category",
        *SETTINGS,
        "lossless_match_rate",
        *WHERE,
    )

    def order(self) -> tuple:
        return self.VLLM_ROW_KEYS if self.backend == VLLM else self.ROW_KEYS

    def to_dict(self) -> dict:
        values = self.summary_fields() | {name: getattr(self, name) for name in self.OWN}
        values["per_category"] = {
            cat: m.to_dict(self.backend) for cat, m in self.per_category.items()
        }
        extras = {k: getattr(self, k) for k in self.EXTRAS if getattr(self, k) is not None}
        return _ordered(values, self.order()) | extras

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LeaderboardRow:
        backend = d.get("backend") if isinstance(d, dict) else None
        if backend == VLLM:
            required, optional = cls.VLLM_ROW_KEYS, cls.EXTRAS
        else:
            required = tuple(k for k in cls.ROW_KEYS if k not in SPLIT_KEYS)
            optional = cls.EXTRAS + SPLIT_KEYS
        _check_fields(d, required, optional, where)
        cats = d["per_category"]
        if not isinstance(cats, dict):
            raise DraftsmithError(f"{where}: per_category is not an object")
        args = summary_args({k: v for k, v in d.items() if k != "per_category"})
        args["per_category"] = {
            cat: MetricSummary.from_dict(m, f"{where}: per_category[{cat!r}]", backend)
            for cat, m in cats.items()
        }
        return cls(**args)


def rows_from_dicts(rows: Any, path) -> list[LeaderboardRow]:
    """A leaderboard.json's "rows", each read back into a LeaderboardRow (errors name the
    file and the row)."""
    if not isinstance(rows, list):
        raise DraftsmithError(f'{path}: "rows" is not a list')
    return [LeaderboardRow.from_dict(r, f"{path}: rows[{i}]") for i, r in enumerate(rows)]
