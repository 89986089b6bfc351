"""scripts/budget_curve.py charges a run's data cost only for the stored text it read."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.distill.teacher import is_on_policy_step

SCRIPT = Path(__file__).parents[1] / "scripts" / "budget_curve.py"


@pytest.fixture(scope="module")
def budget_curve():
    spec = importlib.util.spec_from_file_location("budget_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cfg(fraction: float, seed: int = 0):
    return SimpleNamespace(
        run=SimpleNamespace(seed=seed), distill=SimpleNamespace(on_policy_fraction=fraction)
    )


def test_offline_share_ends(budget_curve):
    assert budget_curve.offline_share(_cfg(0.0), 120) == 1.0  # every step read stored text
    assert budget_curve.offline_share(_cfg(1.0), 120) == 0.0  # the draft wrote every batch
    assert budget_curve.offline_share(_cfg(0.5), 0) == 1.0  # the init read nothing; no 0/0


def test_offline_share_counts_the_steps_training_took(budget_curve):
    cfg = _cfg(0.5, seed=3)
    offline = [not is_on_policy_step(3, s, 0.5) for s in range(120)]
    assert 0 < sum(offline) < 120  # a real mix, so the share below is not an end case
    assert budget_curve.offline_share(cfg, 120) == pytest.approx(sum(offline) / 120)
    # steps 0..9 only: a checkpoint is charged for the steps before it, not the run's
    assert budget_curve.offline_share(cfg, 10) == pytest.approx(sum(offline[:10]) / 10)


def test_log_fit_recovers_a_line_in_log2_tokens_and_ignores_early_points(budget_curve):
    pts = [{"tokens_seen": t, "alpha": 0.1 + 0.04 * math.log2(t / 1000)} for t in (2e3, 8e3, 64e3)]
    pts.append({"tokens_seen": 100, "alpha": 0.9})  # < 64k / 32: a warm-up point, left out
    pts.append({"tokens_seen": 0, "alpha": 0.05})  # the untrained init: no log
    a, b = budget_curve.log_fit(pts)
    assert b == pytest.approx(0.04)
    assert a + b * math.log2(16e3) == pytest.approx(0.1 + 0.04 * 4)
    assert budget_curve.log_fit(pts[:2]) is None  # two points make no fit worth printing
