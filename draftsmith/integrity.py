"""Is a model directory whole? Weight files checked from their headers, without loading them.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and byte range, then the bytes. Its size is therefore exactly
8 + header length + the end of the last byte range: a truncated file fails that sum,
whatever the cut, and the check reads only the header. `check_weight_files` runs it on
every weight file of a model dir before anything loads it; `check_model_shapes` also
compares every tensor's shape with what the dir's config.json builds (export, which must
never ship a draft that does not load).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from draftsmith.errors import DraftsmithError

# bytes per element of the safetensors dtypes
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def safetensors_header(path: Path) -> dict:
    """The tensors of a safetensors file {name: {dtype, shape, data_offsets}}; raises ValueError
    saying what is wrong when the file is truncated or not safetensors."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(
                f"header of {n} bytes in a {size}-byte file: truncated or not safetensors"
            )
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError("unreadable header: not a safetensors file") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = 0
    for name, t in tensors.items():
        begin, stop = t["data_offsets"]
        width = _DTYPE_BYTES.get(t["dtype"])
        if width is not None and stop - begin != width * math.prod(t["shape"]):
            raise ValueError(f"tensor {name} has {stop - begin} bytes, not what its shape needs")
        end = max(end, stop)
    if size != 8 + n + end:
        raise ValueError(f"{size} bytes where the header promises {8 + n + end}: truncated")
    return tensors


def checkpoint_hint(path: Path) -> str:
    """What to do about a broken distill checkpoint: delete it; distill trains again from the
    newest complete one, so a deleted newest checkpoint is made again."""
    return (
        f"delete {path} and rerun `draftsmith distill CONFIG` (it resumes from the newest "
        "complete checkpoint)"
    )


def fix_for(model_dir: Path) -> str:
    """What to do about a broken weight file, by where the model dir is."""
    from draftsmith.packages import draftsmith_home

    model_dir = Path(model_dir)
    if model_dir.name.startswith("checkpoint-"):
        return checkpoint_hint(model_dir)
    if model_dir.resolve().parent == (draftsmith_home() / "models").resolve():  # the registry
        return f"rebuild it with `draftsmith models pull {model_dir.name} --force`"
    return "replace the model dir with a complete copy"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model dir (a sharded index names them; each must exist)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
            raise DraftsmithError(
                f"{index}: truncated or not a weight index; {fix_for(model_dir)}"
            ) from None
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def check_weight_files(model_dir: Path, fix: str | None = None) -> dict[str, dict]:
    """Every weight file of a local model dir whole; returns all tensors' header entries.

    A missing, truncated or foreign file is one line naming it and `fix` (default: by
    where the dir is, `fix_for`).
    """
    model_dir = Path(model_dir)
    tensors: dict[str, dict] = {}
    for f in weight_files(model_dir):
        try:
            tensors.update(safetensors_header(f))
        except FileNotFoundError:
            raise DraftsmithError(f"{f}: missing; {fix or fix_for(model_dir)}") from None
        except ValueError as e:
            raise DraftsmithError(f"{f}: {e}; {fix or fix_for(model_dir)}") from None
    return tensors


def expected_shapes(model_dir: Path, trust_remote_code: bool = False) -> list[dict[str, tuple]]:
    """What config.json builds, as groups of tied tensor names -> shape (meta device, no memory).

    Tied tensors (an embedding and the head that shares it) form one group: a file needs
    one name of each group.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    groups: dict[int, dict[str, tuple]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), {})[name] = tuple(t.shape)
    return list(groups.values())


def check_model_shapes(model_dir: Path, fix: str, trust_remote_code: bool = False) -> None:
    """The weight files are whole and hold exactly the tensors config.json builds, in its shapes."""
    model_dir = Path(model_dir)
    found = {k: tuple(v["shape"]) for k, v in check_weight_files(model_dir, fix).items()}
    groups = expected_shapes(model_dir, trust_remote_code)
    known = {name for g in groups for name in g}
    problems = [f"unexpected tensor {k}" for k in sorted(set(found) - known)]
    for g in groups:
        present = [n for n in g if n in found]
        if not present:
            problems.append(f"missing tensor {min(g)}")
        problems += [
            f"{n} has shape {list(found[n])}, config.json builds {list(g[n])}"
            for n in present
            if found[n] != g[n]
        ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DraftsmithError(f"{model_dir}: {problems[0]}{more}; {fix}")
