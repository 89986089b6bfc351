"""The vLLM floor: an older vLLM is one clear line naming both versions; a new enough one loads."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.vllm_compat import MIN_VLLM, MIN_VLLM_TEXT, import_vllm, vllm_release

REPO = Path(__file__).resolve().parents[1]


def fake_vllm(monkeypatch, version: str) -> ModuleType:
    module = ModuleType("vllm")
    module.__version__ = version
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@pytest.mark.parametrize("version", ["0.10.2", "0.14.1", "0.8.5"])
def test_an_older_vllm_is_one_line_naming_both_versions(monkeypatch, version):
    fake_vllm(monkeypatch, version)
    with pytest.raises(DraftsmithError) as info:
        import_vllm("evaluate.backend")
    msg = str(info.value)
    assert msg.startswith("evaluate.backend: 'vllm' needs vLLM >= 0.15.0 ")
    assert f"installed: {version} " in msg and "\n" not in msg


@pytest.mark.parametrize("version", ["0.15.0", "0.15.1", "0.16.0", "1.0.0", "0.15.0rc1.dev7+gabc"])
def test_a_new_enough_vllm_is_returned(monkeypatch, version):
    module = fake_vllm(monkeypatch, version)
    assert import_vllm("data.backend") is module


def test_an_unreadable_version_is_refused(monkeypatch):
    fake_vllm(monkeypatch, "not-a-version")
    with pytest.raises(DraftsmithError, match=r"data.backend: .* installed: not-a-version"):
        import_vllm("data.backend")


def test_release_parsing():
    assert vllm_release("0.15.0") == (0, 15, 0)
    assert vllm_release("0.14.1.dev123+g0abc") == (0, 14, 1)
    assert vllm_release("0.15.0rc1") == (0, 15, 0)
    assert vllm_release("garbage") is None


def test_the_extra_pins_the_same_floor():
    (floor,) = re.findall(
        r'^vllm = \["vllm>=([0-9.]+)"\]', (REPO / "pyproject.toml").read_text(), re.M
    )
    assert floor == MIN_VLLM_TEXT
    assert MIN_VLLM == (0, 15, 0)
