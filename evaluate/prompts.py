"""Reading the stage inputs: held-out eval prompts and the drafts to evaluate."""

from __future__ import annotations

from pathlib import Path

from draftsmith.data import load_eval_prompts
from draftsmith.distill import list_checkpoints
from draftsmith.errors import DraftsmithError
from draftsmith.kinds import get_kind


def load_prompts(output_dir: Path) -> list[dict]:
    prompts = load_eval_prompts(output_dir)
    path = Path(output_dir) / "data" / "eval_prompts.jsonl"
    if not prompts:
        raise DraftsmithError(f"{path}: holds no eval prompts")
    for i, p in enumerate(prompts):
        if not p.get("prompt_ids"):
            raise DraftsmithError(f"{path}: prompt {p.get('id', i)} has no prompt_ids")
        p.setdefault("id", str(i))
        p.setdefault("category", "default")
    return prompts


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


def list_drafts(
    output_dir: Path,
    baselines: list[str],
    ce_baseline: bool = False,
    kinds: list[str] | tuple[str, ...] = ("independent",),
) -> list[dict]:
    """Each kind's checkpoint-<step> (by step) and its CE twin's last checkpoint, then
    evaluate.baselines.

    `kind` says which kind of draft it is (draftsmith/kinds.py: how it is loaded and run;
    baselines are independent drafts); `name` is unique across kinds (an eagle3 checkpoint
    is `eagle3-checkpoint-<step>`). `role` says what a draft is, for reports: "init"
    (checkpoint-0), "distilled" (the configured loss), "ce_twin" (distill.ce_baseline) or
    "baseline" (evaluate.baselines); `trained_steps` how far this run trained it (None for
    a baseline).
    """
    drafts, dirs = [], []
    for kind in map(get_kind, kinds):
        ckpt_dir = kind.checkpoints_dir(output_dir)
        dirs.append(str(ckpt_dir))
        drafts += [
            {
                "name": kind.draft_name(p.name),
                "ref": str(p),
                "step": step,
                "role": "distilled" if step else "init",
                "trained_steps": step,
                "kind": kind.name,
            }
            for step, p in list_checkpoints(ckpt_dir)
        ]
        if ce_baseline:
            # distill.ce_baseline: same data, steps and init, plain cross-entropy (distill/stage.py)
            twin = list_checkpoints(kind.ce_dir(output_dir))
            if twin:
                step, path = twin[-1]
                # step None keeps it off the per-step plots; trained_steps says how far it went
                drafts.append(
                    {
                        "name": kind.draft_name(f"ce-{path.name}"),
                        "ref": str(path),
                        "step": None,
                        "role": "ce_twin",
                        "trained_steps": step,
                        "kind": kind.name,
                    }
                )
    for i, ref in enumerate(baselines):
        path = Path(ref).expanduser()
        name = path.name if path.exists() else ref
        key = f"evaluate.baselines[{i}]"
        drafts.append(
            {
                "name": name,
                "ref": ref,
                "step": None,
                "role": "baseline",
                "trained_steps": None,
                "key": key,
                "kind": "independent",
            }
        )
    if not drafts:
        raise DraftsmithError(
            f"{', '.join(dirs)}: no checkpoints to evaluate (and evaluate.baselines is empty); "
            "run `draftsmith distill CONFIG` first"
        )
    return drafts
