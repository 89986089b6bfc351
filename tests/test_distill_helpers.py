"""Helpers for the distill tests: a tiny run dir with a generate-shaped dataset.

Until the generate stage lands, the tests write `<out>/data/dataset` themselves with
the contract columns (prompt_ids, completion_ids, category, source, split, and the
target's top-k log-probs aligned with the completion tokens).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from draftsmith.config import config_from_dict


def write_dataset(
    out: Path, target_dir: Path, n: int = 16, k: int = 8, seed: int = 0, num_ids: int | None = None
) -> None:
    """`num_ids`: token ids are drawn below it (the tokenizer's ids), default the target's rows."""
    import datasets
    from transformers import AutoModelForCausalLM

    g = torch.Generator().manual_seed(seed)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    vocab = num_ids or target.config.vocab_size
    rows = {
        k_: []
        for k_ in (
            "prompt_ids",
            "completion_ids",
            "prompt_text",
            "completion_text",
            "category",
            "source",
            "split",
            "topk_ids",
            "topk_logprobs",
        )
    }
    for i in range(n):
        p = int(torch.randint(3, 10, (1,), generator=g))
        c = int(torch.randint(4, 12, (1,), generator=g))
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        completion = torch.randint(3, vocab, (c,), generator=g).tolist()
        with torch.no_grad():
            logits = target(torch.tensor([prompt + completion])).logits[0]  # (p+c, V)
        logp = torch.log_softmax(logits[p - 1 : p + c - 1].float(), -1)  # predicts completion
        vals, ids = logp.topk(k, -1)
        rows["prompt_ids"].append(prompt)
        rows["completion_ids"].append(completion)
        rows["prompt_text"].append(f"p{i}")
        rows["completion_text"].append(f"c{i}")
        rows["category"].append("code" if i % 2 else "chat")
        rows["source"].append("test")
        rows["split"].append("train")
        rows["topk_ids"].append(ids.tolist())
        rows["topk_logprobs"].append(vals.tolist())
    ds = datasets.Dataset.from_dict(rows)
    ds.save_to_disk(str(out / "data" / "dataset"))
    (out / "data" / "meta.json").write_text(json.dumps({"num_train": n, "topk_logprobs": k}))


def make_cfg(out: Path, target_dir: Path, **distill):
    # fp32 unless a test asks otherwise: "auto" picks bf16 on CPUs with native bf16 and the
    # tests compare losses against fp32 closed forms
    d = dict(max_steps=4, batch_size=4, warmup_steps=1, lr=1e-3, save_every=2, log_every=1)
    d.setdefault("mixed_precision", "no")
    d.update(distill)
    raw = {
        "run": {"output_dir": str(out), "seed": 0, "device": "cpu"},
        "target": {"model": str(target_dir), "batch_dtype": "float32"},
        "draft": {"init": "from_target", "num_layers": 2},
        "data": {"topk_logprobs": 8},
        "distill": d,
        "tracking": {"wandb": {"mode": "disabled"}},
    }
    return config_from_dict(raw)


def run_dir_with_data(tmp_path: Path, data_dir: Path) -> Path:
    """A fresh run dir whose data/ is the shared dataset (linked) and its meta.json."""
    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    os.symlink(data_dir / "dataset", out / "data" / "dataset")
    (out / "data" / "meta.json").write_text((data_dir / "meta.json").read_text())
    return out


def checkpoint_meta(path: Path) -> dict:
    """A checkpoint's draftsmith_checkpoint.json."""
    return json.loads((path / "draftsmith_checkpoint.json").read_text())


def build_tiny_target(dest: Path, seed: int = 0) -> Path:
    """A 4-layer random Llama with peaked outputs (large init) and the byte tokenizer."""
    from transformers import LlamaForCausalLM

    from draftsmith.models import build_byte_tokenizer, tiny_llama_config

    tok = build_byte_tokenizer()
    torch.manual_seed(seed)
    cfg = tiny_llama_config(
        len(tok),
        hidden_size=32,
        intermediate_size=64,
        initializer_range=0.2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def read_wandb_history(wandb_dir: Path) -> list[dict]:
    """History rows of every offline run under wandb_dir, parsed from the .wandb log itself.

    The file is a LevelDB-style log (7-byte W&B header, 32 KiB blocks, records of
    checksum/length/type + a protobuf `Record`); wandb's own protobuf parses each record.
    """
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for f in sorted(Path(wandb_dir).rglob("*.wandb")):
        data, pos, buf, block = f.read_bytes(), 7, b"", 32768
        chunks = []
        while pos + 7 <= len(data):
            if block - pos % block < 7:
                pos += block - pos % block
                continue
            _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
            chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
            if kind == 1:
                chunks.append(chunk)
            elif kind == 2:
                buf = chunk
            elif kind == 3:
                buf += chunk
            elif kind == 4:
                chunks.append(buf + chunk)
        for c in chunks:
            rec = pb.Record()
            rec.ParseFromString(c)
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in rec.history.item
                    }
                )
    return rows
