"""The PNG plots of an evaluation (evaluate/report.py writes them beside the leaderboard).

Each takes leaderboard rows (evaluate/records.py) or k-sweep entries and writes one PNG
atomically; matplotlib is imported inside them, so a run that plots nothing never loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.evaluate.records import LeaderboardRow, is_fixed_k, sweep_label
from draftsmith.io import named_write_errors


def _save(fig, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.png")  # pid: clean_stale_temps
    try:
        with named_write_errors(path):
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def plot_training_curves(rows: list[LeaderboardRow], path: Path) -> Path | None:
    """Acceptance rate and mean accepted length against training step, overall and per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((r for r in rows if r.step is not None), key=lambda r: r.step)
    if not steps:
        return None
    cats = sorted({c for r in steps for c in r.per_category})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "acceptance_rate", "acceptance rate"),
        (axes[1], "mean_accepted_length", "mean accepted length (tokens / target forward)"),
    ):
        xs = [r.step for r in steps]
        ax.plot(xs, [getattr(r, key) for r in steps], "k-o", lw=2, label="all")
        for cat in cats:
            ys = [_category_value(r, cat, key) for r in steps]
            ax.plot(xs, ys, "--.", label=cat)
        ax.set_xlabel("training step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return path


def _category_value(row: LeaderboardRow, cat: str, key: str):
    """`key` of the row's summary for `cat`; None where the row has no such category."""
    m = row.per_category.get(cat)
    return None if m is None else getattr(m, key)


def plot_per_position(row: LeaderboardRow, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [v if v is not None else 0.0 for v in row.per_position_acceptance]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(values) + 1), values, color="tab:blue")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accept | reached)")
    ax.set_ylim(0, 1)
    ax.set_title(f"per-position acceptance: {row.checkpoint}")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_eval_sets(rows: list[LeaderboardRow], path: Path) -> Path | None:
    """Acceptance rate against training step, a line per eval set (`rows`: ranking rows,
    report.ranking_rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((r for r in rows if r.step is not None), key=lambda r: r.step)
    sets = list(dict.fromkeys(r.eval_set for r in steps))
    if not steps or len(sets) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name in sets:
        mine = [r for r in steps if r.eval_set == name]
        ax.plot([r.step for r in mine], [r.acceptance_rate for r in mine], "o-", label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("acceptance rate")
    ax.set_title("acceptance per eval set")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return path


def _errors(values: list, spreads: list) -> list[list[float]] | None:
    """matplotlib yerr (below, above) from [q25, q75] spreads; None when none has one. A
    pooled speedup can lie outside its per-prompt range: that side gets no bar."""
    if not any(spreads):
        return None
    lo = [max(0.0, v - q[0]) if v is not None and q else 0.0 for v, q in zip(values, spreads)]
    hi = [max(0.0, q[1] - v) if v is not None and q else 0.0 for v, q in zip(values, spreads)]
    return [lo, hi]


def plot_k_sweep(sweep: list[dict], path: Path) -> Path | None:
    """Measured and modelled speedup against k, each with its interquartile range: lines
    over the fixed-k points, the other settings (dynamic lookahead, second-choice leaves)
    as separate markers at their k, labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not sweep:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    fixed = [s for s in sweep if is_fixed_k(s)]
    ks = [s["k"] for s in fixed]
    for key, spread, style, label in (
        ("speedup", "speedup_iqr", "o-", "measured (wall clock)"),
        ("modelled_speedup_verify", "modelled_speedup_iqr", "s--", "modelled (timed c, v)"),
    ):
        ys = [s.get(key) for s in fixed]
        if any(y is not None for y in ys):
            yerr = _errors(ys, [s.get(spread) for s in fixed])
            ys = [float("nan") if y is None else y for y in ys]
            ax.errorbar(ks, ys, yerr=yerr, fmt=style, capsize=3, label=label)
    for s in sweep:
        if not is_fixed_k(s) and s.get("speedup") is not None:
            ax.plot([s["k"]], [s["speedup"]], marker="*", markersize=10, linestyle="none")
            ax.annotate(sweep_label(s), (s["k"], s["speedup"]), fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (speculative tokens)")
    ax.set_ylabel("speedup over target-only")
    ax.legend()
    _save(fig, path)
    plt.close(fig)
    return path
