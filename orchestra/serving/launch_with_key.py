"""Run a Python server module that takes its API key only as a flag, without the key in argv.

    python -m orchestra.serving.launch_with_key FLAG MODULE [ARGS...]

reads the key from the file named by ``ORCHESTRA_SERVER_KEY_FILE`` and runs ``MODULE`` in this
process with ``sys.argv = [MODULE, *ARGS, FLAG, key]``.  ``sys.argv`` is the interpreter's own
list: the kernel's copy (``/proc/PID/cmdline``, what ``ps`` shows other users) keeps the argv this
process was started with, which has no key.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m orchestra.serving.launch_with_key FLAG MODULE [ARGS...]")
    flag, module, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    path = os.environ.get("ORCHESTRA_SERVER_KEY_FILE", "")
    try:
        with open(path, encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError as exc:
        raise SystemExit(f"orchestra.serving.launch_with_key: cannot read the key file: {exc}") from None
    sys.argv = [module, *rest, flag, key]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
