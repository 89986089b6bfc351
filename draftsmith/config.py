"""The run config: one YAML file, validated into typed dataclasses.

Every default lives here and nowhere else. `load_config(path, overrides)` reads
the YAML, applies `key=value` overrides, and validates types and ranges; any
problem is a `ConfigError` whose message names the key (`distill.lr: ...`).

Range and choice constraints sit in field metadata (`ge`, `gt`, `le`, `lt`) and
in `Literal[...]` types, so the validator (draftsmith/schema.py) is generic and the
schema reads as documentation; the checks between fields are here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from draftsmith.errors import ConfigError
from draftsmith.schema import (
    apply_override,
    bounds,
    build,
    open_sections,
    parse_override,
    read_yaml,
)

# The distillation losses: the one list of their names (distill/losses.py reads it as LOSSES).
LossName = Literal["forward_kl", "reverse_kl", "jsd", "tvd", "ce"]

# draft.<kind name>: the settings only one kind has, as that kind's dataclass (its
# DraftKind.config_section). Filled by draftsmith.kinds.register_kind, which the package's
# __init__ imports, so every registered kind's section is a key before any config loads.
KIND_SECTIONS: dict[str, type] = {}


def default_kind_sections() -> dict[str, Any]:
    return {name: cls() for name, cls in KIND_SECTIONS.items()}


# ----------------------------------------------------------------------------- sections


@dataclass
class RunConfig:
    output_dir: str = "runs/default"
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when present, else cpu
    stages: list[Literal["generate", "distill", "evaluate", "export"]] = field(
        default_factory=lambda: ["generate", "distill", "evaluate", "export"]
    )


@dataclass
class TargetConfig:
    model: str = "smollm2-135m-instruct"  # registry name, local dir or hub id
    revision: str | None = None
    # Serving dtype, used where the target decodes one sequence at a time (evaluate).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = (
        "auto"  # auto: bf16 on cuda, fp32 on cpu
    )
    # The target's batched work: generation batches, scoring, the online teacher in distill.
    # auto: bf16 on cuda and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX), fp32
    # elsewhere; bf16 pays on many rows, not on one (README "bf16 on CPU").
    batch_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    trust_remote_code: bool = False


@dataclass
class DraftConfig:
    # A kind registered in draftsmith/kinds/ (README, "Kinds of draft"), or a list naming
    # several: `draftsmith run` then trains and ranks them all. Checked against the registry.
    kind: str | list[str] = "independent"
    init: Literal["from_target", "pretrained", "config"] = "from_target"
    # init=pretrained: any model reference sharing the target's vocabulary.
    model: str | None = None
    # init=from_target: keep `num_layers` layers chosen by `layer_selection`, or the explicit `layers`.
    num_layers: int = field(default=2, metadata=bounds(ge=1))
    layer_selection: Literal["first", "spread", "first_last"] = "first"
    layers: list[int] | None = None
    # init=config: a fresh model of the target's family; None copies the target's value.
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Each kind's own section, draft.<kind name> (KIND_SECTIONS), with its defaults where the
    # YAML leaves it out. Not a key itself: the schema reads each section into it, and
    # config_to_dict writes each back under its own name.
    sections: dict[str, Any] = field(
        default_factory=default_kind_sections,
        init=False,
        metadata=open_sections(lambda: KIND_SECTIONS),
    )

    @property
    def kinds(self) -> list[str]:
        """draft.kind as a list, in the order given."""
        return [self.kind] if isinstance(self.kind, str) else list(self.kind)

    def section(self, name: str) -> Any:
        """draft.<name>, a registered kind's own settings (its config_section dataclass)."""
        return self.sections[name]


