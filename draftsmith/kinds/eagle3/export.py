"""Save and load an Eagle3Head in the speculators format (what vLLM serves as `method: eagle3`).

A directory holds:

    config.json              speculators_model_type "eagle3", architectures ["Eagle3Speculator"],
                             draft_vocab_size, norm_before_residual, target_hidden_size,
                             eagle_aux_hidden_state_layer_ids, transformer_layer_config (the
                             1-layer Llama config; its vocab_size is the TARGET's),
                             speculators_config {algorithm, proposal_methods[0].speculative_tokens,
                             default_proposal_method, verifier {name_or_path, architectures}}
    model.safetensors        fc.weight, layers.0.*, norm.weight, lm_head.weight (Vd rows),
                             d2t (Vd,) int64 offsets, t2d (V,) bool
    speculative_config.json  {"method": "eagle3", "model": <dir>, "num_speculative_tokens": k}

The target's embeddings are left out unless include_embeddings=True. vLLM shares the
target's embed_tokens with a draft that ships none (and with one that ships an identical
copy). speculators 0.9.0 means to fill a missing embed_tokens from the verifier
(speculators_config.verifier.name_or_path) when it is still NaN, but under transformers
5.x (seen with 5.19 and 5.24) the missing tensor is materialised as uninitialised memory,
not NaN, so in some processes it keeps garbage (it depends on PYTHONHASHSEED): a
checkpoint meant to be loaded by speculators should include them (V x d more on disk).
lm_head must be the trained reduced head: nothing replaces a checkpoint's own lm_head.

norm_before_residual is always written: speculators defaults it to False, vLLM's config
converter to True, so a checkpoint without it means different models to the two.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_dir, atomic_write_json
from draftsmith.kinds.eagle3.config import eagle3_settings
from draftsmith.kinds.eagle3.head import Eagle3Head
from draftsmith.kinds.eagle3.vocab import DraftVocab, vocab_problem
from draftsmith.models import load_target, load_target_config, resolve_model

WEIGHTS = "model.safetensors"
LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
)
REQUIRED_WEIGHTS = (
    "fc.weight",
    *(f"layers.0.{k}" for k in LAYER_KEYS),
    "norm.weight",
    "lm_head.weight",
)


def eagle3_config(head: Eagle3Head, target_config, verifier_name_or_path: str, k: int) -> dict:
    """config.json for `head` in speculators 0.9's Eagle3SpeculatorConfig layout."""
    layer = head.config.to_diff_dict()
    layer["rope_theta"] = head.config.rope_parameters["rope_theta"]  # older vLLM reads this key
    layer.pop("transformers_version", None)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": head.d2t.numel(),
        "norm_before_residual": head.norm_before_residual,
        "target_hidden_size": target_config.get_text_config().hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layer_ids),
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(k),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": str(verifier_name_or_path),
                "architectures": list(getattr(target_config, "architectures", None) or []),
            },
        },
    }


def write_eagle3(
    head: Eagle3Head,
    out_dir: str | Path,
    target_config,
    verifier_name_or_path: str,
    k: int,
    include_embeddings: bool = False,
    final_path: str | Path | None = None,
) -> None:
    """Write `head` (its d2t/t2d included) into the existing dir out_dir, after the checks.

    include_embeddings writes the target's embed_tokens.weight too (see the module doc);
    speculative_config.json names `final_path` (default out_dir): where the dir will live
    once a caller building it under a temp name has renamed it.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    tc = target_config.get_text_config()
    if tc.vocab_size != head.t2d.numel() or tc.hidden_size != head.config.hidden_size:
        raise DraftsmithError(
            f"eagle3 export: the head was built for vocab {head.t2d.numel()} / hidden "
            f"{head.config.hidden_size}, the target has {tc.vocab_size} / {tc.hidden_size}"
        )
    config = eagle3_config(head, target_config, verifier_name_or_path, k)
    weights = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    if include_embeddings:
        if head.embed_tokens is None:
            raise DraftsmithError(f"eagle3 export {out}: the head has no embeddings to include")
        weights["embed_tokens.weight"] = head.embed_tokens.weight.detach().cpu().contiguous()
    problem = _config_problem(config) or _weights_problem(config, weights)
    if problem:  # checked before anything is written: a bad export never lands
        raise DraftsmithError(f"eagle3 export {final_path or out}: {problem}")
    atomic_write_json(out / "config.json", config)
    save_file(weights, out / WEIGHTS, metadata={"format": "pt"})
    atomic_write_json(
        out / "speculative_config.json",
        speculative_config(Path(final_path or out), k),
    )


def speculative_config(path: Path, k: int) -> dict:
    """vLLM's speculative_config for the export at `path`."""
    return {"method": "eagle3", "model": str(path.resolve()), "num_speculative_tokens": int(k)}


