"""Who decides that a program passed, through the real command line under every isolation method.

A pass is vouched for by the driver with a per-run token that only the evaluator and the
driver know (``orchestra/evaluators/sandbox_driver.py``); a wrapper failure is told apart by
the start byte, not by what the program prints.  Each hostile program below passes or breaks
the task on the old rules (exit 0 and a public marker; a ``bwrap: ...`` line on stderr taken
for the wrapper's own error); here each is scored 0 and the task succeeds.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox.conftest import no_sandbox_process_left
from tests.tasks.test_eval_heavy import code_config, only_run, orchestra

OLD_MARKER = "__orchestra_tests_passed__"
ISOLATIONS = {
    "bwrap": "dict(type='code_exec', isolation='bwrap')",
    "unshare": "dict(type='code_exec', isolation='unshare')",
    "none": "dict(type='code_exec', isolation='none', allow_unisolated=True)",
}

FORGERIES = {
    "marker and os._exit(0)": f"""
        import os
        print({OLD_MARKER!r}, flush=True)
        os._exit(0)
    """,
    "read every open file descriptor": f"""
        import os
        found = []
        for fd in range(256):
            try:
                os.set_blocking(fd, False)
                found.append(os.read(fd, 65536))
            except OSError:
                pass
        print(b"".join(found).decode("latin-1"))
        print({OLD_MARKER!r}, flush=True)
        os._exit(0)
    """,
    "read its environment, argv, parent and files": f"""
        import os
        paths = ["/proc/self/environ", "/proc/self/cmdline", "/proc/%d/environ" % os.getppid(),
                 "/proc/%d/cmdline" % os.getppid(), *sorted(os.listdir("."))]
        for path in paths:
            try:
                with open(path, "rb") as f:
                    print(f.read().decode("latin-1"))
            except OSError:
                pass
        print({OLD_MARKER!r}, flush=True)
        os._exit(0)
    """,
    "print a thousand guessed tokens": f"""
        import os, secrets
        for _ in range(1000):
            print(secrets.token_hex(16))
        print({OLD_MARKER!r}, flush=True)
        os._exit(0)
    """,
    "patch sys.exit and leave with 0 after failing": f"""
        import atexit, os, sys
        sys.exit = lambda *args, **kwargs: None
        sys.excepthook = lambda *args: None
        atexit.register(lambda: (print({OLD_MARKER!r}, flush=True), os._exit(0)))
    """,
}

IMPERSONATIONS = {
    "bwrap": "bwrap: execvp /usr/bin/python3: No such file or directory",
    "setpriv": "setpriv: setresuid failed: Operation not permitted",
    "prlimit": "prlimit: failed to set the NPROC resource limit: Operation not permitted",
    "unshare": "unshare: unshare failed: Operation not permitted",
    "launcher": "sandbox setup failed [0123456789abcdef]: mount /tmp: Permission denied",
}


def rows(prefixes: list[str]) -> list[dict[str, Any]]:
    """Row 0 is right (its test expects what the model answers); in every other row the test
    expects something else, and the code before the answer is the hostile part."""
    out = []
    for i, prefix in enumerate(["", *prefixes]):
        expected = 1 if i == 0 else i + 2
        out.append({"question": f"What is {i} + 1?",
                    "tests": {"prompt": f"{prefix}answer = ", "entry_point": None,
                              "test": f"assert answer == {expected}\n"}})
    return out


def run_and_read(tmp_path: Path, isolation: str, prefixes: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    res = orchestra(code_config(tmp_path, rows(prefixes), evaluator=ISOLATIONS[isolation]))
    run = only_run(tmp_path)
    log = "\n".join(p.read_text() for p in (run / "logs/eval").glob("*.log"))
    assert res.returncode == 0, (res.stderr, log[-3000:])
    results = json.loads((run / "results/det/code.json").read_text())
    details = [json.loads(line) for line in (run / "results/det/code.details.jsonl").read_text().splitlines()]
    assert results["scorer"]["isolation"] == isolation
    no_sandbox_process_left()
    return results, details


@pytest.mark.parametrize("isolation", list(ISOLATIONS))
def test_a_program_cannot_forge_a_pass(isolation: str, tmp_path: Path) -> None:
    prefixes = [textwrap.dedent(code).lstrip("\n") for code in FORGERIES.values()]
    results, details = run_and_read(tmp_path, isolation, prefixes)
    outcome = {name: (d["passed"], d["status"]) for name, d in zip(["right", *FORGERIES], details)}
    assert outcome == {"right": (True, "ok"), **{name: (False, "left_early") for name in FORGERIES}}
    assert results["metrics"] == {"pass@1": 1 / (1 + len(FORGERIES))}


@pytest.mark.parametrize("isolation", list(ISOLATIONS))
def test_a_program_that_prints_like_the_wrapper_scores_zero_and_the_task_succeeds(isolation: str,
                                                                                  tmp_path: Path) -> None:
    prefixes = [f"import sys\nsys.stderr.write({line + chr(10)!r})\nsys.exit(1)\n" for line in IMPERSONATIONS.values()]
    results, details = run_and_read(tmp_path, isolation, prefixes)
    assert [(d["passed"], d["status"]) for d in details] == [(True, "ok")] + [(False, "failed")] * len(IMPERSONATIONS)
    assert [d["stderr"].strip() for d in details[1:]] == list(IMPERSONATIONS.values())
    assert results["metrics"] == {"pass@1": 1 / (1 + len(IMPERSONATIONS))}
