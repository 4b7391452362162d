"""An API key out of text an endpoint sent back, in the forms an HTTP stack echoes it.

A hostile (or merely chatty) endpoint may quote the key it was sent in an error message or an
answer, and what it quotes goes to task logs, predictions, results, events and the report.  It
rarely quotes it verbatim: a query string percent-encodes it (``%2B``, ``%2f``), a JSON body
escapes it (``\\/``, ``\\u0041``, and a ``repr`` of that body doubles the backslashes), a
``Basic`` header base64-encodes ``user:key``, and a wrapped message or base64 block splits it
across lines.  :func:`scrub_key` replaces each of these with ``***``, also a key cut short at the
end of the text (an excerpt of a body cut at a fixed length).  It does not try every
transformation (a reversed or double-encoded key passes): those of an HTTP stack.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import urllib.parse

#: the shortest key whose encoded, split and cut-short forms are looked for: shorter ones are
#: placeholders of local servers (``EMPTY``, ``1``), whose base64 or prefix would match ordinary text
ENCODED_MIN = 12
#: the shortest start of a key scrubbed where the text ends with it (an excerpt cut in the key)
CUT_MIN = 8
#: what may stand between two characters of a split key: white space, or an escaped line break
_SEP = r"(?:\s|\\{1,2}[rnt])*"
#: the start of an escape cut short with the text (``\u00``, ``%2``) after a cut-short key
_PARTIAL = r"(?:\\{1,2}(?:u[0-9a-fA-F]{0,3})?|%[0-9a-fA-F]?)?"


def _char(c: str) -> str:
    """A pattern for one character of the key as an echo may write it: itself, percent-encoded
    (either case), JSON-escaped (``\\u00XX``, once or twice escaped), ``+`` for a space, ``\\/``."""
    alts = [re.escape(c)]
    alts.append("(?i:" + "".join(f"%{b:02x}" for b in c.encode("utf-8")) + ")")
    if len(c.encode("utf-16-be")) == 2:
        alts.append(r"(?i:\\{1,2}u" + f"{ord(c):04x})")
    if c == " ":
        alts.append(r"\+")
    if c in "/\\\"'":
        alts.append(r"\\{1,2}" + re.escape(c))
    return "(?:" + "|".join(alts) + ")"


def _base64_cores(key: str) -> list[str]:
    """The parts of the base64 of any text holding ``key`` that depend on the key alone: for each
    of the three alignments of the key in the encoded bytes (``user:key``, ``:key``, ``key``), the
    whole 4-character groups of its bytes, in the standard and the URL-safe alphabets."""
    raw = key.encode("utf-8")
    cores = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode("ascii")
        first = 4 if shift else 0  # the group holding the bytes before the key
        last = (shift + len(raw)) // 3 * 4  # the groups holding only whole bytes (no padding, no suffix)
        core = encoded[first:last]
        if len(core) >= 8:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return sorted(cores, key=len, reverse=True)


@functools.lru_cache(maxsize=8)
def _patterns(key: str) -> tuple[list[re.Pattern[str]], re.Pattern[str], int]:
    """The forms :func:`scrub_key` removes anywhere (the key; its base64 forms, each a pattern of its
    own that starts with a plain character, which the search finds fast); the key's start where
    the text ends (a closing quote of a repr may follow); and how far from the end that one is
    looked for (every character escaped, with a separator after it)."""
    chars = [_char(c) for c in key]
    forms = [_SEP.join(chars)] + [_SEP.join(re.escape(c) for c in core) for core in _base64_cores(key)]
    cut = ""
    for part in reversed(chars[CUT_MIN:-1]):
        cut = f"(?:{_SEP}{part}{cut})?"
    at_end = _SEP.join(chars[:CUT_MIN]) + cut + _PARTIAL + r"(?=['\"]?\Z)"
    return [re.compile(form) for form in forms], re.compile(at_end), 16 * len(key) + 16


def scrub_key(text: str, key: str) -> str:
    """``text`` with ``key`` replaced by ``***``, also where an echo escaped or encoded it (see the
    module docstring); a key shorter than :data:`ENCODED_MIN` only as it is and JSON- or URL-escaped."""
    if not key:
        return text
    if len(key) >= ENCODED_MIN:
        anywhere, at_end, reach = _patterns(key)
        for pattern in anywhere:
            text = pattern.sub("***", text)
        cut = at_end.search(text, max(0, len(text) - reach))  # only the tail: a long answer costs no more
        return text[: cut.start()] + "***" + text[cut.end():] if cut else text
    forms = {key, json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=True)[1:-1].replace("/", "\\/"),
             urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key), urllib.parse.quote(key)}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "***")
        if form != form.lower():  # percent-escapes may come back in lower case
            text = text.replace(form.lower() if "%" in form else form, "***")
    return text
