"""Things defined once and used everywhere: loss names, leaderboard metric keys, EOS ids,
the vLLM config section, the model fingerprint."""

from __future__ import annotations

import dataclasses
import shutil
import typing
from types import SimpleNamespace

import pytest
import torch
from board_rows import make_row

from draftsmith.config import (
    ConfigError,
    DataConfig,
    DistillConfig,
    EvaluateConfig,
    VllmConfig,
    config_from_dict,
)
from draftsmith.distill.losses import LOSSES, distill_loss
from draftsmith.evaluate.ranking import sweep_entry
from draftsmith.evaluate.report import CSV_FIELDS, METRIC_KEYS, TABLE_COLUMNS, format_table
from draftsmith.models import eos_token_ids, model_fingerprint


def test_loss_names_are_the_configs_choices_and_each_one_dispatches():
    choices = typing.get_args(typing.get_type_hints(DistillConfig)["loss"])
    assert LOSSES == choices == ("forward_kl", "reverse_kl", "jsd", "tvd", "ce")
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 7), torch.randn(5, 7)
    labels, mask = torch.randint(0, 7, (5,)), torch.ones(5, dtype=torch.bool)
    for name in LOSSES:
        assert config_from_dict({"distill": {"loss": name}}).distill.loss == name
        out = distill_loss(name, student, teacher, labels, mask)
        assert out.count == 5 and torch.isfinite(out.total)
    # the same logits as teacher and student: every divergence is 0, CE is not
    same = {n: float(distill_loss(n, student, student, labels, mask).total) for n in LOSSES}
    assert all(abs(same[n]) < 1e-5 for n in LOSSES if n != "ce") and same["ce"] > 0
    with pytest.raises(ConfigError, match="distill.loss: expected one of 'forward_kl'"):
        config_from_dict({"distill": {"loss": "kl"}})
    with pytest.raises(ValueError, match="unknown loss 'kl'"):
        distill_loss("kl", student, teacher, labels, mask)


def test_sweep_entries_table_and_csv_share_the_metric_keys():
    row = make_row(
        "checkpoint-1",
        **{key: i / 10 for i, key in enumerate(METRIC_KEYS)},
        num_speculative_tokens=3,
        measured_by="teacher_forced",
        tokens_generated=9,  # not a metric column: no sweep entry carries it
    )
    assert sweep_entry(row) == {"k": 3, **{key: getattr(row, key) for key in METRIC_KEYS}}
    # the table adds the draft's kind, who measured the row, over how many prompts, the
    # speedup's spread, and the echo split (share of tokens copying the prompt, alpha on the rest)
    table_keys = tuple(key for key, _, _ in TABLE_COLUMNS)
    assert tuple(k for k in table_keys if k in METRIC_KEYS) == METRIC_KEYS
    assert set(table_keys) - set(METRIC_KEYS) == {
        "checkpoint",
        "kind",
        "step",
        "measured_by",
        "num_prompts",
        "speedup_iqr",
        "echo_share",
        "alpha_new",
    }
    assert CSV_FIELDS[: 3 + len(METRIC_KEYS)] == ("checkpoint", "kind", "step", *METRIC_KEYS)
    board = {"rows": [row], "best": "c", "select_metric": "alpha", "recommended_k": 3}
    heading, header = format_table(board).splitlines()[:2]  # every row names its eval set
    assert heading == "== eval set heldout =="
    assert header.split() == [title for _, title, _ in TABLE_COLUMNS]


def test_eos_ids_from_tokenizer_and_generation_config():
    tok = SimpleNamespace(eos_token_id=2)
    assert eos_token_ids(tok) == {2}
    assert eos_token_ids(tok, SimpleNamespace(eos_token_id=[2, 7])) == {2, 7}
    assert eos_token_ids(tok, SimpleNamespace(eos_token_id=9)) == {2, 9}
    assert eos_token_ids(SimpleNamespace(eos_token_id=None), None) == set()
    assert eos_token_ids(None, SimpleNamespace(eos_token_id=(3,))) == {3}


def test_one_vllm_section_class_with_the_same_keys_in_both_places():
    hints = (typing.get_type_hints(DataConfig), typing.get_type_hints(EvaluateConfig))
    assert hints[0]["vllm"] is hints[1]["vllm"] is VllmConfig
    keys = {f.name for f in dataclasses.fields(VllmConfig)}
    assert keys == {"tensor_parallel_size", "max_model_len", "gpu_memory_utilization"}
    raw = {"tensor_parallel_size": 2, "max_model_len": 1024, "gpu_memory_utilization": 0.5}
    cfg = config_from_dict({"data": {"vllm": raw}, "evaluate": {"vllm": raw}})
    assert dataclasses.asdict(cfg.data.vllm) == dataclasses.asdict(cfg.evaluate.vllm) == raw
    with pytest.raises(ConfigError, match=r"^evaluate\.vllm\.tp: unknown key"):
        config_from_dict({"evaluate": {"vllm": {"tp": 2}}})


def test_model_fingerprint_follows_content_not_path_or_time(tmp_path, tiny_model_dir):
    a = tmp_path / "a"
    shutil.copytree(tiny_model_dir, a)
    first = model_fingerprint(str(a))
    assert first.startswith("sha256-quick:") and first == model_fingerprint(str(tiny_model_dir))
    (a / "model.safetensors").touch()  # a new mtime, the same bytes
    assert model_fingerprint(str(a)) == first
    weights = a / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the same size, one byte of the last tensor changed
    weights.write_bytes(bytes(data))
    assert model_fingerprint(str(a)) != first
    assert model_fingerprint("org/some-hub-model") is None
