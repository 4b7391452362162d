"""Whether a local model's tokenizer has a chat template, found without importing an ML framework.

The config check asks it (``apply_chat_template=True`` on a model without a template is one
line at config time, as ``lm_eval`` refuses it), so it reads files only: a checkpoint folder's
``tokenizer_config.json`` / ``chat_template.jinja`` / ``chat_template.json``, or a GGUF file's
``tokenizer.chat_template`` metadata (the header is walked with ``struct``; the tensors are
never read).  A hub id cannot be looked at here: the task finds out when it loads the tokenizer.
"""

from __future__ import annotations

import json
import mmap
import os
import struct

from orchestra.models.hf_common import GGUF_MAGIC, ModelSource

#: GGUF metadata value types: fixed sizes by type id; 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
TEMPLATE_KEY = "tokenizer.chat_template"


class _Header:
    """A cursor over a GGUF file's metadata (little-endian, version 2 or 3)."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise ValueError("the metadata runs past the end of the file") from None
        self.pos += struct.calcsize(fmt)
        return int(value)

    def string(self) -> bytes:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise ValueError("a string runs past the end of the file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(out)

    def skip(self, kind: int) -> None:
        if kind in _FIXED:
            self.pos += _FIXED[kind]
        elif kind == _STRING:
            n = self.take("<Q")  # read before adding: take() moves pos
            self.pos += n
        elif kind == _ARRAY:
            inner, count = self.take("<I"), self.take("<Q")
            if inner in _FIXED:
                self.pos += _FIXED[inner] * count
            else:
                for _ in range(count):
                    self.skip(inner)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")
        if self.pos > len(self.data):
            raise ValueError("a value runs past the end of the file")


def gguf_chat_template(path: str) -> str | None:
    """The chat template in a GGUF file's metadata, or None; ``ValueError`` for a file that is
    not a readable GGUF."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        head = _Header(data)
        head.pos = 4
        if head.take("<I") not in (2, 3):
            raise ValueError(f"{path}: GGUF version not 2 or 3")
        head.take("<Q")  # tensors
        for _ in range(head.take("<Q")):
            key = head.string()
            kind = head.take("<I")
            if key == TEMPLATE_KEY.encode() and kind == _STRING:
                return head.string().decode("utf-8", errors="replace") or None
            head.skip(kind)
    return None


def folder_has_chat_template(folder: str) -> bool:
    """Whether a tokenizer folder holds a chat template (in any of the places transformers reads)."""
    if any(os.path.isfile(os.path.join(folder, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    if os.path.isdir(os.path.join(folder, "additional_chat_templates")):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as fh:
            return bool(json.load(fh).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def template_problem(source: ModelSource, tokenizer_path: str | None = None) -> str | None:
    """Why this tokenizer has no chat template (in words), or None: it has one, or it cannot
    be known before the task loads it (a hub id)."""
    if tokenizer_path:
        local = os.path.expanduser(tokenizer_path)
        if not os.path.isdir(local) or folder_has_chat_template(local):
            return None
        return f"its tokenizer folder {tokenizer_path} has no chat template"
    if source.kind == "folder":
        return None if folder_has_chat_template(source.location) else \
            f"its tokenizer ({source.location}) has no chat template"
    if source.kind == "gguf":
        try:
            found = gguf_chat_template(source.location)
        except (OSError, ValueError) as exc:
            return f"its GGUF metadata cannot be read for a chat template ({exc})"
        return None if found else f"its GGUF file {source.location} has no {TEMPLATE_KEY}"
    return None


def endpoint_problem(endpoint: str, scoring: bool) -> str | None:
    """An OpenAI-compatible endpoint's answer: ``chat`` takes the messages (the server applies
    the model's template) but returns no log-probabilities of a conversation's continuations;
    ``completions`` takes plain text, with no template to render them."""
    if endpoint != "chat":
        return (f"endpoint={endpoint!r} sends plain text, with no chat template to render the messages; "
                "use endpoint='chat'")
    if scoring:
        return ("a chat endpoint returns no log-probabilities of a conversation's continuations; score them with "
                "HFCausalLM or VLLMModel")
    return None
