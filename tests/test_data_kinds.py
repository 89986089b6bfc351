"""Data kinds: `score` sources' replies are scored by the target, stored like written text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_generate import kill_after_first_shard

from draftsmith.config import load_config
from draftsmith.data import load_train_dataset
from draftsmith.data.generate import run_generate
from draftsmith.errors import ConfigError
from draftsmith.models import (
    cpu_has_native_bf16,
    load_model,
    load_tokenizer,
    pick_batch_dtype,
)

REPO = Path(__file__).resolve().parents[1]
REPLIES = [f"Answer {i}: " + "the cat sat on the mat. " * (1 + i % 4) for i in range(12)]


def write_conversations(path: Path) -> Path:
    """Finished chats (user, assistant): the assistant turn is what `score` scores."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Question {i}?"},
                {"role": "assistant", "content": r},
            ]
        }
        for i, r in enumerate(REPLIES)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sources(path: Path) -> str:
    return (
        f"data.sources=[{{path: {path}, messages_field: messages, replies: score, role: train}}, "
        "{builtin: draftsmith, limit: 10}]"
    )


def cfg_for(out: Path, conv: Path, *extra: str):
    return load_config(
        REPO / "configs" / "tiny.yaml",
        [
            f"run.output_dir={out}",
            sources(conv),
            "data.max_new_tokens=12",
            "data.max_eval_prompts=2",
            "target.batch_dtype=float32",  # exact comparison with an fp32 forward below
            *extra,
        ],
    )


def test_scored_rows_hold_the_reply_and_the_targets_topk(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    cfg = cfg_for(out, write_conversations(tmp_path / "chats.jsonl"))
    run_generate(cfg)
    ds = load_train_dataset(out)
    scored = ds.filter(lambda r: r["kind"] == "score")
    written = ds.filter(lambda r: r["kind"] == "target")
    assert len(scored) == len(REPLIES) and len(written) > 0
    assert set(scored["source"]) == {"chats.jsonl"} and set(written["source"]) == {"draftsmith"}
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), device=torch.device("cpu"), dtype=torch.float32)
    for row in scored:
        reply = REPLIES[int(row["prompt_text"].split("Question ")[1].split("?")[0])]
        ids = tok(reply, add_special_tokens=False)["input_ids"]
        want = ids + [tok.eos_token_id] if len(ids) < 12 else ids[:12]  # cut, or closed by EOS
        assert row["completion_ids"] == want and row["finish_reason"] == "reference"
        seq = torch.tensor([row["prompt_ids"] + want[:-1]])
        with torch.no_grad():
            logp = model(seq).logits[0, len(row["prompt_ids"]) - 1 :].log_softmax(-1)  # (C, V)
        top = logp.topk(cfg.data.topk_logprobs, -1)
        assert row["topk_ids"] == top.indices.tolist()
        assert torch.allclose(torch.tensor(row["topk_logprobs"]), top.values, atol=1e-4)
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["by_kind"]["score"]["prompts"] == len(REPLIES)
    assert meta["by_kind"]["score"]["tokens"] == sum(map(len, scored["completion_ids"]))
    assert meta["by_kind"]["target"]["tokens"] == sum(map(len, written["completion_ids"]))
    assert meta["cpu_time_s"] > 0 and meta["batch_dtype"] == "torch.float32"


@pytest.mark.parametrize(
    "source, match",
    [
        ("{builtin: draftsmith, replies: score}", "replies: 'score' needs replies to score"),
        ("{builtin: sharegpt, replies: score, role: eval}", "role 'eval' never trains"),
        ("{builtin: draftsmith, reply_field: answer}", "only file and hub sources have fields"),
    ],
)
def test_score_sources_that_cannot_work_are_config_errors(source, match):
    with pytest.raises(ConfigError, match=match):
        load_config(REPO / "configs" / "tiny.yaml", [f"data.sources=[{source}]"])


