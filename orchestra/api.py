"""The Python API: ``orchestra.run(...)`` and ``orchestra.plan(...)``, for scripts and notebooks.

The CLI is a thin wrapper on these two functions, so a run started from Python has the same
run folder, the same resume (``reuse=``), the same checks (a bad config raises
:class:`~orchestra.errors.ConfigError` before anything runs) and the same clean-up on Ctrl-C
as ``python run.py CONFIG``::

    import orchestra
    run = orchestra.run("configs/eval_demo.py", work_dir="outputs/nb", **{"infer.runner.max_num_workers": 2})
    run.ok, run.run_dir, run.failed          # how it went
    run.rows()                               # [{'model': ..., 'dataset': ..., 'metric': ..., 'value': ...}]
    run.to_pandas()                          # the same as a DataFrame (needs pandas)

``config`` is a path (``.py``, ``.yaml``, ``.json``) or a dict shaped like a config file (with
classes or dotted names as ``type``).  Keyword arguments whose name holds a dot
(``**{"models.0.batch_size": 4}``) override config values like ``--cfg-options``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestra.errors import ConfigError, RunFolderBusyError, UserError
from orchestra.terminal import say

if TYPE_CHECKING:  # the runners are imported when a run needs them (a quick start)
    from orchestra.runners.base import BaseRunner

__all__ = ["EXIT_FAILED", "EXIT_HANGUP", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "MODES", "PlanView", "Run",
           "plan", "run", "say", "viz"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_HANGUP = 0, 1, 2, 130, 129
MODES = ("all", "infer", "eval", "viz")


@dataclass
class Run:
    """The outcome of :func:`run`: where it ran, how it went, and its results."""

    run_dir: str
    exit_code: int
    results: list[Any] = field(default_factory=list)  # TaskResult of every task that was launched
    summary: Any = None  # orchestra.summary.table.Summary
    pivot: Any = None  # orchestra.summary.pivot.Pivot, for a sweep
    report: str | None = None  # summary/report.html, once written

    @property
    def status(self) -> str:
        """``done``, ``failed`` or ``interrupted``."""
        if self.exit_code in (EXIT_INTERRUPTED, EXIT_HANGUP):
            return "interrupted"
        return "done" if self.exit_code == EXIT_OK else "failed"

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def failed(self) -> list[Any]:
        """Every task that did not end done (failed, skipped or cancelled), with reason and log."""
        return [r for r in self.results if r.state.value != "done"]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (model, dataset, metric) with its ``value`` (None where missing)."""
        if self.summary is None:
            return []
        return [{"model": m, "dataset": row["dataset"], "metric": row["metric"], "value": row[m]}
                for row in self.summary.rows for m in self.summary.models]

    def to_pandas(self) -> Any:
        """:meth:`rows` as a pandas DataFrame."""
        try:
            import pandas as pd
        except ImportError:
            raise UserError("Run.to_pandas() needs pandas (pip install pandas); Run.rows() needs nothing") from None
        return pd.DataFrame(self.rows())


