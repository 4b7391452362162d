"""The stages of one run: infer then eval (or eval alongside infer), under one stop flag.

:func:`run_stages` is what ``orchestra.run`` does between planning and the summary: it hands
each stage's tasks to that stage's runner, starts the eval stage beside the infer stage when
``eval=dict(overlap=True)`` (the default; :class:`EvalAlongside`), and turns SIGINT, SIGTERM and
SIGHUP into the run's stop flag (:class:`StopOnSignals`), so that every runner stops what it
started within seconds.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

from orchestra.errors import Stopped
from orchestra.runners.base import BaseRunner, RunContext, TaskResult
from orchestra.runners.core.run import Shared
from orchestra.summary.progress import StageProgress, api_model_abbrs
from orchestra.terminal import say


class StopOnSignals:
    """While active (``with``), SIGINT, SIGTERM and SIGHUP set ``stop`` and are remembered in
    ``received``; the previous handlers come back on exit.  Outside the main thread (signals reach
    that thread only) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stop.is_set():
            self.received.append(signum)
            say(f"\norchestra: {signal.Signals(signum).name} received, stopping every task...", file=sys.stderr)
        # Not stop.set() here: the handler runs in the main thread between two bytecodes,
        # possibly while that thread holds the Event's own lock (inside stop.wait()), and
        # set() would then wait for that lock forever.  A thread sets it once the handler returns.
        threading.Thread(target=self.stop.set, name="orchestra-stop", daemon=True).start()

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def hangup(self) -> bool:
        """The run was stopped by a SIGHUP (its exit code is then 129, not 130)."""
        return bool(self.received) and self.received[0] == signal.SIGHUP


class _LineStream:
    """A stream that says it is no terminal, so a progress display writes lines to it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        return int(self.stream.write(text) or 0)

    def flush(self) -> None:
        self.stream.flush()


class EvalAlongside:
    """The eval stage run beside the infer stage (``eval=dict(overlap=True)``, the default): each
    eval task starts as soon as its predictions are done, in a thread of its own with its own
    runner; it shares the run's stop flag, so Ctrl-C stops both.  It queues its tasks once the
    infer stage's first round has started its tasks (``begun``): at 100,000 tasks a queue built
    beside the infer stage's own would hold back the run's first task by seconds."""

    def __init__(self, runner: Any, tasks: list[Any], ctx: RunContext, quiet: bool) -> None:
        self.upstream = threading.Event()
        self.upstream.set()
        self.begun = threading.Event()  # set by the infer stage's launch (RunContext.begun), or at its end
        self.queued = threading.Event()  # set by this stage's launch once its tasks are queued (or at its end)
        self.progress: StageProgress | None = None
        self.ctx = RunContext(ctx.paths, ctx.events, stop=ctx.stop, upstream=self.upstream, host=ctx.host,
                              shared=ctx.shared, begun=self.queued)
        self.runner, self.tasks, self.quiet = runner, tasks, quiet
        self.results: list[TaskResult] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="orchestra-eval", daemon=True)

    def _run(self) -> None:
        try:
            self.begun.wait()
            if not self.quiet:  # progress as lines, never a second bar: the infer stage's bar owns the terminal
                lines: Any = _LineStream(sys.stderr)
                self.progress = StageProgress("eval", self.tasks, self.ctx.paths.events, stream=lines)
                self.ctx.on_change = self.progress
            self.results = self.runner.launch(self.tasks, self.ctx)
        except BaseException as exc:  # re-raised in the main thread by join()
            self.error = exc
            self.ctx.stop.set()  # a broken stage stops the run, as it would without overlap
        finally:
            if self.progress is not None:
                self.progress.close()

    def start(self) -> None:
        say(f"[eval] {len(self.tasks)} task(s), each starting as soon as its predictions are done",
            file=sys.stderr, quiet=self.quiet)
        self.thread.start()

    def join(self) -> list[TaskResult]:
        """Wait for the eval stage: inference is over, so tasks still missing predictions are skipped."""
        self.begun.set()  # the infer stage may not have got to say so (it raised, or the run stopped first)
        # its tasks are queued as they would be beside inference (a stop cancels them, as it would have)
        while not self.queued.wait(0.2) and self.thread.is_alive():
            pass  # short waits: Ctrl-C still reaches the main thread's handler
        self.upstream.clear()
        while self.thread.is_alive():
            self.thread.join(0.2)  # short waits: Ctrl-C still reaches the main thread's handler
        if self.error is not None:
            raise self.error
        return self.results


def run_stages(cfg: Any, runners: dict[str, BaseRunner], made: Any, ctx: RunContext, stages: list[str], debug: bool,
               quiet: bool) -> list[TaskResult]:
    """Launch ``stages`` (of ``infer``, ``eval``) of the plan ``made`` in order, the eval stage beside
    the infer stage where the config lets it; stops early once ``ctx.stop`` is set.  Returns the
    result of every task that was launched."""
    results: list[TaskResult] = []
    # warm workers outlive the infer stage when the eval stage has them too: it scores in those the infer
    # stage warmed (otherwise they go at the infer stage's end, their memory with them)
    made_shared = ctx.shared is None and "eval" in stages and all(
        s in runners and runners[s].shares_warm_workers for s in ("infer", "eval"))
    if made_shared:
        ctx.shared = Shared()
    overlap = (stages == ["infer", "eval"] and cfg.stages["eval"].overlap and not debug
               and made.tasks["infer"] and made.tasks["eval"])
    eval_side = EvalAlongside(runners["eval"], made.tasks["eval"], ctx, quiet) if overlap else None
    try:
        if eval_side is not None:
            ctx.begun = eval_side.begun
            eval_side.start()
            stages = ["infer"]
        for stage in stages:
            if ctx.stop.is_set():
                break
            tasks = made.tasks[stage]
            if not tasks:  # all reused; jobs a killed orchestrator left of it are still sorted out
                runners[stage].settle_left(ctx, stage)
                continue
            say(f"[{stage}] {len(tasks)} task(s), {len(made.reused[stage])} output(s) reused", file=sys.stderr,
                quiet=quiet)
            progress = None if debug or quiet else StageProgress(
                stage, tasks, ctx.paths.events, api_model_abbrs(cfg.models), len(runners[stage].gpus or ()))
            ctx.on_change = progress
            try:
                results += runners[stage].launch(tasks, ctx)
            except Stopped:  # a signal while the runner connected to its cluster: none of its tasks ran
                break
            finally:
                if progress is not None:
                    progress.close()
    finally:
        ctx.begun = None
        try:
            if eval_side is not None:
                try:
                    results += eval_side.join()
                except Stopped:
                    pass  # as above, for the eval stage's runner
        finally:
            if made_shared:
                assert ctx.shared is not None
                ctx.shared.close()
                ctx.shared = None
    return results