def save_eagle3(
    head: Eagle3Head,
    out_dir: str | Path,
    target_config,
    verifier_name_or_path: str,
    k: int,
    overwrite: bool = False,
    include_embeddings: bool = False,
) -> Path:
    """write_eagle3 into out_dir atomically: the dir appears complete or not at all.

    An existing out_dir is the export stage's error (exit 1, export.overwrite replaces it).
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise DraftsmithError(f"{out}: export dir exists; set export.overwrite=true to replace it")
    with atomic_dir(out, overwrite=overwrite) as tmp:
        write_eagle3(head, tmp, target_config, verifier_name_or_path, k, include_embeddings, out)
    return out


# ----------------------------------------------------------------------------- validation


def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise DraftsmithError(f"{path}: no config.json; not an eagle3 export") from None
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{path / 'config.json'}: not valid JSON ({e})") from None


def _config_problem(cfg: dict) -> str | None:
    if cfg.get("speculators_model_type") != "eagle3":
        return f"speculators_model_type is {cfg.get('speculators_model_type')!r}, not 'eagle3'"
    for key in (
        "architectures",
        "draft_vocab_size",
        "norm_before_residual",
        "target_hidden_size",
        "eagle_aux_hidden_state_layer_ids",
        "transformer_layer_config",
        "speculators_config",
    ):
        if key not in cfg:
            return f"{key} missing"
    layer, spec = cfg["transformer_layer_config"], cfg["speculators_config"]
    if not isinstance(layer, dict) or not {"vocab_size", "hidden_size"} <= layer.keys():
        return "transformer_layer_config must be a dict with vocab_size and hidden_size"
    try:
        methods = spec["proposal_methods"]
        k = methods[0]["speculative_tokens"]
        default = spec["default_proposal_method"]
        verifier = spec["verifier"]["name_or_path"]
    except (KeyError, IndexError, TypeError):
        return (
            "speculators_config needs algorithm, proposal_methods[0].speculative_tokens, "
            "default_proposal_method and verifier.name_or_path"
        )
    if spec.get("algorithm") != "eagle3":
        return f"speculators_config.algorithm is {spec.get('algorithm')!r}, not 'eagle3'"
    if not isinstance(k, int) or k < 1:
        return f"speculative_tokens must be a positive integer, got {k!r}"
    if default not in [m.get("proposal_type") for m in methods]:
        return f"default_proposal_method {default!r} is not among proposal_methods"
    if not verifier:
        return "speculators_config.verifier.name_or_path is empty"
    if len(cfg["eagle_aux_hidden_state_layer_ids"]) != 3:
        return "eagle_aux_hidden_state_layer_ids must hold 3 layer ids"
    return None


def _weights_problem(cfg: dict, w: dict) -> str | None:
    vd, layer = cfg["draft_vocab_size"], cfg["transformer_layer_config"]
    V, d, td = layer["vocab_size"], layer["hidden_size"], cfg["target_hidden_size"]
    if "d2t" not in w:
        return (
            "d2t missing: vLLM then maps draft id i onto target id i (the first "
            f"{vd} ids); save the d2t offsets"
        )
    if "t2d" not in w:
        return "t2d missing: save the t2d mask of the draft vocabulary"
    missing = [k for k in REQUIRED_WEIGHTS if k not in w]
    if missing:
        return f"weights missing: {', '.join(missing)}"
    rows = w["lm_head.weight"].shape[0]
    if rows != vd:
        if rows == V:
            return (
                f"lm_head.weight has {V} rows (the target's full vocabulary) instead of "
                f"draft_vocab_size={vd}: export the trained reduced head"
            )
        return f"lm_head.weight has {rows} rows, draft_vocab_size is {vd}"
    if w["d2t"].shape != (vd,) or w["t2d"].shape != (V,):
        return (
            f"d2t has shape {tuple(w['d2t'].shape)} and t2d {tuple(w['t2d'].shape)}; "
            f"expected ({vd},) and ({V},)"
        )
    problem = vocab_problem(w["d2t"], w["t2d"])
    if problem:
        return problem
    shapes = {
        "fc.weight": (d, 3 * td),
        "lm_head.weight": (vd, d),
        "norm.weight": (d,),
        "layers.0.hidden_norm.weight": (d,),
        "layers.0.input_layernorm.weight": (d,),
    }
    if "embed_tokens.weight" in w:
        shapes["embed_tokens.weight"] = (V, d)
    for name, shape in shapes.items():
        if tuple(w[name].shape) != shape:
            return f"{name} has shape {tuple(w[name].shape)}, expected {shape}"
    q_in = w["layers.0.self_attn.q_proj.weight"].shape[1]
    if q_in != 2 * d:
        return f"layers.0.self_attn.q_proj.weight reads {q_in} features, expected 2 x {d}"
    return None


def validate_eagle3_export(path: str | Path) -> None:
    """Raise DraftsmithError with one line naming the first problem of an eagle3 export."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = _read_config(path)
    problem = _config_problem(cfg)
    if problem:
        raise DraftsmithError(f"{path / 'config.json'}: {problem}")
    if not (path / WEIGHTS).is_file():
        raise DraftsmithError(f"{path}: no {WEIGHTS}")
    problem = _weights_problem(cfg, load_file(path / WEIGHTS))
    if problem:
        raise DraftsmithError(f"{path / WEIGHTS}: {problem}")


