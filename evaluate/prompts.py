"""Reading the stage inputs: held-out eval prompts, grouped into named eval sets, and the
drafts to evaluate."""

from __future__ import annotations

from pathlib import Path

from draftsmith.config import Config
from draftsmith.data import load_eval_prompts
from draftsmith.distill import list_checkpoints
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.evaluate.records import DraftEntry
from draftsmith.kinds import FALLBACK_KIND, get_kind, kind_of

STANDARD_SET = "mtbench"  # the primary eval set by default, when a run has it


def load_prompts(output_dir: Path) -> list[dict]:
    prompts = load_eval_prompts(output_dir)
    path = Path(output_dir) / "data" / "eval_prompts.jsonl"
    if not prompts:
        raise DraftsmithError(f"{path}: holds no eval prompts")
    for p in prompts:
        if not p["prompt_ids"]:
            raise DraftsmithError(f"{path}: prompt {p['id']} has no prompt_ids")
    return prompts


def eval_sets(prompts: list[dict], limit: int | None) -> dict[str, list[dict]]:
    """{set name: its prompts}, sets in file order, each capped at `limit` (select_prompts)."""
    sets: dict[str, list[dict]] = {}
    for p in prompts:
        sets.setdefault(p["eval_set"], []).append(p)
    return {name: select_prompts(ps, limit) for name, ps in sets.items()}


def primary_set(sets: dict[str, list[dict]], wanted: str | None) -> str:
    """evaluate.primary_eval_set, else mtbench when the run has it, else the first set."""
    if wanted is None:
        return STANDARD_SET if STANDARD_SET in sets else next(iter(sets))
    if wanted not in sets:
        raise ConfigError(
            f"evaluate.primary_eval_set: {wanted!r} is not an eval set of this run "
            f"(have: {', '.join(sets)})"
        )
    return wanted


def select_prompts(prompts: list[dict], limit: int | None) -> list[dict]:
    """At most `limit` prompts, taken round-robin over categories in file order.

    Deterministic, and a small cap still covers every category.
    """
    if limit is None or limit >= len(prompts):
        return list(prompts)
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    picked: list[dict] = []
    depth = 0
    while len(picked) < limit:
        for rows in by_cat.values():
            if depth < len(rows) and len(picked) < limit:
                picked.append(rows[depth])
        depth += 1
    order = {id(p): i for i, p in enumerate(prompts)}
    return sorted(picked, key=lambda p: order[id(p)])


SELF_DRAFT = "target"  # evaluate.baselines: [target]: the target drafting for itself
SELF_DRAFT_NAME = "target-as-draft"


def list_drafts(
    output_dir: Path,
    kinds: list[str] | tuple[str, ...],
    baselines: list[str],
    ce_baseline: bool = False,
    target: str | None = None,
) -> list[DraftEntry]:
    """Each kind's checkpoint-<step> (by step) and its CE twin's last checkpoint, then
    evaluate.baselines.

    `kind` says which kind of draft it is (draftsmith/kinds/: how it is loaded and run;
    baselines are the registry's FALLBACK_KIND, plain causal LMs); `name` is unique across
    kinds (DraftKind.draft_name: `<kind folder>-checkpoint-<step>` for a kind with a folder).
    `role` says what a draft is, for reports: "init" (checkpoint-0), "distilled" (the configured loss), "ce_twin" (distill.ce_baseline) or
    "baseline" (evaluate.baselines); `trained_steps` how far this run trained it (None for
    a baseline). The baseline `target` is the target (`target`: its model ref) drafting
    for itself, role "sanity": it must accept every token, and it never ranks or exports.
    """
    drafts, dirs = [], []
    for kind in map(get_kind, kinds):
        ckpt_dir = kind.checkpoints_dir(output_dir)
        dirs.append(str(ckpt_dir))
        drafts += [
            DraftEntry(
                name=kind.draft_name(p.name),
                ref=str(p),
                step=step,
                role="distilled" if step else "init",
                trained_steps=step,
                kind=kind.name,
            )
            for step, p in list_checkpoints(ckpt_dir)
        ]
        if ce_baseline:
            # distill.ce_baseline: same data, steps and init, plain cross-entropy (distill/stage.py)
            twin = list_checkpoints(kind.ce_dir(output_dir))
            if twin:
                step, path = twin[-1]
                # step None keeps it off the per-step plots; trained_steps says how far it went
                drafts.append(
                    DraftEntry(
                        name=kind.draft_name(f"ce-{path.name}"),
                        ref=str(path),
                        step=None,
                        role="ce_twin",
                        trained_steps=step,
                        kind=kind.name,
                    )
                )
    for i, ref in enumerate(baselines):
        sanity = ref == SELF_DRAFT and target is not None
        ref = target if sanity else ref
        path = Path(ref).expanduser()
        name = SELF_DRAFT_NAME if sanity else path.name if path.exists() else ref
        drafts.append(
            DraftEntry(
                name=name,
                ref=ref,
                step=None,
                role="sanity" if sanity else "baseline",
                trained_steps=None,
                key=f"evaluate.baselines[{i}]",
                kind=FALLBACK_KIND,  # a baseline is a plain causal LM
            )
        )
    if not drafts:
        raise DraftsmithError(
            f"{', '.join(dirs)}: no checkpoints to evaluate (and evaluate.baselines is empty); "
            "run `draftsmith distill CONFIG` first"
        )
    return drafts


def draft_label(draft: DraftEntry) -> str:
    """How errors name a draft: a baseline by its config key, a checkpoint by its name."""
    if draft.role == "baseline":
        return f"{draft.key} ({draft.ref})"
    return draft.name


def check_drafts(cfg: Config, drafts: list[DraftEntry]) -> None:
    """Before any decoding: every draft's files are whole and its tokenizer is the target's.

    A checkpoint needs its training record (draftsmith_checkpoint.json) and complete weight
    files; every draft needs the target's token -> id map. A baseline with another
    tokenizer is named by its key (evaluate.baselines[i]) before any other draft runs.
    """
    from draftsmith.distill.checkpoint import read_meta
    from draftsmith.evaluate.ranking import draft_path
    from draftsmith.evaluate.report import TRAINED_ROLES
    from draftsmith.integrity import check_weight_files
    from draftsmith.models import check_tokenizers_compatible, load_target_tokenizer, load_tokenizer

    target_tok = load_target_tokenizer(cfg.target)
    trust = cfg.target.trust_remote_code
    for d in drafts:
        label = draft_label(d)
        path = Path(draft_path(d))
        if d.role in TRAINED_ROLES:
            read_meta(path)
        if path.is_dir():
            check_weight_files(path)
        if not kind_of(d).own_tokenizer:  # a head reads the target's own tokens
            continue
        tok = load_tokenizer(d.ref, trust_remote_code=trust, key=d.config_key)
        check_tokenizers_compatible(target_tok, tok, cfg.target.model, label)
