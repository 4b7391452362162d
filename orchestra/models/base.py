"""The contract between the inference engine and every model.

The engine calls a model once per sample, concurrently, on one asyncio loop.  API models
answer each call with an HTTP request; local models queue the calls and run them in
batches (``BatchedModel``), so dynamic batching falls out of ordinary concurrency.

Model classes are imported by the orchestrator to validate configs, so a model module must
not import an ML framework at module level: import torch / transformers / vllm inside the
methods that need them.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from orchestra.errors import ModelError
from orchestra.fileio import stable_hash
from orchestra.requests import GenRequest, LoglikRequest


class SampleTag:
    """The sample a request belongs to (the engine sets it around each sample's coroutine), and
    how often each identical request was made by it: batch mode builds stable request ids from it.
    ``unit``: a tag of the prediction file the sample belongs to ("" when none), the same whichever
    task holds that file, so that a ``-r`` that packs it into another task finds its requests."""

    def __init__(self, sample_id: object, unit: str = "") -> None:
        self.id = str(sample_id)
        self.unit = unit
        self.seen: dict[str, int] = {}


#: the unit tags (:class:`SampleTag`) of the samples the running task may send (empty outside one)
task_units: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("orchestra_units", default=frozenset())


#: the sample whose coroutine is running (None outside the engine)
current_sample: contextvars.ContextVar[SampleTag | None] = contextvars.ContextVar("orchestra_sample", default=None)


@dataclass
class ModelStats:
    """Live counters a model keeps; the engine reports them in progress events."""

    in_flight: int = 0
    done: int = 0
    rate_limited: int = 0
    retries: int = 0
    errors: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "in_flight": self.in_flight,
            "done": self.done,
            "rate_limited": self.rate_limited,
            "retries": self.retries,
            "errors": self.errors,
        }
        out.update(self.extra)
        return out


class BaseModel(abc.ABC):
    """A model the inference engine can call.

    Args:
        abbr: short name used in the run folder and the summary table.
        path: what the model is (a checkpoint folder, a file, an API model name).
        max_out_len: default generation length when a dataset does not set one.
        generation_kwargs: default sampling settings (``temperature``, ``top_p``, ``seed``).
    """

    #: Config keys that change how fast or where a model runs, never what it answers.  They
    #: are left out of :meth:`identity`, so changing them reuses earlier predictions.
    #: Subclasses add their own (``batch_size``, ``max_connections``, ...).
    speed_keys: ClassVar[frozenset[str]] = frozenset({"abbr", "run_cfg"})
    #: The orchestrator builds every model once while validating a config, so a bad value
    #: (``batch_size=0``, a missing checkpoint) is a config error, not a failed task.  A
    #: constructor must therefore be cheap (no framework import, no weights, no network: that
    #: belongs in :meth:`load`); a model that cannot promise it sets this to False.
    validate_by_construction: ClassVar[bool] = True
    #: Seconds a task may take, after SIGTERM, to stop what this model started elsewhere
    #: (batch mode cancels its batches); after that the task process exits regardless.
    stop_grace_s: float = 0.0
    #: whether :meth:`loglikelihood_greedy` answers (a config whose dataset needs ``is_greedy``
    #: is refused for a model that cannot)
    scores_greedy: ClassVar[bool] = False

    def __init__(
        self,
        abbr: str,
        path: str = "",
        max_out_len: int = 256,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.abbr = abbr
        self.path = path
        self.max_out_len = max_out_len
        self.generation_kwargs = dict(generation_kwargs or {})
        self.stats = ModelStats()

    # -- what the model is and needs, asked of its config without building it -------------
    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> str:
        """A key of the settings that can change an answer: the content hash of predictions
        covers it, and two configs with the same identity share predictions."""
        return stable_hash({k: v for k, v in cfg.items() if k not in cls.speed_keys})

    @classmethod
    def instance_key(cls, cfg: dict[str, Any]) -> str:
        """A key of everything the constructor gets: a process that built a model for one
        config reuses the object for another config with this key (warm workers)."""
        return stable_hash({k: v for k, v in cfg.items() if k != "run_cfg"})

    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        """What one task of this model occupies: ``num_gpus`` and ``num_procs`` (from
        ``run_cfg``; a subclass may derive them from its own settings)."""
        run_cfg = cfg.get("run_cfg") or {}
        return {"num_gpus": int(run_cfg.get("num_gpus", 0)), "num_procs": int(run_cfg.get("num_procs", 1))}

    @classmethod
    def reports_greedy(cls, cfg: dict[str, Any]) -> bool:
        """Whether a model of config ``cfg`` answers :meth:`loglikelihood_greedy`, asked of the
        config without building the model.  Default: :attr:`scores_greedy`."""
        return cls.scores_greedy

    @classmethod
    def chat_template_problem(cls, cfg: dict[str, Any], scoring: bool) -> str | None:
        """Why this model cannot take requests of chat messages to be read as ``lm_eval
        --apply_chat_template`` reads them (``lmeval_chat``; ``scoring``: log-likelihoods of them
        too), in words for a config error; None: it can.  Asked of the config, without building
        the model.  Default: None (the model takes messages as they are)."""
        return None

    def out_len(self, request: GenRequest) -> int:
        """The generation length of ``request``: its own, else the model's ``max_out_len``."""
        return request.max_out_len if request.max_out_len is not None else self.max_out_len

    def sampling(self, request: GenRequest) -> dict[str, Any]:
        """Sampling settings of ``request``; a greedy, unseeded one takes the model's
        ``generation_kwargs`` as its settings."""
        out: dict[str, Any] = {"temperature": request.temperature, "top_p": request.top_p, "seed": request.seed}
        if request.is_default_sampling():
            out.update(self.generation_kwargs)
        return out

    @abc.abstractmethod
    async def generate(self, request: GenRequest) -> str:
        """Return the generated text for one request (without the prompt)."""

    @abc.abstractmethod
    async def loglikelihood(self, request: LoglikRequest) -> list[float]:
        """Return one summed log-probability per continuation, in order."""

    async def loglikelihood_greedy(self, request: LoglikRequest) -> list[tuple[float, bool]]:
        """One ``(summed log-probability, is greedy)`` per continuation, in order: greedy when each
        of its tokens is the model's most likely next token (lm-eval's ``is_greedy``, LAMBADA's
        ``acc``).  A model that can tell sets :attr:`scores_greedy`; default: ``ModelError``."""
        raise ModelError(f"model {self.abbr}: {type(self).__name__} does not report whether a continuation is the "
                         "greedy one (is_greedy)")

    async def loglikelihood_rolling(self, request: LoglikRequest) -> list[float]:
        """The log-likelihood of each continuation of ``request`` (empty context) as a whole text
        from the model's start token (lm-eval's ``loglikelihood_rolling``).  Default:
        :meth:`loglikelihood`, which cuts a long text to its last tokens; ``HFCausalLM`` scores
        lm-eval's rolling windows."""
        return await self.loglikelihood(request)

    def max_concurrency(self) -> int:
        """How many calls the engine should keep in flight at once for this model."""
        return 64

    def load(self) -> None:
        """Load weights or open resources before the first call (the task times it, and a
        failure here fails the task once instead of every sample).  Default: nothing."""

    async def aclose(self) -> None:
        """Release connections, threads or memory; called once when a task ends."""

    def bind_task(self, run_dir: str, task_id: str, emit: Callable[..., None]) -> None:
        """Called by the infer task before its first request: the run folder and task this
        model works for, and ``emit(event, **fields)`` for its events.  Default: nothing (batch
        mode of API models records its batches there)."""


Req = TypeVar("Req", GenRequest, LoglikRequest)
Res = TypeVar("Res")


class _Batcher(Generic[Req, Res]):
    """Collects concurrent calls into batches and runs each batch on one worker thread."""

    def __init__(self, run_batch: Any, batch_size: Callable[[], int], lock: threading.Lock) -> None:
        self._run_batch = run_batch
        self._batch_size = batch_size
        self._lock = lock
        self._pending: list[tuple[Req, asyncio.Future[Res]]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, request: Req) -> Res:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._drain())
        fut: asyncio.Future[Res] = loop.create_future()
        self._pending.append((request, fut))
        assert self._wakeup is not None
        self._wakeup.set()
        return await fut

    async def _drain(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # Let every coroutine that is ready to submit do so before a batch is cut.
            await asyncio.sleep(0)
            while self._pending:
                batch = self._pending[: self._batch_size()]
                del self._pending[: len(batch)]
                requests = [req for req, _ in batch]
                try:
                    results = await asyncio.to_thread(self._locked_run, requests)
                    if len(results) != len(batch):  # which answer is whose is unknown: none is trusted
                        raise ModelError(f"the model returned {len(results)} results for {len(batch)} requests")
                except Exception as exc:  # one bad batch fails its own callers only
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), res in zip(batch, results):
                    if not fut.done():
                        fut.set_result(res)

    def _locked_run(self, requests: list[Req]) -> list[Res]:
        with self._lock:
            return list(self._run_batch(requests))


