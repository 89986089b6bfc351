"""Leaderboard files, the printed table, PNG plots and the W&B log of an evaluation."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from draftsmith.config import Config
from draftsmith.io import atomic_write_json, atomic_write_text

# The figures that describe one draft at one k, with their table titles and formats: the
# one list behind the printed table, the CSV and every k-sweep entry.
METRIC_COLUMNS = (
    ("acceptance_rate", "accept", "{:.3f}"),
    ("alpha", "alpha", "{:.3f}"),
    ("mean_accepted_length", "tok/fwd", "{:.2f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("modelled_speedup", "modelled", "{:.2f}x"),
    ("modelled_speedup_verify", "modelled(v)", "{:.2f}x"),
    ("draft_cost_ratio", "c", "{:.3f}"),
    ("verify_cost_ratio", "v", "{:.2f}"),
    ("lossless_match_rate", "lossless", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
)
METRIC_KEYS = tuple(key for key, _, _ in METRIC_COLUMNS)
TABLE_COLUMNS = (
    ("checkpoint", "checkpoint", "{}"),
    ("kind", "kind", "{}"),
    ("step", "step", "{}"),
    *METRIC_COLUMNS,
)
CSV_FIELDS = (
    "checkpoint",
    "kind",
    "step",
    *METRIC_KEYS,
    "num_speculative_tokens",
    "temperature",
    "target_tokens_per_s",
    "num_prompts",
    "tokens_proposed",
    "tokens_accepted",
    "target_forwards",
    "per_position_acceptance",
    "path",
)


def _cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ";".join("" if v is None else f"{v:.4f}" for v in value)
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def leaderboard_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS)
    for row in rows:
        writer.writerow(["" if row.get(f) is None else _cell(row[f], "{}") for f in CSV_FIELDS])
    return buf.getvalue()


def format_table(board: dict) -> str:
    """A plain-text leaderboard, best row marked with '*'."""
    header = [title for _, title, _ in TABLE_COLUMNS]
    body = []
    for row in board["rows"]:
        cells = [_cell(row.get(key), fmt) for key, _, fmt in TABLE_COLUMNS]
        if row["checkpoint"] == board["best"]:
            cells[0] = "*" + cells[0]
        body.append(cells)
    widths = [max(len(c) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    sweep = ", ".join(
        f"k={s['k']}: {_cell(s.get('speedup'), '{:.2f}x')} (modelled {_cell(s.get('modelled_speedup'), '{:.2f}x')})"
        for s in board.get("k_sweep", [])
    )
    lines.append(
        f"best: {board['best']} by {board['select_metric']}; k sweep: {sweep}; "
        f"recommended k = {board['recommended_k']}"
    )
    lines += [format_comparison(c) for c in board.get("comparisons", [])]
    return "\n".join(lines)


def format_comparison(c: dict) -> str:
    """One line: the acceptance difference, its paired-bootstrap interval, and the verdict."""
    lo, hi = c["ci95"]
    if lo > 0:
        verdict = "better"
    elif hi < 0:
        verdict = "worse"
    else:
        verdict = "not distinguishable on these prompts"
    return (
        f"{c['draft']} vs {c['against']}: acceptance {c['diff']:+.3f} (95% CI {lo:+.3f} to "
        f"{hi:+.3f}, paired bootstrap over {c['num_prompts']} prompts): {verdict}"
    )


# ----------------------------------------------------------------------------- plots


def _save(fig, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp-plot.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    tmp.replace(path)


def plot_training_curves(rows: list[dict], path: Path) -> Path | None:
    """Acceptance rate and mean accepted length against training step, overall and per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((r for r in rows if r.get("step") is not None), key=lambda r: r["step"])
    if not steps:
        return None
    cats = sorted({c for r in steps for c in r.get("per_category", {})})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "acceptance_rate", "acceptance rate"),
        (axes[1], "mean_accepted_length", "mean accepted length (tokens / target forward)"),
    ):
        xs = [r["step"] for r in steps]
        ax.plot(xs, [r.get(key) for r in steps], "k-o", lw=2, label="all")
        for cat in cats:
            ys = [r.get("per_category", {}).get(cat, {}).get(key) for r in steps]
            ax.plot(xs, ys, "--.", label=cat)
        ax.set_xlabel("training step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return path


def plot_per_position(row: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [v if v is not None else 0.0 for v in row.get("per_position_acceptance", [])]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(values) + 1), values, color="tab:blue")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accept | reached)")
    ax.set_ylim(0, 1)
    ax.set_title(f"per-position acceptance: {row['checkpoint']}")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_k_sweep(sweep: list[dict], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not sweep:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ks = [s["k"] for s in sweep]
    ax.plot(ks, [s.get("speedup") for s in sweep], "o-", label="measured")
    ax.plot(ks, [s.get("modelled_speedup") for s in sweep], "s--", label="modelled")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (speculative tokens)")
    ax.set_ylabel("speedup over target-only")
    ax.legend()
    _save(fig, path)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- W&B


def log_wandb(cfg: Config, board: dict, images: list[Path]) -> None:
    from draftsmith.tracking import wandb_run

    with wandb_run(cfg, "evaluate") as run:
        if run is None:
            return
        import wandb

        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        for row in board["rows"]:
            if row.get("step") is None:
                continue
            logged = {
                f"eval/{k}": row[k]
                for k in ("acceptance_rate", "mean_accepted_length", "speedup", "draft_cost_ratio")
                if row.get(k) is not None
            }
            run.log({"eval/step": row["step"], **logged})
        table = wandb.Table(columns=list(CSV_FIELDS))
        for row in board["rows"]:
            table.add_data(
                *[
                    json.dumps(row.get(f)) if isinstance(row.get(f), list) else row.get(f)
                    for f in CSV_FIELDS
                ]
            )
        sweep = wandb.Table(columns=["k", "speedup", "modelled_speedup", "acceptance_rate"])
        for s in board["k_sweep"]:
            sweep.add_data(
                s["k"], s.get("speedup"), s.get("modelled_speedup"), s.get("acceptance_rate")
            )
        run.log(
            {
                "leaderboard": table,
                "k_sweep": sweep,
                **{f"plots/{p.stem}": wandb.Image(str(p)) for p in images},
            }
        )
        run.summary.update({"best": board["best"], "recommended_k": board["recommended_k"]})


def write_reports(cfg: Config, board: dict, eval_dir: Path) -> None:
    eval_dir = Path(eval_dir)
    atomic_write_json(eval_dir / "leaderboard.json", board)
    atomic_write_text(eval_dir / "leaderboard.csv", leaderboard_csv(board["rows"]))
    best = next(r for r in board["rows"] if r["checkpoint"] == board["best"])
    images = [
        plot_training_curves(board["rows"], eval_dir / "acceptance_vs_step.png"),
        plot_per_position(best, eval_dir / "per_position_best.png"),
        plot_k_sweep(board["k_sweep"], eval_dir / "k_sweep.png"),
    ]
    print(format_table(board))
    print(f"[evaluate] wrote {eval_dir / 'leaderboard.json'}")
    log_wandb(cfg, board, [p for p in images if p is not None])
