"""The independent kind's export files: a clean HF model dir a serving stack loads.

vLLM runs it as method `draft_model` (on the target's vocabulary row count), transformers
as `assistant_model=` (set to draft k tokens per round); draftsmith/export.py writes the
model card and leaderboard row around it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_write_json, checked_read_json
from draftsmith.models import load_tokenizer, resolve_model
from draftsmith.vocab_rows import match_vocab_rows, token_id_count

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


def copy_model_files(src: Path, dest: Path) -> list[str]:
    if not (src / "config.json").is_file():
        raise DraftsmithError(f"{src}: not a model directory (no config.json)")
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
    """Rewrite the exported draft on the target's row count, padding rows filled (vocab_rows.py).

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
    fix = "it was copied from the draft's own model dir; repair or delete the file there"
    gc = checked_read_json(path, fix) if path.is_file() else {}
    atomic_write_json(path, {**gc, **fixed_k_assistant(k)})


def verify_export(cfg: Config, model_dir: Path, src: Path) -> None:
    """The exported weights load as the model config.json describes, or nothing is shipped."""
    from draftsmith.integrity import check_model_shapes

    check_model_shapes(
        model_dir,
        fix=f"nothing was exported; {src} is damaged: choose another export.checkpoint or "
        "retrain it",
        trust_remote_code=cfg.target.trust_remote_code,
    )


def export_independent(cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None:
    """An independent draft (its checkpoint dir `src`): its HF model dir on the target's row
    count, its weights checked in shape, set to draft k."""
    copy_model_files(src, tmp)
    match_target_vocab(cfg, tmp)
    verify_export(cfg, tmp, src)
    assistant_generation_config(tmp / "generation_config.json", k)
    atomic_write_json(tmp / "speculative_config.json", speculative_config(out, k))
