"""Text from outside (endpoints, models, task logs, cluster tools) made safe to print on a terminal.

An error message or a model's answer may hold escape sequences that retitle the window, erase
lines or print a fake status (ESC, BEL, CSI, OSC, and their 8-bit C1 forms).  :func:`printable`
removes every C0/C1 control character but newline and tab, whole sequences first, so no
``[2K`` debris is left behind.  It is applied where orchestra prints (:func:`say`, the CLI's
error line, the progress lines); files (logs, the report) keep what was received.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erasing
    r"|\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: window title, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # other two-byte escapes (ESC c resets the terminal)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # 8-bit DCS, SOS, OSC, PM, APC
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all C0 but \t and \n, DEL, all C1


def printable(text: str) -> str:
    """``text`` without terminal control: escape sequences and C0/C1 characters (but ``\\n``,
    ``\\t``) removed."""
    if not _CONTROLS.search(text):  # the common case, fast: nothing to remove
        return text
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def say(*values: Any, file: Any = None, quiet: bool = False) -> None:
    """``print`` that survives a reader who left (``orchestra ... | head``): the run goes on and
    its exit code still says how it went.  What it prints may come from outside (an endpoint's
    error, a log's line): terminal control characters are removed (:func:`printable`)."""
    if quiet:
        return
    stream = file or sys.stdout
    try:
        print(*(printable(str(v)) for v in values), file=stream, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