class BatchedModel(BaseModel):
    """A local model that runs requests in batches on a worker thread.

    Subclasses implement the two synchronous batch methods; concurrent ``generate`` /
    ``loglikelihood`` calls from the engine are grouped into batches of up to
    :meth:`requests_per_batch` requests (dynamic batching).  Only one batch runs at a time
    per model.
    """

    speed_keys = BaseModel.speed_keys | {"batch_size"}

    def __init__(self, abbr: str, path: str = "", batch_size: int = 8, **kwargs: Any) -> None:
        super().__init__(abbr, path, **kwargs)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        lock = threading.Lock()
        self._gen = _Batcher[GenRequest, str](self.generate_batch, lambda: self.requests_per_batch("gen"), lock)
        self._ll = _Batcher[LoglikRequest, list[float]](
            self.loglikelihood_batch, lambda: self.requests_per_batch("loglik"), lock
        )
        self._greedy = _Batcher[LoglikRequest, list[tuple[float, bool]]](
            self.loglikelihood_greedy_batch, lambda: self.requests_per_batch("loglik"), lock
        )
        self._rolling = _Batcher[LoglikRequest, list[float]](
            self.loglikelihood_rolling_batch, lambda: self.requests_per_batch("loglik"), lock
        )

    def requests_per_batch(self, kind: str) -> int:
        """How many queued requests of ``kind`` (``'gen'`` or ``'loglik'``) one batch call
        takes; ``batch_size`` unless a model cuts its batches some other way."""
        return self.batch_size

    @abc.abstractmethod
    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        """Generate for a batch of requests; one string per request."""

    @abc.abstractmethod
    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        """Score a batch of requests; one list of floats per request."""

    def loglikelihood_greedy_batch(self, requests: list[LoglikRequest]) -> list[list[tuple[float, bool]]]:
        """:meth:`loglikelihood_greedy` for a batch (models with :attr:`scores_greedy`)."""
        raise ModelError(f"model {self.abbr}: {type(self).__name__} does not report whether a continuation is the "
                         "greedy one (is_greedy)")

    def loglikelihood_rolling_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        """:meth:`loglikelihood_rolling` for a batch: each request's one continuation is a whole
        text (empty context).  Default: :meth:`loglikelihood_batch`."""
        return self.loglikelihood_batch(requests)

    async def loglikelihood_greedy(self, request: LoglikRequest) -> list[tuple[float, bool]]:
        if not self.scores_greedy:
            return await super().loglikelihood_greedy(request)
        return await self._counted(self._greedy.submit(request))

    async def loglikelihood_rolling(self, request: LoglikRequest) -> list[float]:
        return await self._counted(self._rolling.submit(request))

    async def _counted(self, call: Awaitable[Res]) -> Res:
        self.stats.in_flight += 1
        try:
            return await call
        finally:
            self.stats.in_flight -= 1
            self.stats.done += 1

    async def generate(self, request: GenRequest) -> str:
        self.stats.in_flight += 1
        try:
            return await self._gen.submit(request)
        finally:
            self.stats.in_flight -= 1
            self.stats.done += 1

    async def loglikelihood(self, request: LoglikRequest) -> list[float]:
        self.stats.in_flight += 1
        try:
            return await self._ll.submit(request)
        finally:
            self.stats.in_flight -= 1
            self.stats.done += 1

    def max_concurrency(self) -> int:
        # Enough queued work to fill the next batch while the current one runs.
        return 2 * max(self.requests_per_batch("gen"), self.requests_per_batch("loglik"))