@dataclass
class PlanView:
    """What a run would do (:func:`plan`): its folder, the tasks of both stages, what is reused."""

    run_dir: str
    existed: bool
    plan: Any  # orchestra.planner.Plan
    runners: dict[str, BaseRunner]
    sweep: Any = None  # SweepInfo

    @property
    def tasks(self) -> dict[str, list[Any]]:
        return dict(self.plan.tasks)

    #: with ``full=False`` a stage of more tasks than this shows its first ``SUMMARY_TASKS`` only
    SUMMARY_TASKS = 20

    def render(self, full: bool = False) -> str:
        """The dry-run text: the sweep's expansion, then each stage's tasks, commands and costs.

        By default a stage of many tasks is summarised (counts, cost, the first few tasks);
        ``full=True`` lists every task and every sweep variant (``--dry-run --list``).
        """
        return "\n".join(self.lines(full))

    def lines(self, full: bool = False) -> Iterator[str]:
        """:meth:`render`'s lines, one at a time (200,000 tasks are never one string)."""
        from orchestra.paths import RunPaths

        paths = RunPaths(self.run_dir)
        limit = None if full else self.SUMMARY_TASKS
        yield f"run folder: {self.run_dir}{' (reused)' if self.existed else ' (new; a plan does not make it)'}"
        if self.sweep is not None:
            yield f"\nsweep: {self.sweep.count()} (model, dataset) pair(s) over {', '.join(self.sweep.axes)}"
            for kind in ("models", "datasets"):
                variants = self.sweep.variants.get(kind, {})
                for n, (abbr, var) in enumerate(variants.items()):
                    if limit is not None and n == limit:
                        yield f"  ... {len(variants) - n} more {kind[:-1]} variant(s) (--dry-run --list shows all)"
                        break
                    yield f"  {kind[:-1]} {abbr}  (from {var['base']})"
            yield (f"  {len(self.plan.shared)} prediction file(s) shared between variants whose predictions "
                   "cannot differ")
        for stage in ("infer", "eval"):
            tasks = self.plan.tasks[stage]
            runner = self.runners[stage]
            yield (f"\n[{stage}] {len(tasks)} task(s) to run, {len(self.plan.reused[stage])} output(s) reused, "
                   f"runner {type(runner).__name__} (max_num_workers={runner.max_num_workers}, "
                   f"retry={runner.retry})")
            shown = tasks if limit is None or len(tasks) <= limit else tasks[:limit]
            if len(shown) < len(tasks):
                samples = sum(u.end - u.start for t in tasks for u in t.units)  # TaskSpec.num_samples, summed
                cost = sum(u.cost for t in tasks for u in t.units)
                yield (f"  {len(tasks)} tasks, {samples} sample(s), total cost={cost:g}, "
                       f"{len({t.model_abbr for t in tasks})} model(s); the first {len(shown)}:")
            for task in shown:
                resources = {"gpu_ids": ["<gpu>"] * task.num_gpus}
                cmd = runner.get_command(task, paths.task_spec(task.task_id), resources, 1,
                                         paths.task_log(stage, task.task_id))
                units = ", ".join(f"{u.name}[{u.start}:{u.end}]" for u in task.units)
                yield f"  {task.task_id}  cost={task.cost:g}  gpus={task.num_gpus}  units: {units}"
                yield f"    $ {cmd.display()}"
            if len(shown) < len(tasks):
                yield f"  ... {len(tasks) - len(shown)} more task(s) (--dry-run --list prints every task)"
        from orchestra.comparison.power import power_lines

        yield from power_lines(self.plan.all_units.get("infer", []), limit)

    def __str__(self) -> str:
        return self.render()


@dataclass
class _Prepared:
    cfg: Any
    infos: Any
    runners: dict[str, BaseRunner]
    source: str
    prices: dict[str, Any] = field(default_factory=dict)  # the report's price table


def _split_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    bad = [k for k in overrides if "." not in k]
    if bad:
        raise UserError(f"unknown keyword argument {bad[0]!r}: config overrides are dotted keys such as "
                        "**{'infer.runner.max_num_workers': 4}")
    return overrides


