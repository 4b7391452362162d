"""``CodeExecEvaluator``: run each completion with its tests in a sandbox; pass@1 and pass@k.

A record's ``gold`` names the tests (the ``tests`` column of the bundled HumanEval and MBPP
sets is shaped so): ``dict(test=<code run after the solution>, prompt=<code the completion
continues, '' if none>, entry_point=<the function under test>)``.  Its ``prediction`` is one
completion, or a list of ``n`` completions of the same problem (``gen`` with ``n=...``), which
gives pass@k for every ``k <= n``.  How a completion becomes a program is
:mod:`orchestra.evaluators.programs`.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra.errors import ConfigError
from orchestra.evaluators.heavy import HeavyEvaluator, Verdict
from orchestra.evaluators.programs import DRIVER_NAME, build_program, sandbox_files
from orchestra.sandbox import ISOLATIONS, Sandbox, SandboxLimits

#: Bumped whenever the post-processing or pass rules change, so earlier results are scored again
#: (2: a pass needs the driver's secret verdict token, not a fixed marker).
POSTPROCESS_VERSION = 2
_STDERR_TAIL = 2000


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` passed:
    ``1 - C(n-c, k) / C(n, k)``, as a running product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


class CodeExecEvaluator(HeavyEvaluator):
    """Runs each completion and its tests in a sandbox; reports pass@k.

    Args:
        k: the pass@k values to report (those above the number of samples per problem are
            left out, with a note in the task log).
        timeout_s, cpu_s, mem_mb, max_processes, max_output_bytes, disk_mb: limits of each
            program (:class:`~orchestra.sandbox.SandboxLimits`).
        isolation: ``auto`` | ``bwrap`` | ``unshare`` | ``none`` (see ``docs/scoring.md``).
        allow_unisolated: run without network isolation when none is available.
        max_sandboxes: programs running at once on this host, across all tasks (default:
            CPU count).
        python: the interpreter that runs the programs (a system one: it must be readable
            by an unprivileged user).
        extra_paths: more host folders the sandbox sees read-only (bwrap).
    """

    speed_keys = frozenset({"max_sandboxes"})

    def __init__(
        self,
        k: Sequence[int] = (1,),
        timeout_s: float = 10.0,
        cpu_s: float | None = None,
        mem_mb: int = 1024,
        max_processes: int = 32,
        max_output_bytes: int = 64 * 1024,
        disk_mb: int = 64,
        isolation: str = "auto",
        allow_unisolated: bool = False,
        max_sandboxes: int | None = None,
        python: str = "/usr/bin/python3",
        extra_paths: Sequence[str] = (),
    ) -> None:
        ks = [k] if isinstance(k, int) else list(k)
        if not ks or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in ks):
            raise ValueError(f"k must be an integer >= 1 or a list of them, got {k!r}")
        if not isinstance(python, str) or not python.startswith("/"):
            raise ValueError(f"python must be an absolute path, got {python!r}")
        self.k = sorted(set(ks))
        self.python = python
        limits = SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, mem_mb=mem_mb, max_processes=max_processes,
                               max_output_bytes=max_output_bytes, disk_mb=disk_mb)
        self.sandbox = Sandbox(isolation=isolation, limits=limits, max_sandboxes=max_sandboxes,
                               allow_unisolated=allow_unisolated, extra_paths=extra_paths)

    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> Any:
        return {**super().identity(cfg), "postprocess_version": POSTPROCESS_VERSION}

    @classmethod
    def check_config(cls, cfg: dict[str, Any], dataset: dict[str, Any], where: str) -> None:
        if cfg.get("isolation", "auto") not in ("auto", *ISOLATIONS):
            raise ConfigError(f"{where}.isolation: {cfg['isolation']!r} is not valid; valid: auto, "
                              f"{', '.join(ISOLATIONS)}")
        if not (dataset.get("reader_cfg") or {}).get("output_column"):
            raise ConfigError(f"{where}: code_exec needs the dataset's tests: set reader_cfg.output_column to the "
                              "column holding dict(test=..., prompt=..., entry_point=...) (the bundled sets call it "
                              "'tests')")
        try:
            cls(**{k: v for k, v in cfg.items() if k != "type"})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None

    # -- running ------------------------------------------------------------------------------
    async def start(self) -> dict[str, Any]:
        await self.sandbox.start()
        return self.sandbox.describe()

    def describe_line(self, info: Mapping[str, Any]) -> str:
        net = "network isolated" if info["network_isolated"] else "NOT network isolated"
        lim = info["limits"]
        return (f"sandbox isolation={info['isolation']} ({net}); {info['guarantees']}; user: {info['user']}; "
                f"limits: {lim['timeout_s']} s wall, {lim['cpu_s']} s CPU, {lim['mem_mb']} MB memory, "
                f"{lim['max_processes']} processes, {lim['max_output_bytes']} bytes output, {lim['disk_mb']} MB disk; "
                f"max_sandboxes={info['max_sandboxes']} (host-wide)")

    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        # A program per sandbox slot runs at once: ``max_sandboxes`` cores when it is set.  Unset,
        # the cap is the CPU count of the machine the task runs on (host-wide, whatever the task
        # holds), which the planner cannot know for a remote one: one core is declared.
        limit = cfg.get("max_sandboxes")
        return {"num_gpus": 0, "num_procs": limit if isinstance(limit, int) and limit > 0 else 1}

    def max_concurrency(self) -> int:
        # Enough programs ready that every host-wide slot this task gets is kept busy.
        return 2 * self.sandbox.limit

    def snapshot(self) -> dict[str, Any]:
        return self.sandbox.snapshot()

    @staticmethod
    def _tests(gold: Any) -> tuple[str, str, str | None]:
        if not isinstance(gold, dict) or not isinstance(gold.get("test"), str) or not gold["test"].strip():
            shown = repr(gold)[:80]
            raise ValueError(f"no tests: gold is {shown}, expected dict(test=..., prompt=..., entry_point=...)")
        prompt = gold.get("prompt") or ""
        entry = gold.get("entry_point")
        return gold["test"], str(prompt), entry if isinstance(entry, str) and entry else None

    async def _run_one(self, completion: Any, test: str, prompt: str, entry: str | None) -> dict[str, Any]:
        if not isinstance(completion, str):
            return {"passed": False, "status": "not_text", "detail": f"completion is {type(completion).__name__}, "
                                                                     "not text"}
        program = build_program(completion, test, prompt, entry)
        # The verdict token: known here and to the driver only (its stdin), printed by the
        # driver once the tests ran to their end.
        token = secrets.token_hex(16)
        res = await self.sandbox.run(sandbox_files(program), [self.python, DRIVER_NAME], stdin=token.encode())
        passed = res.ok and token in res.stdout
        status = res.status if not res.ok or passed else "left_early"
        out: dict[str, Any] = {"passed": passed, "status": status, "duration_s": round(res.duration_s, 3)}
        if not passed:
            out["returncode"] = res.returncode
            out["stderr"] = res.stderr[-_STDERR_TAIL:]
        return out

    async def ajudge(self, record: dict[str, Any]) -> Verdict:
        test, prompt, entry = self._tests(record.get("gold"))
        pred = record.get("prediction")
        completions = pred if isinstance(pred, list) else [pred]
        if not completions:
            return {"n": 0, "num_passed": 0, "results": [], "status": "not_text"}
        results = await asyncio.gather(*(self._run_one(c, test, prompt, entry) for c in completions))
        num_passed = sum(1 for r in results if r["passed"])
        if len(results) == 1:
            return {"n": 1, "num_passed": num_passed, **results[0]}
        return {"n": len(results), "num_passed": num_passed, "results": list(results)}

    def aggregate(self, records: list[dict[str, Any]], verdicts: Mapping[int, Verdict]) -> dict[str, float]:
        counts: list[tuple[int, int]] = []
        for rec in records:
            v = verdicts.get(int(rec["id"]), {})
            n = int(v.get("n", 0))
            counts.append((max(n, 1), int(v.get("num_passed", 0))))  # failed or empty: one failed sample
        if not counts:
            return {f"pass@{k}": math.nan for k in self.k}
        fewest = min(n for n, _ in counts)
        return {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
                for k in self.k if k <= fewest}

    def sample_scores(self, records: list[dict[str, Any]], details: list[dict[str, Any]]
                      ) -> dict[str, list[float | None]]:
        """pass@k of each sample (its mean over the samples is the metric)."""
        counts = [(max(int(d.get("n", 0)), 1), int(d.get("num_passed", 0))) for d in details]
        if not counts:
            return {}
        fewest = min(n for n, _ in counts)
        return {f"pass@{k}": [pass_at_k(n, c, k) for n, c in counts] for k in self.k if k <= fewest}

    def statuses(self, verdicts: Mapping[int, Verdict]) -> dict[str, int]:
        """How many programs ended how (``ok``, ``failed``, ``timeout``, ``not_text``, ...)."""
        seen: Counter[str] = Counter()
        for v in verdicts.values():
            for r in v.get("results") or [v]:  # n=0: the verdict itself says not_text
                if "status" in r:
                    seen[str(r["status"])] += 1
                elif "prediction_error" in r:
                    seen["prediction_error"] += 1
        return dict(seen)

    async def aclose(self) -> None:
        pass
