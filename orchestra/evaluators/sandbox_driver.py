"""Runs ``main.py`` (a solution, then its tests) in a sandbox and vouches that it ran to its end.

``CodeExecEvaluator`` starts ``python orchestra_driver.py`` in the sandbox with this file's
text and the program; the only thing on the standard input is the *verdict token* of this
run, a random value that exists nowhere else but in the evaluator's memory (not in a file,
an argument or a variable of the sandbox).  Before a line of ``main.py`` runs, the driver
reads the token to the end of the input and puts ``/dev/null`` in the input's place, so the
program cannot read it again.  It prints the token only when ``main.py`` ran to its end
without an exception: a program that prints a marker and calls ``os._exit(0)``, or
``sys.exit(0)`` before its tests, or that patches ``sys.exit``, never shows the token.

Limit (``docs/scoring.md``): the program shares this interpreter, so code written against
this driver can still find the token in its memory (the closure of ``vouch``, through the
stack or the garbage collector) - as it can make assert-style tests pass with an object that
equals everything.  What it cannot do is pass by leaving early or by printing something.

Run by the sandbox's system interpreter: standard library only, no syntax newer than 3.8.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable

PROGRAM = "main.py"


def _take_token() -> Callable[[], None]:
    """Read the token, close the way to it, and return the function that prints it."""
    chunks = []
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    token = b"".join(chunks).strip()
    out = os.dup(1)  # the verdict goes to the real stdout, whatever the program does to sys.stdout

    def vouch() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001, S110 - a stream the program closed or replaced
                pass
        os.write(out, b"\n" + token + b"\n")

    return vouch


def main() -> None:
    vouch = _take_token()
    with open(PROGRAM, encoding="utf-8") as f:
        code = compile(f.read(), PROGRAM, "exec")
    module = types.ModuleType("__main__")
    module.__file__ = os.path.abspath(PROGRAM)
    sys.modules["__main__"] = module
    sys.argv = [PROGRAM]
    exec(code, module.__dict__)  # noqa: S102 - running the program is the point
    # Reached only when the program and its tests ran to the end without an exception.
    vouch()
    os._exit(0)


if __name__ == "__main__":
    main()