@dataclass
class PromptSource:
    RENAMED_KEYS = {"kind": "replies"}  # `kind` read too easily as the draft's kind
    # One of: `builtin` (draftsmith | humaneval | sharegpt | mtbench), `path` (jsonl/json/csv/
    # parquet file or a `datasets.save_to_disk` dir) or `hub` (a hub dataset id, for users who
    # have a hub).
    builtin: str | None = None
    path: str | None = None
    hub: str | None = None
    hub_split: str = "train"
    prompt_field: str = "prompt"  # plain text prompt ...
    messages_field: str | None = None  # ... or chat messages [{role, content}, ...]
    # replies=score: the text that answered the prompt in the source, scored by the target
    # instead of written by it. sharegpt: the assistant turn that followed; messages_field:
    # a final assistant message; prompt_field records: this field.
    reply_field: str | None = None
    category_field: str | None = "category"
    category: str | None = None  # fixed category for every prompt of this source
    limit: int | None = field(default=None, metadata=bounds(ge=1))
    # Where the training replies come from. target: the target writes each completion
    # (data.max_new_tokens, its sampling settings); score: the source's own reply, cut to
    # data.max_new_tokens, is scored by the target in one teacher-forced forward (top-k
    # log-probs as for written text, no decoding). Was `kind` (still read, with a warning).
    replies: Literal["target", "score"] = "target"
    # train: every prompt is trained on; eval: every prompt is held out (never trained on, and
    # no training prompt may be a near-duplicate of it); both: split by data.eval_fraction.
    role: Literal["train", "eval", "both"] = "both"
    # sharegpt only: the opening user turn of each conversation, or every user turn with the
    # conversation before it as context.
    turns: Literal["first", "all"] = "first"
    # Filters, any source: prompt length in characters (all its messages), and keep only
    # prompts whose letters are mostly Latin script (data/sources.py LATIN_SHARE). null takes
    # the builtin's own default (BUILTIN_FILTERS), else no filter.
    min_chars: int | None = field(default=None, metadata=bounds(ge=1))
    max_chars: int | None = field(default=None, metadata=bounds(ge=1))
    latin_only: bool | None = None

    def __post_init__(self):
        for name, value in BUILTIN_FILTERS.get(self.builtin, {}).items():
            if getattr(self, name) is None:
                setattr(self, name, value)


# Raw user traffic needs filters the curated sets do not: ShareGPT holds greetings and bare
# "continue"s (under 10 characters), pasted documents (over 2000 characters, ~500 tokens: each
# decode step reads the whole KV cache, so long prompts slow generation on a CPU) and other
# languages, which an English-only target such as SmolLM2 answers poorly. README "Prompt data".
BUILTIN_FILTERS: dict[str, dict[str, Any]] = {
    "sharegpt": {"min_chars": 10, "max_chars": 2000, "latin_only": True},
}


@dataclass
class VllmConfig:
    """vllm.LLM settings for the target: `data.vllm` (generate) and `evaluate.vllm`."""

    tensor_parallel_size: int = field(default=1, metadata=bounds(ge=1))
    max_model_len: int | None = None
    gpu_memory_utilization: float = field(default=0.9, metadata=bounds(gt=0, le=1))