def test_the_old_key_kind_is_read_as_replies_with_a_warning(capsys):
    old = load_config(
        REPO / "configs" / "tiny.yaml", ["data.sources=[{builtin: sharegpt, kind: score}]"]
    )
    assert old.data.sources[0].replies == "score"
    assert capsys.readouterr().err == (
        "draftsmith: warning: data.sources[0].kind is deprecated, read as data.sources[0].replies\n"
    )
    new = load_config(
        REPO / "configs" / "tiny.yaml", ["data.sources=[{builtin: sharegpt, replies: score}]"]
    )
    assert new == old and capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"^data.sources\[0\].kind: renamed replies; set only"):
        load_config(
            REPO / "configs" / "tiny.yaml",
            ["data.sources=[{builtin: sharegpt, kind: score, replies: target}]"],
        )


def test_score_needs_stored_topk():
    with pytest.raises(ConfigError, match="data.topk_logprobs: must be > 0 when data.sources"):
        load_config(
            REPO / "configs" / "tiny.yaml",
            ["data.sources=[{builtin: sharegpt, replies: score}]", "data.topk_logprobs=0"],
        )


def test_sigkill_mid_scoring_then_resume_equals_uninterrupted(tmp_path, tiny_model_dir):
    conv = write_conversations(tmp_path / "chats.jsonl")
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    extra = ["data.shard_size=2", "data.batch_size=1", "data.max_train_prompts=8"]
    cmd = [sys.executable, "-m", "draftsmith.cli", "generate", "configs/tiny.yaml"]
    args = [
        f"run.output_dir={killed}",
        sources(conv),
        "data.max_new_tokens=12",
        "data.max_eval_prompts=2",
        *extra,
    ]
    kill_after_first_shard(cmd + args, killed)
    rerun = subprocess.run(cmd + args, cwd=REPO, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    run_generate(
        load_config(REPO / "configs" / "tiny.yaml", [f"run.output_dir={clean}", *args[1:]])
    )
    a, b = load_train_dataset(killed), load_train_dataset(clean)
    assert "score" in a["kind"] and a.to_dict() == b.to_dict()


CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx512f {extra}\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bf16(CPUINFO.format(extra="avx512_bf16"))
    assert cpu_has_native_bf16(CPUINFO.format(extra="amx_bf16 amx_tile"))
    assert not cpu_has_native_bf16(CPUINFO.format(extra="avx2"))
    assert not cpu_has_native_bf16("")


def test_the_hardware_record_tells_two_cpus_of_one_architecture_apart():
    """Kernel choices are cached under the hardware record: an AMX Xeon and an EPYC, both
    x86_64 with 2 threads, must not share one."""
    from draftsmith.models import cpu_description

    xeon = "model name\t: Intel(R) Xeon(R) Platinum 8480+\n" + CPUINFO.format(
        extra="avx512_bf16 amx_bf16 amx_tile"
    )
    epyc = "model name\t: AMD EPYC 9R14\n" + CPUINFO.format(extra="avx512_bf16")
    assert cpu_description(xeon) == "Intel(R) Xeon(R) Platinum 8480+ (avx512_bf16, amx_bf16)"
    assert cpu_description(epyc) == "AMD EPYC 9R14 (avx512_bf16)"
    assert cpu_description(CPUINFO.format(extra="avx2")) is None  # no model name line
    assert cpu_description("model name\t: Old\n" + CPUINFO.format(extra="avx2")) == "Old"


def test_batch_dtype_auto_follows_the_cpu_and_the_switch_wins(monkeypatch):
    import draftsmith.models as models

    cfg = load_config(REPO / "configs" / "tiny.yaml")
    cpu = torch.device("cpu")
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(models, "cpu_has_native_bf16", lambda native=native: native)
        assert pick_batch_dtype(cfg.target, cpu) == want
    cfg.target.batch_dtype = "bfloat16"  # the switch, either way
    assert pick_batch_dtype(cfg.target, cpu) == torch.bfloat16
    cfg.target.batch_dtype = "float32"
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert pick_batch_dtype(cfg.target, cpu) == torch.float32