# ----------------------------------------------------------------------------- loading


def load_eagle3(path: str | Path, target=None) -> Eagle3Head:
    """An Eagle3Head from an export (validated first).

    Embeddings: the target's when `target` is given (their shape must match), else the
    checkpoint's embed_tokens.weight when it ships one, else none (attach them later).
    """
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    path = Path(path)
    validate_eagle3_export(path)
    cfg = _read_config(path)
    weights = load_file(path / WEIGHTS)
    layer_config = LlamaConfig.from_dict(cfg["transformer_layer_config"])
    embed = None
    if target is not None:
        embed = target.get_input_embeddings()
        if tuple(embed.weight.shape) != (layer_config.vocab_size, layer_config.hidden_size):
            raise DraftsmithError(
                f"{path}: the head expects embeddings {layer_config.vocab_size} x "
                f"{layer_config.hidden_size}, the target has {tuple(embed.weight.shape)}"
            )
    elif "embed_tokens.weight" in weights:
        embed = nn.Embedding.from_pretrained(weights["embed_tokens.weight"], freeze=True)
    weights.pop("embed_tokens.weight", None)
    head = Eagle3Head(
        layer_config,
        DraftVocab(weights["d2t"], weights["t2d"]),
        cfg["eagle_aux_hidden_state_layer_ids"],
        cfg["norm_before_residual"],
        embed,
    )
    head.load_state_dict(weights, strict=True)
    return head if target is None else head.to(next(target.parameters()).device)


# ----------------------------------------------------------------------------- the export stage


def target_embeddings(cfg: Config):
    """The target's input embedding module (read from its safetensors files where they
    name it, so a large target is not loaded whole; else from the loaded model, on CPU)."""
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
                return nn.Embedding.from_pretrained(f.get_tensor(key).float(), freeze=True)
    return load_target(cfg.target, torch.device("cpu"), torch.float32).get_input_embeddings()


def export_eagle3(cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None:
    """An eagle3 head (its checkpoint dir `src`) in the speculators layout vLLM serves as
    method `eagle3`, validated."""
    head = load_eagle3(src)  # a checkpoint holds no embeddings: the target's go in
    include = eagle3_settings(cfg).include_embeddings
    if include:
        head.attach_embeddings(target_embeddings(cfg))
    target_path = resolve_model(cfg.target.model, "target.model")
    write_eagle3(head, tmp, load_target_config(cfg.target), target_path, k, include, final_path=out)
    validate_eagle3_export(tmp)