@dataclass
class DataConfig:
    sources: list[PromptSource] = field(
        default_factory=lambda: [
            PromptSource(builtin="draftsmith"),
            PromptSource(builtin="humaneval"),
        ]
    )
    chat_template: bool = True
    system_prompt: str | None = None
    eval_fraction: float = field(default=0.2, metadata=bounds(gt=0, lt=1))
    # caps each eval set on its own (each role=eval source, and the held-out split of the
    # role=both sources): adding MT-bench never shrinks the held-out set, nor the reverse
    max_eval_prompts: int | None = field(default=None, metadata=bounds(ge=1))
    max_train_prompts: int | None = field(default=None, metadata=bounds(ge=1))
    backend: Literal["hf", "vllm"] = "hf"
    max_new_tokens: int = field(default=64, metadata=bounds(ge=1))
    temperature: float = field(default=0.0, metadata=bounds(ge=0))
    top_p: float = field(default=1.0, metadata=bounds(gt=0, le=1))
    top_k: int = field(default=0, metadata=bounds(ge=0))  # 0: off
    n: int = field(default=1, metadata=bounds(ge=1))
    batch_size: int = field(default=16, metadata=bounds(ge=1))
    # HF backend: a batch also stays under this many sequence x (prompt + max_new_tokens)
    # tokens. Each decode step reads the whole KV cache, so long prompts in a full batch
    # decode slower per token than in a smaller one (README, Config reference). null: batch_size alone.
    max_batch_tokens: int | None = field(default=16384, metadata=bounds(ge=1))
    # HF backend on CPU: the form of the target's linear layers in decode steps, one row per
    # sequence of the batch (draftsmith/fast_linear.py). auto: F.linear, W @ x^T and (bf16)
    # packed weights timed at batch widths 1, 2, 4, ... batch_size once per generate, the
    # fastest taken per width; true/false: W @ x^T always/never. Changes float rounding only.
    cpu_few_row_linear: bool | Literal["auto"] = "auto"
    shard_size: int = field(default=64, metadata=bounds(ge=1))
    topk_logprobs: int = field(default=0, metadata=bounds(ge=0))  # 0: store none
    max_prompt_tokens: int | None = field(
        default=None, metadata=bounds(ge=1)
    )  # None: model context
    too_long: Literal["skip", "error"] = "skip"
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class DistillConfig:
    loss: LossName = "forward_kl"
    beta: float = field(default=0.5, metadata=bounds(gt=0, lt=1))  # generalized JSD only
    temperature: float = field(default=1.0, metadata=bounds(gt=0))
    ce_weight: float = field(default=0.0, metadata=bounds(ge=0))  # extra hard-label CE term
    teacher: Literal["online", "offline"] = "online"
    on_policy_fraction: float = field(default=0.0, metadata=bounds(ge=0, le=1))
    on_policy_temperature: float = field(default=1.0, metadata=bounds(gt=0))
    lr: float = field(default=5e-4, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.0, metadata=bounds(ge=0))
    warmup_steps: int = field(default=10, metadata=bounds(ge=0))
    # cosine: decay to 0 at max_steps (the best final checkpoint); constant: flat after warmup,
    # so intermediate checkpoints of one run are comparable points of a data-scaling curve
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    max_steps: int = field(default=100, metadata=bounds(ge=1))
    batch_size: int = field(default=8, metadata=bounds(ge=1))
    grad_accum_steps: int = field(default=1, metadata=bounds(ge=1))
    max_grad_norm: float = field(default=1.0, metadata=bounds(gt=0))
    # auto: bf16 on cuda (where supported) and on CPUs with native bf16 matmuls, else no
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    max_seq_len: int | None = field(default=None, metadata=bounds(ge=2))
    # Keep the token embeddings (and the LM head they are tied to) as the target's: the
    # head's weight gradient is the costliest matmul of a small draft's step, and a frozen
    # head keeps the logits of tokens the training data never shows where the target put them.
    freeze_embeddings: bool = False
    # Train only the last this-many decoder layers (and the final norm, and the head unless
    # freeze_embeddings): the backward pass then stops at the lowest trained layer, which is
    # what makes fine-tuning a pretrained draft (init=pretrained) cheaper on a CPU. null: all.
    train_layers: int | None = field(default=None, metadata=bounds(ge=1))
    # Low-rank adapters instead of full weights (distill/lora.py): rank r on every attention
    # and MLP projection (of the last train_layers layers when set), scaled by lora_alpha / r
    # (null: 2r); embeddings and head frozen. Checkpoints hold the merged weights. null: off.
    lora_rank: int | None = field(default=None, metadata=bounds(ge=1))
    lora_alpha: float | None = field(default=None, metadata=bounds(gt=0))
    save_every: int = field(default=50, metadata=bounds(ge=1))
    # Extra steps to save at besides every save_every, e.g. log-spaced [8, 16, 32, 64] for
    # a curve of acceptance against teacher tokens (scripts/budget_curve.py --x tokens).
    save_steps: list[int] = field(default_factory=list)
    keep_last: int | None = field(default=None, metadata=bounds(ge=1))
    log_every: int = field(default=10, metadata=bounds(ge=1))
    # Prompts of the training data kept out of training (every sample of each), chosen by
    # run.seed: the draft's loss on their completions is measured before training, at every
    # log step and at every checkpoint, so a run shows whether what it learns carries over to
    # prompts it never saw (a training loss alone cannot). 0: off.
    heldout_prompts: int = field(default=0, metadata=bounds(ge=0))
    resume: str = "auto"  # auto | never | path to a checkpoint dir
    # Also train a twin with plain cross-entropy (same data, steps, init) into
    # <output_dir>/ablations/ce/, so the leaderboard shows what the KL loss buys.
    ce_baseline: bool = False


