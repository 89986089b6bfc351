"""Export: the chosen draft as its serving stack loads it, a vLLM speculative config and a model card.

Reads `<output_dir>/eval/leaderboard.json` (written by evaluate) and writes
`<output_dir>/export/` (or `export.output_dir`) atomically: the directory
appears complete or not at all. What the model files are is the chosen row's kind's
business (draftsmith/kinds.py): an independent draft is a clean HF model dir (vLLM
method `draft_model`, or transformers' `assistant_model=`), an eagle3 head the
speculators layout (vLLM method `eagle3`), validated before the rename.
"""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate.report import format_comparison
from draftsmith.io import atomic_dir, atomic_write_json
from draftsmith.kinds import get_kind
from draftsmith.models import load_tokenizer, resolve_model
from draftsmith.vocab import match_vocab_rows, token_id_count

# What a serving stack needs from a checkpoint dir; train state stays behind.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def export_dir(cfg: Config) -> Path:
    return Path(cfg.export.output_dir) if cfg.export.output_dir else cfg.output_dir / "export"


def read_leaderboard(cfg: Config) -> dict:
    path = cfg.output_dir / "eval" / "leaderboard.json"
    if not path.is_file():
        raise DraftsmithError(f"{path}: no leaderboard yet; run `draftsmith evaluate CONFIG` first")
    board = json.loads(path.read_text())
    if not board.get("rows"):
        raise DraftsmithError(f"{path}: the leaderboard has no rows")
    return board


def choose_row(board: dict, checkpoint: str | None) -> dict:
    """The row named by export.checkpoint, else the leaderboard's best."""
    wanted = checkpoint or board["best"]
    for row in board["rows"]:
        if row["checkpoint"] == wanted:
            return row
    names = ", ".join(r["checkpoint"] for r in board["rows"])
    raise DraftsmithError(
        f"export.checkpoint: {wanted!r} is not on the leaderboard (have: {names})"
    )


def copy_model_files(src: Path, dest: Path) -> list[str]:
    if not (src / "config.json").is_file():
        raise DraftsmithError(f"export.checkpoint: {src} is not a model directory (no config.json)")
    copied = []
    for name in MODEL_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    for shard in sorted(src.glob("model-*.safetensors")):
        shutil.copy2(shard, dest / shard.name)
        copied.append(shard.name)
    return copied


def _vocab_size(path: str, **kw) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, **kw).get_text_config().vocab_size


def match_target_vocab(cfg: Config, model_dir: Path) -> None:
    """Rewrite the exported draft on the target's row count, padding rows filled (vocab.py).

    vLLM's `draft_model` method refuses a draft whose vocab_size differs from the target's,
    and it does not cut rows past the tokenizer the way draftsmith's engine does: those
    are set to the mean of the real rows (again: training moved the real ones), so greedy
    drafting never proposes one. A draft with neither difference is left as copied.
    """
    t = cfg.target
    target_rows = _vocab_size(
        resolve_model(t.model, "target.model"),
        trust_remote_code=t.trust_remote_code,
        revision=t.revision,
    )
    num_ids = token_id_count(load_tokenizer(str(model_dir), key="export.checkpoint"))
    remote = t.trust_remote_code
    if _vocab_size(str(model_dir), trust_remote_code=remote) == target_rows == num_ids:
        return
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", trust_remote_code=remote)
    match_vocab_rows(lm, target_rows, num_ids, key="target.model")
    for old in [*model_dir.glob("model*.safetensors"), model_dir / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)  # save_pretrained may shard differently
    lm.save_pretrained(model_dir)


