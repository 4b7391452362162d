"""lm-eval's reference runs for the side-by-side tests: several ``lm_eval`` command lines in one process.

``python -m lm_eval ARGS`` pays, before it evaluates anything, an interpreter with torch,
transformers and lm-eval imported (~5 s of CPU) and lm-eval's index of its ~15,000 stock tasks
(``TaskManager``: ~14 s of CPU, built anew by every process; lm-eval keeps no copy).  A test that
needs two command lines (two few-shot settings, two chat settings) paid that twice.

:func:`lm_eval_runs` runs the command lines one after another in one process
(``python tests/lmeval_reference.py`` reading them as JSON on stdin): each one is parsed and executed by lm-eval's own
CLI (``HarnessCLI``, as ``python -m lm_eval`` does, ``sys.argv`` set to it), writing its own
``--output_path``.  The one thing shared is lm-eval's task index, built by lm-eval's own
``TaskIndex.build`` one folder at a time and kept per folder: a pure function of the YAML files,
whose entries lm-eval copies before it builds a task from them.  The model is loaded by each
command line, as a separate process would.

The index of lm-eval's stock folder (~14,700 entries, ~6 s of CPU) is also kept on disk for the
whole test session when the caller names a folder for it (the ``lmeval_stock_index`` fixture):
built under a file lock by the first reference process of the session, read (~0.7 s) by the
others.  Its key is lm-eval's version and the stock folder's path; the include folders, a test's
own, are built by each process.  lm-eval merges the folders' indexes later-wins, as
:func:`_index_built_once` does (without lm-eval's log line for each task a folder overrides).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


_STOCK_INDEX = "ORCHESTRA_TEST_LMEVAL_STOCK_INDEX"  # the session's folder for the stock index, to the process


def lm_eval_runs(runs: list[list[str]], cwd: Path, env: dict[str, str], stock_index: Path | None = None,
                 timeout: float = 1800) -> None:
    """``python -m lm_eval RUN`` for each of ``runs`` (argv lists without the program), in one
    process started in ``cwd`` with ``env``; fails the test with lm-eval's last words if one fails.
    ``stock_index``: the session's folder that keeps lm-eval's stock index (``lmeval_stock_index``)."""
    env = {**env, _STOCK_INDEX: str(stock_index)} if stock_index else env
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=json.dumps(runs),
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _stock_index(build: Any, root: Path, resolve_includes: bool, folder: Path) -> dict[str, Any]:
    """lm-eval's index of its stock folder ``root``, from ``folder`` when this session already
    built it, else built now and left there (a pickle written whole, under a lock: one build for
    all the session's workers)."""
    import lm_eval

    key = f"{lm_eval.__version__}|{root}|{resolve_includes}"
    path = folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.pickle"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            with open(path, "rb") as f:
                return pickle.load(f)  # a folder of this session's own test run (pytest's basetemp, 0700)
        index = build([root], resolve_includes=resolve_includes)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        return index


def _index_built_once() -> None:
    """lm-eval's ``TaskIndex.build``, kept per (folder, resolve_includes) for this process and the
    stock folder's for the session; a list of folders merged as lm-eval merges them (a later
    folder's entry replaces an earlier one of the same name)."""
    import lm_eval.tasks
    from lm_eval.tasks import _index

    build = _index.TaskIndex.build
    stock = Path(lm_eval.tasks.__file__).parent
    session_folder = os.environ.get(_STOCK_INDEX)
    built: dict[tuple[str, bool], dict[str, Any]] = {}

    def one_folder(root: Path, resolve_includes: bool) -> dict[str, Any]:
        key = (str(root), resolve_includes)
        if key not in built:
            if session_folder and Path(root) == stock:
                built[key] = _stock_index(build, stock, resolve_includes, Path(session_folder))
            else:
                built[key] = build([root], resolve_includes=resolve_includes)
        return built[key]

    def build_once(paths: Any, *, resolve_includes: bool = True) -> dict[str, Any]:
        index: dict[str, Any] = {}  # a fresh mapping; TaskFactory deep-copies an entry before using it
        for root in paths:
            index.update(one_folder(root, resolve_includes))
        return index

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
