"""draftsmith: distill, verify and export draft models for speculative decoding."""

__version__ = "0.1.0"

# The kinds registry, imported with the package so every built-in kind, and its config
# section draft.<kind>, is registered before any module loads a config.
import draftsmith.kinds  # noqa: E402, F401