def speculative_config(model_dir: Path, k: int) -> dict:
    return {"method": "draft_model", "model": str(model_dir.resolve()), "num_speculative_tokens": k}


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _data_summary(cfg: Config) -> str:
    meta_path = cfg.output_dir / "data" / "meta.json"
    if not meta_path.is_file():
        return "- (no data/meta.json found)"
    meta = json.loads(meta_path.read_text())
    sources = ", ".join(s.builtin or s.path or s.hub or "?" for s in cfg.data.sources)
    keys = (
        "num_prompts",
        "num_completions",
        "num_completion_tokens",
        "num_eval_prompts",
        "num_skipped",
    )
    facts = ", ".join(f"{k.replace('num_', '')}: {meta[k]}" for k in keys if k in meta)
    out = f"- prompt sources: {sources}\n- {facts}"
    sampling = meta.get("sampling")
    if sampling:  # greedy or sampled target text changes what the losses learn (README)
        t = sampling.get("temperature")
        how = "greedy" if t == 0 else f"sampled at temperature {t}, top-p {sampling.get('top_p')}"
        out += f"\n- target outputs: {how}, at most {sampling.get('max_new_tokens')} new tokens"
    return out


def _training(cfg: Config, row: dict) -> str:
    """How the exported draft was trained: its own loss, not just the run's configured one."""
    d = cfg.distill
    role, steps = row.get("role"), row.get("trained_steps", row.get("step"))
    batch = f"batch {d.batch_size} x {d.grad_accum_steps} accumulation, lr {d.lr}"
    if role == "init":
        return "none: the untrained initialisation ranked best"
    if role == "baseline":
        return "an external draft (evaluate.baselines), not trained by this run"
    ttt = ""
    if row.get("kind", "independent") == "eagle3":
        e = cfg.draft.eagle3
        ttt = f", training-time test {e.ttt_steps} steps (step weights {e.ttt_loss_decay}^j)"
    if role == "ce_twin":
        return (
            f"ce (plain cross-entropy on the target's outputs: the run's distill.ce_baseline "
            f"twin, which ranked above the {d.loss} draft), {steps} steps, {batch}{ttt}"
        )
    teacher = "online" if ttt else d.teacher  # a head learns from the forward it reads
    return (
        f"{d.loss} (teacher: {teacher}, temperature {d.temperature}), {steps} steps, {batch}{ttt}"
    )


def _comparisons(board: dict) -> str:
    """The run's paired comparisons (distilled vs CE twin / init), or nothing."""
    lines = [f"- {format_comparison(c)}" for c in board.get("comparisons", [])]
    if not lines:
        return ""
    return "Against the run's other drafts, same prompts:\n" + "\n".join(lines) + "\n"


