"""What every task script does around its work: load the spec, report, exit with a code."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from orchestra.errors import TaskFailedError, UserError
from orchestra.tasks.spec import TaskSpec


def task_main(argv: list[str] | None, run: Callable[[TaskSpec], None]) -> int:
    """Run ``run(spec)`` for the spec file named in ``argv``; 0 done, 1 failed, 2 bad usage."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestra.tasks.<infer|eval> <task spec file>", file=sys.stderr)
        return 2
    try:
        spec = TaskSpec.load(args[0])
    except (OSError, ValueError, SyntaxError) as exc:
        print(f"{args[0]}: cannot read task spec: {exc}", file=sys.stderr)
        return 2
    try:
        run(spec)
    except (TaskFailedError, UserError) as exc:
        print(f"[{spec.task_id}] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        print(f"[{spec.task_id}] FAILED with an unexpected error (traceback above)", file=sys.stderr, flush=True)
        return 1
    print(f"[{spec.task_id}] done", flush=True)
    return 0