@dataclass
class EvaluateConfig:
    # draft_int8: true|false, the key before int4 joined it (old run dirs' config.yaml)
    RENAMED_KEYS = {"draft_int8": ("draft_weights", {True: "int8", False: "as_loaded"})}
    backend: Literal["native", "vllm"] = "native"
    num_speculative_tokens: int = field(default=4, metadata=bounds(ge=1, le=32))  # k for ranking
    k_sweep: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6, 8])  # best checkpoint only
    # Dynamic lookahead, swept beside k for the best draft: a round stops drafting after a
    # token the draft gave less than this probability (at most max(k_sweep) per round).
    # Measured by the engine on the engine's prompts; each threshold in (0, 1).
    stop_thresholds: list[float] = field(default_factory=list)
    # Second-choice leaves (native engine; greedy, or exact under sampling): for each value,
    # sweep points at max(k_sweep) (with each stop threshold, or fixed without any) where the
    # verify forward also carries the draft's second choice wherever the draft rates it at
    # least this likely to be emitted (evaluate/engine.py second_choice_leaves). Each in
    # [0, 1). vLLM's draft_model verifies a chain: these points rank what the native engine
    # can do.
    second_choice_min: list[float] = field(default_factory=list)
    temperature: float = field(default=0.0, metadata=bounds(ge=0))
    top_p: float = field(default=1.0, metadata=bounds(gt=0, le=1))
    top_k: int = field(default=0, metadata=bounds(ge=0))
    max_new_tokens: int = field(default=64, metadata=bounds(ge=1))
    max_prompts: int | None = field(default=None, metadata=bounds(ge=1))  # per eval set
    # The eval set the best draft is chosen on and the k sweep runs on; None: mtbench when the
    # run has it, else the first set of data/eval_prompts.jsonl.
    primary_eval_set: str | None = None
    # Greedy: every draft is ranked on every prompt by its exact teacher-forced counts; the
    # engine (speedup, losslessness, k sweep) then decodes the best drafts on at most this many
    # prompts per set (None: all); its cost is decoding time, a draft's tokens/s x this.
    engine_max_prompts: int | None = field(default=8, metadata=bounds(ge=1))
    # Each engine run also decodes every prompt with the target alone, right beside its
    # speculative decode (order alternating by prompt), and divides by that: a machine whose
    # speed drifts for minutes (shared cores) then slows both sides of a measured speedup
    # alike. Doubles the engine's decoding time. False: divide by the set's one baseline.
    paired_baseline: bool = True
    # Interleaved repeats of the draft/verify cost timing behind the recommended k.
    cost_repeats: int = field(default=30, metadata=bounds(ge=3))
    # Also ask each prompt's second turn (MT-bench turn 2) after the target's own greedy answer
    # to turn 1 (at most turn2_answer_tokens, cached), as the eval set `<set>-turn2`.
    turn2: bool = False
    turn2_answer_tokens: int = field(default=128, metadata=bounds(ge=1))
    baselines: list[str] = field(default_factory=list)  # extra drafts: model refs or dirs
    select_metric: Literal["acceptance_rate", "mean_accepted_length", "speedup"] = "acceptance_rate"
    on_mismatch: Literal["error", "warn"] = "error"  # greedy losslessness failures
    # CPU: the linear layers' form per forward width (draftsmith/fast_linear.py). auto: time
    # F.linear, W @ x^T and (bf16) packed weights on the target, per width, once per run and
    # machine (fast_linear.choose_linear_forms); true/false: W @ x^T always/never.
    cpu_few_row_linear: bool | Literal["auto"] = "auto"
    # Native engine on CPU: decode the draft with its weights rounded to int8 (per output row)
    # or int4 (per group of 32 inputs), activations bf16 (draftsmith/quant_draft.py). The
    # target is untouched, so output stays the target's; acceptance and the draft's cost are
    # measured with the rounded draft (README: "Quantized draft weights").
    draft_weights: Literal["as_loaded", "int8", "int4"] = "as_loaded"
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class ExportConfig:
    checkpoint: str | None = None  # None: the leaderboard's best row
    output_dir: str | None = None  # None: <run.output_dir>/export
    overwrite: bool = False


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "draftsmith"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TrackingConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def output_dir(self) -> Path:
        return Path(self.run.output_dir)


