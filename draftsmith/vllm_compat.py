"""The one place draftsmith imports vLLM, and the oldest vLLM it accepts.

vLLM's V1 engine runs an independent draft model (speculative_config method
"draft_model") from release 0.15.0 on: in 0.14.x and earlier,
vllm/config/speculative.py raises NotImplementedError("Speculative decoding with draft
model is not supported yet ...") for it; 0.15.0 accepts the method and ships
vllm/v1/spec_decode/draft_model.py (README, "vLLM"). The `vllm` extra pins the same
floor, and an older install is refused here with one line instead of failing inside
vLLM after the models are loaded.
"""

from __future__ import annotations

from draftsmith.config import Config, VllmConfig
from draftsmith.errors import DraftsmithError

MIN_VLLM = (0, 15, 0)
MIN_VLLM_TEXT = ".".join(map(str, MIN_VLLM))


def vllm_release(version: str) -> tuple[int, ...] | None:
    """'0.15.1' -> (0, 15, 1); pre-releases and dev builds count as their release
    ('0.15.0rc1.dev3+gabc' -> (0, 15, 0)); None when unparseable."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        return None


def import_vllm(key: str):
    """Import vLLM for the config key that asked for it (e.g. 'evaluate.backend').

    Raises DraftsmithError naming `key` when vLLM is missing or older than MIN_VLLM.
    """
    try:
        import vllm
    except ImportError:
        raise DraftsmithError(
            f"{key}: 'vllm' needs vLLM >= {MIN_VLLM_TEXT}, which is not installed "
            "(pip install 'draftsmith[vllm]' on a CUDA machine), or use the default backend"
        ) from None
    installed = str(getattr(vllm, "__version__", "unknown"))
    release = vllm_release(installed)
    if release is None or release < MIN_VLLM:
        raise DraftsmithError(
            f"{key}: 'vllm' needs vLLM >= {MIN_VLLM_TEXT} (the first release whose V1 engine "
            f"runs an independent draft model, method 'draft_model'); installed: {installed} "
            "(pip install -U 'draftsmith[vllm]')"
        )
    return vllm


def engine_kwargs(cfg: Config, vllm_cfg: VllmConfig, model_path: str) -> dict:
    """vllm.LLM keyword arguments for the target: the same for generate and evaluate."""
    kw = dict(
        model=model_path,
        tensor_parallel_size=vllm_cfg.tensor_parallel_size,
        dtype=cfg.target.dtype,  # "auto" | "float32" | "bfloat16" | "float16": vLLM's names
        gpu_memory_utilization=vllm_cfg.gpu_memory_utilization,
        seed=cfg.run.seed,
        trust_remote_code=cfg.target.trust_remote_code,
    )
    if vllm_cfg.max_model_len is not None:
        kw["max_model_len"] = vllm_cfg.max_model_len
    if cfg.target.revision:
        kw["revision"] = cfg.target.revision
    return kw