def _load(config: Any, cfg_options: list[str] | None, overrides: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The raw config dict and the name errors call it by."""
    from orchestra.config import load_config, to_plain
    from orchestra.config.load import apply_overrides

    if isinstance(config, (str, os.PathLike)):
        source = os.fspath(config)
        raw = load_config(source, cfg_options)
    elif isinstance(config, dict):
        source = "<config dict>"
        raw = to_plain(config)
        if cfg_options:
            from orchestra.config.load import parse_override

            apply_overrides(raw, dict(parse_override(o) for o in cfg_options))
    else:
        raise UserError(f"config must be a path or a dict, got {type(config).__name__}")
    if overrides:
        apply_overrides(raw, to_plain(_split_overrides(overrides)))
    return raw, source


def _prepare(config: Any, *, cfg_options: list[str] | None, overrides: dict[str, Any], debug: bool,
             yes: bool, edit_raw: Callable[[dict[str, Any]], None] | None) -> _Prepared:
    from orchestra.config import validate
    from orchestra.config.validate import check_greedy
    from orchestra.datasets.info import dataset_infos
    from orchestra.serving.spec import check_judge_gpus, check_server_gpus

    raw, source = _load(config, cfg_options, overrides)
    if edit_raw is not None:
        edit_raw(raw)
    raw_prices = raw.pop("prices", None)  # the report's, checked by orchestra/summary/costs.py
    if not yes:  # a product of list lengths: refused before a single variant is built
        from orchestra.config.sweep import check_sweep_size

        check_sweep_size(raw, source)
    cfg = validate(raw, source)
    from orchestra.privdir import check_temp_folders
    from orchestra.summary.costs import check_prices

    check_temp_folders()  # a shared temp folder another user planted: one line now, not failed tasks
    from orchestra.summary.progress import line_interval_s

    line_interval_s()  # a bad ORCHESTRA_PROGRESS_INTERVAL_S: one line now, not when the first stage starts

    prices = check_prices(raw_prices, [m["abbr"] for m in cfg.models], source)
    # what planning learns about the datasets (row counts, lm-eval's task facts and index) is
    # cached by a dry run too, so the run after it does not probe the same data again
    infos = dataset_infos(cfg.datasets, source)
    check_greedy(cfg.models, cfg.datasets, source)
    runners = {}
    for name, stage in cfg.stages.items():
        try:
            runners[name] = stage.runner_cls(**stage.runner_kwargs)  # built (checked) even for debug
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {name}.runner: {exc}") from None
    check_server_gpus(cfg.models, runners["infer"].gpus if "infer" in runners else None, source)
    check_judge_gpus(cfg.datasets, runners["eval"].gpus if "eval" in runners else None, source)
    if debug:  # every stage in this process, one task at a time, tracebacks shown
        from orchestra.runners.local.inprocess import InProcessRunner

        runners = {name: InProcessRunner() for name in runners}
    return _Prepared(cfg, infos, runners, source, prices)


def plan(config: Any, *, work_dir: str | None = None, reuse: str | None = None, mode: str = "all",
         cfg_options: list[str] | None = None, yes: bool = True,
         _edit_raw: Callable[[dict[str, Any]], None] | None = None, **overrides: Any) -> PlanView:
    """Plan a run without running it (``--dry-run``): no run folder is written, only the caches
    of what planning learns about the datasets (as a real run's planning writes them)."""
    from orchestra.paths import RunPaths, choose_run_folder
    from orchestra.planner import make_plan

    prep = _prepare(config, cfg_options=cfg_options, overrides=overrides, debug=False, yes=yes,
                    edit_raw=_with_work_dir(_edit_raw, work_dir))
    if reuse is None and mode in ("eval", "viz"):
        reuse = "latest"
    root, existed = choose_run_folder(prep.cfg.work_dir, reuse, allow_new=mode != "viz", create=False)
    paths = RunPaths(root)
    return PlanView(root, existed, make_plan(prep.cfg, prep.infos, paths), prep.runners, prep.cfg.sweep)


def _with_work_dir(edit: Callable[[dict[str, Any]], None] | None,
                   work_dir: str | None) -> Callable[[dict[str, Any]], None] | None:
    if work_dir is None:
        return edit

    def both(raw: dict[str, Any]) -> None:
        raw["work_dir"] = os.fspath(work_dir)
        if edit is not None:
            edit(raw)

    return both


def run(config: Any, *, work_dir: str | None = None, mode: str = "all", reuse: str | None = None,
        debug: bool = False, yes: bool = False, quiet: bool = False, cfg_options: list[str] | None = None,
        trace: str | None = None, _edit_raw: Callable[[dict[str, Any]], None] | None = None,
        **overrides: Any) -> Run:
    """Run (or continue, with ``reuse='latest'`` or a run folder) an evaluation; see the module doc.

    ``mode``: ``all``, ``infer``, ``eval`` or ``viz`` (only rebuild the summary).  Raises
    ``UserError`` (``ConfigError``) for bad input before anything runs; a failed task does not
    raise: it is in ``Run.failed`` and ``Run.exit_code`` is 1.  Every run ends by writing
    ``summary/report.html`` (``Run.report``) and ``summary/trace.json`` (and ``trace``, if given).
    """
    from orchestra.paths import RunPaths, choose_run_folder

    if mode not in MODES:
        raise UserError(f"mode {mode!r} is not valid; valid: {', '.join(MODES)}")
    prep = _prepare(config, cfg_options=cfg_options, overrides=overrides, debug=debug, yes=yes,
                    edit_raw=_with_work_dir(_edit_raw, work_dir))
    # Only now, with nothing left to reject, is a run folder chosen (and a new one created).
    if reuse is None and mode in ("eval", "viz"):
        reuse = "latest"  # scoring or summarising a new, empty folder would do nothing
    root, _ = choose_run_folder(prep.cfg.work_dir, reuse, allow_new=mode != "viz")
    paths = RunPaths(root)
    if mode == "viz":
        return viz(paths.root, quiet=quiet, trace=trace, prices=prep.prices)

    from filelock import FileLock, Timeout

    lock = FileLock(paths.lock)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunFolderBusyError(f"{root} is in use by another orchestrator (lock {paths.lock})") from None
    try:
        return _execute(prep, mode, paths, debug, quiet, trace)
    finally:
        lock.release()


def viz(run_dir: str, quiet: bool = False, trace: str | None = None, prices: dict[str, Any] | None = None) -> Run:
    """Rebuild the summary and the report of a run folder from the config that run saved (not
    the config file as it is now); nothing else in the folder changes.  A run folder another user
    could write is refused (:func:`orchestra.paths.check_run_folder`), as the CLI refuses it."""
    from orchestra.config import load_config, validate
    from orchestra.datasets.info import dataset_infos
    from orchestra.paths import RunPaths, check_run_folder
    from orchestra.planner import make_plan
    from orchestra.summary.epilogue import epilogue

    check_run_folder(run_dir)  # its config.py is loaded and its results read back
    paths = RunPaths(run_dir)
    if not os.path.isfile(paths.config):
        raise UserError(f"--mode viz: {paths.root} holds no config.py (not a run folder of orchestra)")
    cfg = validate(load_config(paths.config), paths.config)
    infos = dataset_infos(cfg.datasets, paths.config, write_cache=False)
    made = make_plan(cfg, infos, paths)
    end = epilogue(paths, cfg, made, [], prices or {}, trace, quiet)
    return Run(paths.root, EXIT_FAILED if end.summary.missing else EXIT_OK, [], end.summary, end.pivot, end.report)


def _execute(prep: _Prepared, mode: str, paths: Any, debug: bool, quiet: bool, trace: str | None = None) -> Run:
    """Run the stages of ``mode`` in the locked run folder ``paths``, then the epilogue."""
    from orchestra.config import dump_config
    from orchestra.events import EventLog
    from orchestra.gcpause import gc_frozen
    from orchestra.planner import clear_leftovers, make_plan
    from orchestra.runners.base import RunContext
    from orchestra.runners.core.host import HostCapacity
    from orchestra.stages import StopOnSignals, run_stages
    from orchestra.summary.epilogue import epilogue

    cfg = prep.cfg
    paths.make_dirs()
    from orchestra.serving.pool import reap

    reap(paths.servers)  # replicas an orchestrator of this run folder left behind (SIGKILLed)
    dump_config(cfg.resolved, paths.config)
    events = EventLog(paths.events)
    ctx = RunContext(paths, events, host=HostCapacity())
    with StopOnSignals(ctx.stop) as signals:
        # the plan lives through the stages: no collection need walk it again
        with gc_frozen(lambda: make_plan(cfg, prep.infos, paths)) as made:
            clear_leftovers(made, paths)  # what writers killed with an earlier orchestrator left
            stages = {"all": ["infer", "eval"], "infer": ["infer"], "eval": ["eval"]}[mode]
            # a runner's own check of what it reaches (a Ray head's address), before any stage says a
            # word; only for a stage with tasks (``-r`` of a finished run needs no cluster)
            checked = {id(prep.runners[s]): prep.runners[s] for s in stages if made.tasks[s] and not debug}
            for runner in checked.values():
                runner.preflight()
            events.emit("run_started", mode=mode, pid=os.getpid(),
                        tasks={s: [t.task_id for t in ts] for s, ts in made.tasks.items()})
            results = run_stages(cfg, prep.runners, made, ctx, stages, debug, quiet)
    interrupted = ctx.stop.is_set()
    events.emit("run_finished", interrupted=interrupted,
                failed=[r.task_id for r in results if r.state.value != "done"])
    end = epilogue(paths, cfg, made, results, prep.prices, trace, quiet, debug, keep_current=True)
    code = EXIT_FAILED if end.bad else EXIT_OK
    if interrupted:
        # 128 + the signal, as shells report it (Ctrl-C 130, SIGHUP 129, SIGTERM 130 as before)
        code = EXIT_HANGUP if signals.hangup else EXIT_INTERRUPTED
    return Run(paths.root, code, results, end.summary, end.pivot, end.report)