# ----------------------------------------------------------------------------- checks between fields


def _check_cross_fields(cfg: Config) -> None:
    """Constraints between fields, each named by the key a user would change."""
    _check_draft_kinds(cfg)
    if not cfg.run.stages:
        raise ConfigError(
            "run.stages: empty, so `draftsmith run` would do nothing; list the stages to run "
            "(generate, distill, evaluate, export)"
        )
    if cfg.draft.init == "pretrained" and not cfg.draft.model:
        raise ConfigError("draft.model: required when draft.init is 'pretrained'")
    if cfg.distill.teacher == "offline" and cfg.data.topk_logprobs == 0:
        raise ConfigError(
            "data.topk_logprobs: must be > 0 when distill.teacher is 'offline' "
            "(the offline teacher reads the top-k log-probs stored by generate)"
        )
    if cfg.distill.teacher == "offline" and cfg.distill.on_policy_fraction > 0:
        raise ConfigError(
            "distill.on_policy_fraction: needs distill.teacher 'online' (the target must score "
            "the draft's own samples)"
        )
    for i, step in enumerate(cfg.distill.save_steps):
        if not 1 <= step <= cfg.distill.max_steps:
            raise ConfigError(
                f"distill.save_steps[{i}]: must be between 1 and distill.max_steps "
                f"({cfg.distill.max_steps}), got {step}"
            )
    if cfg.distill.warmup_steps > cfg.distill.max_steps:
        raise ConfigError(
            f"distill.warmup_steps: {cfg.distill.warmup_steps} is over distill.max_steps "
            f"({cfg.distill.max_steps}), so the learning rate would never reach distill.lr"
        )
    if not cfg.evaluate.k_sweep:
        raise ConfigError(
            "evaluate.k_sweep: empty; list at least one number of draft tokens per round (e.g. [1, 2, 4])"
        )
    for i, k in enumerate(cfg.evaluate.k_sweep):
        if not 1 <= k <= 32:
            raise ConfigError(f"evaluate.k_sweep[{i}]: must be between 1 and 32, got {k}")
    for i, t in enumerate(cfg.evaluate.stop_thresholds):
        if not 0 < t < 1:
            raise ConfigError(
                f"evaluate.stop_thresholds[{i}]: a probability strictly between 0 and 1, got {t}"
            )
    _check_second_choices(cfg.evaluate)
    if cfg.evaluate.draft_weights != "as_loaded" and cfg.evaluate.backend != "native":
        raise ConfigError(
            f"evaluate.draft_weights: {cfg.evaluate.draft_weights} draft weights are the native "
            "CPU engine's; vLLM decodes the draft as exported (set it to as_loaded with "
            "evaluate.backend vllm)"
        )
    for i, src in enumerate(cfg.data.sources):
        given = [n for n in ("builtin", "path", "hub") if getattr(src, n)]
        if len(given) != 1:
            raise ConfigError(
                f"data.sources[{i}]: give exactly one of builtin, path or hub (got {given or 'none'})"
            )
        if src.turns != "first" and src.builtin != "sharegpt":
            raise ConfigError(
                f"data.sources[{i}].turns: only the sharegpt builtin has conversations to take "
                "turns from"
            )
        if src.min_chars and src.max_chars and src.min_chars > src.max_chars:
            raise ConfigError(
                f"data.sources[{i}].min_chars: {src.min_chars} is over max_chars {src.max_chars}"
            )
        _check_score_source(cfg, src, i)
    if not cfg.data.sources:
        raise ConfigError("data.sources: at least one prompt source is required")
    if all(src.role == "eval" for src in cfg.data.sources):
        raise ConfigError("data.sources: every source has role 'eval'; nothing would be trained on")