def fixed_k_assistant(k: int) -> dict:
    """Generation-config fields that make transformers' assisted generation draft k per round.

    transformers reads the round size, its schedule and the confidence stop from the
    *assistant's* generation config, not from generate()'s kwargs; its default stop
    (threshold 0.4) drafts fewer tokens than k with a weak draft. Threshold 0: no stop.
    """
    return {
        "num_assistant_tokens": k,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


def assistant_generation_config(path: Path, k: int) -> None:
    """The exported draft drafts k tokens per round as `assistant_model=`, as measured."""
    gc = json.loads(path.read_text()) if path.is_file() else {}
    atomic_write_json(path, {**gc, **fixed_k_assistant(k)})


def _initialisation(cfg: Config, row: dict, out: Path) -> str:
    """The card's description of what the draft is: its kind and how it started."""
    if row.get("kind", "independent") == "eagle3":
        head = json.loads((out / "config.json").read_text())
        return (
            f"eagle3 head (one decoder layer on the target's hidden states of layers "
            f"{head['eagle_aux_hidden_state_layer_ids']}, draft vocabulary of "
            f"{head['draft_vocab_size']} tokens, norm_before_residual "
            f"{str(head['norm_before_residual']).lower()})"
        )
    return (
        "independent draft: "
        + cfg.draft.init
        + (
            f" ({cfg.draft.num_layers} layers, {cfg.draft.layer_selection})"
            if cfg.draft.init == "from_target"
            else ""
        )
    )


def _usage(row: dict, spec: str, target_path: str, out: Path, k: int) -> str:
    """How to serve it: vLLM for both kinds; transformers' assistant_model for a causal LM."""
    vllm = f"""vLLM:
```
vllm serve {target_path} --speculative-config '{spec}'
```"""
    if row.get("kind", "independent") == "eagle3":
        return f"""{vllm}
(vLLM's default model runner: it keeps this head's reduced lm_head; see draftsmith's README,
section vLLM, for VLLM_USE_V2_MODEL_RUNNER.)
draftsmith's own engine:
```python
from draftsmith.eagle3_export import load_eagle3
from draftsmith.evaluate.eagle3_proposer import Eagle3Proposer
from draftsmith.evaluate.engine import SpeculativeDecoder
head = load_eagle3("{out.resolve()}", target)  # target: the verifier, loaded with transformers
out = SpeculativeDecoder(target, Eagle3Proposer(head), k={k}).generate(prompt_ids, 64).tokens
```"""
    return f"""{vllm}
transformers:
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("{target_path}")
draft = AutoModelForCausalLM.from_pretrained("{out.resolve()}")
tok = AutoTokenizer.from_pretrained("{out.resolve()}")
inputs = tok("Hello", return_tensors="pt")
out = target.generate(**inputs, assistant_model=draft, do_sample=False)  # k={k}: generation_config.json
```"""


def model_card(cfg: Config, board: dict, row: dict, k: int, out: Path, spec: dict) -> str:
    """`out`: the export's files (its final place or the temp dir it is built in)."""
    target = board.get("target", cfg.target.model)
    target_path = resolve_model(cfg.target.model)  # a dir or hub id that vLLM can load
    init = _initialisation(cfg, row, out)
    cats = "\n".join(
        f"| {c} | {_fmt(v.get('acceptance_rate'))} | {_fmt(v.get('mean_accepted_length'), 2)} | "
        f"{v.get('num_prompts', '')} |"
        for c, v in sorted(row.get("per_category", {}).items())
    )
    positions = ", ".join(_fmt(p, 2) for p in row.get("per_position_acceptance", []))
    sweep = "\n".join(
        f"| {s['k']} | {_fmt(s.get('acceptance_rate'))} | {_fmt(s.get('mean_accepted_length'), 2)} | "
        f"{_fmt(s.get('speedup'), 2)} | {_fmt(s.get('modelled_speedup'), 2)} |"
        for s in board.get("k_sweep", [])
    )
    lossless = row.get("lossless_match_rate")
    return f"""# Draft model for {target}

A draft for speculative decoding, distilled and verified by draftsmith. The target
verifies every drafted token, so outputs are exactly the target's own; the draft only
changes speed.

## Draft
- checkpoint: `{row["checkpoint"]}` (step {row.get("trained_steps", row.get("step"))}), chosen by `{board.get("select_metric")}`
- kind: {row.get("kind", "independent")}
- initialisation: {init}
- training: {_training(cfg, row)}

## Data
{_data_summary(cfg)}

## Measured (held-out prompts, real speculative decoding)
Measured on: {board.get("hardware", platform.platform())}, {row.get("num_prompts")} prompts,
k = {row.get("num_speculative_tokens")}, temperature {row.get("temperature")}.

| metric | value |
|---|---|
| acceptance rate (accepted / proposed drafts) | {_fmt(row.get("acceptance_rate"))} |
| alpha (accepted / verified drafts, per-token acceptance) | {_fmt(row.get("alpha"))} |
| mean accepted length (tokens per target forward) | {_fmt(row.get("mean_accepted_length"), 2)} |
| measured speedup over target-only decoding | {_fmt(row.get("speedup"), 2)}x |
| modelled speedup (verify forward = 1 target forward) | {_fmt(row.get("modelled_speedup"), 2)}x |
| modelled speedup (measured verify cost) | {_fmt(row.get("modelled_speedup_verify"), 2)}x |
| draft cost ratio c (draft forward / target forward) | {_fmt(row.get("draft_cost_ratio"))} |
| verify cost ratio v ((k+1)-token / 1-token target forward) | {_fmt(row.get("verify_cost_ratio"), 2)} |
| lossless check (greedy output == target's own) | {_fmt(lossless)} {"(pass)" if lossless == 1.0 else "(FAIL)"} |

Per-position acceptance (given the position was reached): {positions}

| category | acceptance rate | mean accepted length | prompts |
|---|---|---|---|
{cats}

{_comparisons(board)}
### k sweep (recommended k = {k})
| k | acceptance rate | mean accepted length | measured speedup | modelled speedup |
|---|---|---|---|---|
{sweep}

## Use it
{_usage(row, json.dumps(spec), target_path, Path(spec["model"]), k)}
"""


def _log_artifact(cfg: Config, out: Path, row: dict) -> None:
    from draftsmith.tracking import wandb_run

    with wandb_run(cfg, "export") as run:
        if run is None:
            return
        import wandb

        meta = {k: v for k, v in row.items() if isinstance(v, (int, float, str, list, dict))}
        art = wandb.Artifact(name=f"draft-{cfg.output_dir.name}", type="model", metadata=meta)
        art.add_dir(str(out))
        run.log_artifact(art)


def export_independent(cfg: Config, row: dict, k: int, tmp: Path, out: Path) -> None:
    """An independent draft: its HF model dir on the target's row count, set to draft k."""
    copy_model_files(Path(row["path"]), tmp)
    match_target_vocab(cfg, tmp)
    assistant_generation_config(tmp / "generation_config.json", k)
    atomic_write_json(tmp / "speculative_config.json", speculative_config(out, k))


def target_embeddings(cfg: Config):
    """The target's input embedding module (read from its safetensors files where they
    name it, so a large target is not loaded whole; else from the loaded model, on CPU)."""
    import torch
    from safetensors import safe_open

    root = Path(resolve_model(cfg.target.model, "target.model"))
    index = root / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    for name in files:
        if not (root / name).is_file():
            continue
        with safe_open(root / name, "pt") as f:
            names = f.keys()  # safe_open is not iterable
            key = next((k for k in names if k.endswith("embed_tokens.weight")), None)
            if key is not None:
                return torch.nn.Embedding.from_pretrained(f.get_tensor(key).float(), freeze=True)
    from draftsmith.models import load_target

    return load_target(cfg.target, torch.device("cpu"), torch.float32).get_input_embeddings()


def export_eagle3(cfg: Config, row: dict, k: int, tmp: Path, out: Path) -> None:
    """An eagle3 head in the speculators layout vLLM serves as method `eagle3`, validated."""
    from draftsmith.eagle3_export import load_eagle3, validate_eagle3_export, write_eagle3
    from draftsmith.models import load_target_config

    head = load_eagle3(row["path"])  # a checkpoint holds no embeddings: the target's go in
    include = cfg.draft.eagle3.include_embeddings
    if include:
        head.attach_embeddings(target_embeddings(cfg))
    target_path = resolve_model(cfg.target.model, "target.model")
    write_eagle3(head, tmp, load_target_config(cfg.target), target_path, k, include, final_path=out)
    validate_eagle3_export(tmp)


def run_export(cfg: Config) -> Path:
    out = export_dir(cfg)
    if out.exists() and not cfg.export.overwrite:
        raise DraftsmithError(f"{out}: export dir exists; set export.overwrite=true to replace it")
    board = read_leaderboard(cfg)
    row = choose_row(board, cfg.export.checkpoint)
    k = int(
        board.get("recommended_k")
        or row.get("num_speculative_tokens")
        or cfg.evaluate.num_speculative_tokens
    )
    kind = get_kind(row.get("kind", "independent"))
    with atomic_dir(out, overwrite=cfg.export.overwrite) as tmp:
        kind.export(cfg, row, k, tmp, out)
        spec = json.loads((tmp / "speculative_config.json").read_text())
        atomic_write_json(tmp / "leaderboard_row.json", row)
        (tmp / "README.md").write_text(model_card(cfg, board, row, k, tmp, spec))
    _log_artifact(cfg, out, row)
    print(f"exported {row['checkpoint']} ({kind.name}) to {out} (recommended k={k})")
    return out
