"""lm-eval's reference runs for the side-by-side tests: several ``lm_eval`` command lines in one process.

``python -m lm_eval ARGS`` pays, before it evaluates anything, an interpreter with torch,
transformers and lm-eval imported (~5 s of CPU) and lm-eval's index of its ~15,000 stock tasks
(``TaskManager``: ~14 s of CPU, built anew by every process; lm-eval keeps no copy).  A test that
needs two command lines (two few-shot settings, two chat settings) paid that twice.

:func:`lm_eval_runs` runs the command lines one after another in one process
(``python tests/lmeval_reference.py`` reading them as JSON on stdin): each one is parsed and executed by lm-eval's own
CLI (``HarnessCLI``, as ``python -m lm_eval`` does, ``sys.argv`` set to it), writing its own
``--output_path``.  The one thing shared is lm-eval's task index of the same folders, built by
lm-eval once (``TaskIndex.build``, kept per list of folders): a pure function of the YAML files,
whose entries lm-eval copies before it builds a task from them.  The model is loaded by each
command line, as a separate process would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def lm_eval_runs(runs: list[list[str]], cwd: Path, env: dict[str, str], timeout: float = 1800) -> None:
    """``python -m lm_eval RUN`` for each of ``runs`` (argv lists without the program), in one
    process started in ``cwd`` with ``env``; fails the test with lm-eval's last words if one fails."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=json.dumps(runs),
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _index_built_once() -> None:
    """lm-eval's ``TaskIndex.build``, kept per (folders, resolve_includes) for this process."""
    from lm_eval.tasks import _index

    build = _index.TaskIndex.build
    built: dict[tuple[tuple[str, ...], bool], dict[str, Any]] = {}

    def build_once(paths: Any, *, resolve_includes: bool = True) -> dict[str, Any]:
        paths = list(paths)
        key = (tuple(str(p) for p in paths), resolve_includes)
        if key not in built:
            built[key] = build(paths, resolve_includes=resolve_includes)
        return dict(built[key])  # a fresh mapping; TaskFactory deep-copies an entry before using it

    _index.TaskIndex.build = staticmethod(build_once)


def main() -> int:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    runs = json.loads(sys.stdin.read())
    setup_logging()
    _index_built_once()
    for run in runs:
        sys.argv = ["lm_eval", *run]  # what HarnessCLI parses, as `python -m lm_eval RUN` has it
        try:
            parser = HarnessCLI()
            parser.execute(parser.parse_args())
        except BaseException:
            traceback.print_exc()
            print(f"lmeval_reference: this run failed: {run}", file=sys.stderr)
            return 1
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m lm_eval`, not this file's folder, leads sys.path
    sys.exit(main())