def _check_second_choices(ev: EvaluateConfig) -> None:
    for i, m in enumerate(ev.second_choice_min):
        if not 0 <= m < 1:
            raise ConfigError(f"evaluate.second_choice_min[{i}]: a probability in [0, 1), got {m}")
    if ev.second_choice_min and ev.backend != "native":
        raise ConfigError(
            "evaluate.second_choice_min: second-choice leaves are the native engine's; vLLM's "
            "draft_model verifies a chain (set the list to [] with evaluate.backend vllm)"
        )


def _check_draft_kinds(cfg: Config) -> None:
    """draft.kind's shape; which names exist and what each kind needs of the rest of the
    config are the kinds registry's (draftsmith/kinds/ check_config, run by the CLI before
    anything is written): this module checks no kind's keys and never imports the registry."""
    kinds = cfg.draft.kinds
    if not kinds:
        raise ConfigError(
            "draft.kind: an empty list; name at least one registered kind (e.g. independent)"
        )
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"draft.kind: {kinds} names a kind twice")


def _check_score_source(cfg: Config, src: PromptSource, i: int) -> None:
    """replies=score needs replies to score, a role that trains, and top-k log-probs to store."""
    if src.reply_field and not (src.path or src.hub):
        raise ConfigError(f"data.sources[{i}].reply_field: only file and hub sources have fields")
    if src.replies != "score":
        return
    has_replies = src.builtin == "sharegpt" or src.messages_field or src.reply_field
    if not has_replies:
        raise ConfigError(
            f"data.sources[{i}].replies: 'score' needs replies to score: the sharegpt builtin, a "
            "messages_field whose conversations end with an assistant turn, or a reply_field"
        )
    if src.role == "eval":
        raise ConfigError(
            f"data.sources[{i}].replies: 'score' makes training text, but role 'eval' never trains"
        )
    if cfg.data.topk_logprobs == 0:
        raise ConfigError(
            f"data.topk_logprobs: must be > 0 when data.sources[{i}] has replies 'score' (scoring "
            "stores the target's top-k log-probs)"
        )


# ----------------------------------------------------------------------------- loading


def config_from_dict(raw: dict) -> Config:
    cfg = build(Config, raw, "")
    _check_cross_fields(cfg)
    return cfg


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    raw = read_yaml(Path(path))
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(raw, parts, value)
    return config_from_dict(raw)


def config_to_dict(cfg: Config) -> dict:
    """The config as plain data, each kind's section under draft.<kind name>."""
    out = dataclasses.asdict(cfg)
    out["draft"] |= out["draft"].pop("sections")
    return out


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def save_resolved_config(cfg: Config) -> Path:
    """Write the resolved config to <output_dir>/config.yaml (atomically)."""
    from draftsmith.io import atomic_write_text

    path = cfg.output_dir / "config.yaml"
    header = (
        "# Resolved config written by draftsmith; rerun with: draftsmith run " + str(path) + "\n"
    )
    atomic_write_text(path, header + dump_config(cfg))
    return path
