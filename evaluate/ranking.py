"""What both evaluate backends (native and vLLM) do once the tokens are decoded.

The greedy losslessness check, the ranking of leaderboard rows, the k-sweep entries and
the recommended k, and where a draft's files are. Neither backend imports the other;
both import this.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics
from draftsmith.evaluate.report import METRIC_KEYS
from draftsmith.models import resolve_model


def check_lossless(name: str, spec: list[dict], base: list[dict], on_mismatch: str) -> float:
    """Greedy speculative output must equal target-only output; raise (or warn) naming the prompt."""
    bad = []
    for s, b in zip(spec, base):
        pos = metrics.first_mismatch(s["tokens"], b["tokens"])
        if pos is not None:
            bad.append((s["id"], pos))
    rate = metrics.lossless_match_rate([s["tokens"] for s in spec], [b["tokens"] for b in base])
    if bad:
        pid, pos = bad[0]
        msg = (
            f"{name}: greedy speculative output differs from target-only output on {len(bad)} of "
            f"{len(spec)} prompts (first: prompt {pid!r} at new token {pos})"
        )
        if on_mismatch == "error":
            raise DraftsmithError(
                msg + "; set evaluate.on_mismatch=warn if the kernels are nondeterministic"
            )
        warnings.warn(msg, stacklevel=2)
        print(f"[evaluate] WARNING {msg}")
    return rate


def pick_best(rows: list[dict], metric: str) -> dict:
    """The row with the highest `metric` (missing values rank last; ties keep the earlier row)."""
    return max(rows, key=lambda r: -float("inf") if r.get(metric) is None else r[metric])


def sweep_entry(row: dict) -> dict:
    """One k-sweep point: k and the row's metrics (the leaderboard table's columns)."""
    return {"k": row["num_speculative_tokens"], **{key: row.get(key) for key in METRIC_KEYS}}


def recommend_k(sweep: list[dict]) -> int:
    """The k with the best measured speedup (the modelled one when nothing was timed)."""
    measured = [s for s in sweep if s.get("speedup") is not None]
    pool = measured or sweep
    key = "speedup" if measured else "modelled_speedup"
    return max(pool, key=lambda s: s.get(key) or 0.0)["k"]


def draft_path(draft: dict) -> str:
    """The directory a draft's weights are in (a registry name is pulled first)."""
    return str(Path(draft["ref"])) if Path(draft["ref"]).exists() else resolve_model(draft["ref"])
