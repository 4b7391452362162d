"""Local models served by vLLM's offline engine on GPUs.

``VLLMModel`` runs ``tensor_parallel_size`` GPUs per engine and ``data_parallel_size``
engines (replicas).  With one replica the engine lives in the task process; with several,
each replica is a spawned process whose ``CUDA_VISIBLE_DEVICES`` is its own slice of the
task's GPUs, and every batch is split evenly across them.  One task therefore needs
``tensor_parallel_size * data_parallel_size`` GPUs (:meth:`VLLMModel.resources`).

vllm is imported inside methods only; without it, the first request fails with a
one-line :class:`~orchestra.errors.ModelError`.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

from orchestra.errors import ConfigError, ModelError
from orchestra.models.base import BatchedModel
from orchestra.models.chat_template import template_problem
from orchestra.models.hf_common import (
    ModelSource,
    check_local_model_args,
    encode,
    loglik_rows,
    loglik_scores,
    render_prompt,
    truncate_at_stop,
)
from orchestra.ranges import even_ranges
from orchestra.requests import GenRequest, LoglikRequest


def gpus_needed(tensor_parallel_size: int = 1, data_parallel_size: int = 1) -> int:
    """GPUs one task of this model occupies."""
    return tensor_parallel_size * data_parallel_size


def run_cfg_for(model_cfg: dict[str, Any]) -> dict[str, int]:
    """``run_cfg`` for a VLLMModel config dict, without building the model.

    An explicit ``run_cfg`` in the dict wins; otherwise ``num_gpus`` is tp x dp.
    """
    explicit = dict(model_cfg.get("run_cfg") or {})
    need = gpus_needed(int(model_cfg.get("tensor_parallel_size", 1)), int(model_cfg.get("data_parallel_size", 1)))
    return {"num_gpus": int(explicit.get("num_gpus", need)), "num_procs": int(explicit.get("num_procs", 1))}


def visible_gpus(count: int) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``0..count-1``."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or env.strip() == "":
        return [str(i) for i in range(count)]
    return [d.strip() for d in env.split(",") if d.strip()]


def replica_devices(visible: Sequence[str], tensor_parallel_size: int, data_parallel_size: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each replica: consecutive slices of ``tensor_parallel_size`` GPUs.

    >>> replica_devices(["4", "5", "6", "7"], 2, 2)
    ['4,5', '6,7']
    """
    need = gpus_needed(tensor_parallel_size, data_parallel_size)
    if len(visible) < need:
        raise ModelError(
            f"vLLM needs {need} GPUs (tensor_parallel_size={tensor_parallel_size} x "
            f"data_parallel_size={data_parallel_size}) but {len(visible)} are visible "
            f"(CUDA_VISIBLE_DEVICES={','.join(visible) or 'unset'}); set run_cfg=dict(num_gpus={need})"
        )
    tp = tensor_parallel_size
    return [",".join(visible[i * tp : (i + 1) * tp]) for i in range(data_parallel_size)]


def _import_vllm(abbr: str) -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ModelError(
            f"model {abbr}: VLLMModel needs vllm ({exc.name} is missing); install it on a CUDA machine "
            "with `pip install vllm`, or use HFCausalLM"
        ) from None
    return vllm


def _replica_main(conn: Any, devices: str, init_kwargs: dict[str, Any]) -> None:
    """Body of one data-parallel replica process: serve batches sent over ``conn``."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices  # before vllm / torch touch CUDA
    try:
        model = VLLMModel(**init_kwargs)
        model.engine()
        conn.send(("ready", devices))
    except Exception as exc:  # report, then exit: the parent raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        kind, requests = msg
        try:
            result = model.generate_batch(requests) if kind == "gen" else model.loglikelihood_batch(requests)
            conn.send(("ok", result))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class VLLMModel(BatchedModel):
    """A model run by vLLM's offline engine on this machine's GPUs.

    Args:
        abbr: short name in the run folder and the summary.
        path: a checkpoint folder or hub id vLLM can load.
        max_out_len: generation length of requests whose dataset sets none.
        batch_size: requests handed to vLLM at once (split across replicas); vLLM
            schedules them itself, so this can be large.
        generation_kwargs: defaults for greedy, unseeded requests: ``temperature``,
            ``top_p``, ``top_k``, ``seed``, ``repetition_penalty``.
        tensor_parallel_size: GPUs one engine spans.
        data_parallel_size: engines (replicas), each in its own process with its own GPUs.
        max_model_len: longest sequence vLLM plans memory for (``None``: the model's); a
            longer log-likelihood context loses tokens from the left.
        gpu_memory_utilization: fraction of each GPU vLLM may claim.
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        use_chat_template: as for :class:`~orchestra.models.hf.HFCausalLM`.
        trust_remote_code: allow checkpoints that ship their own modelling code.
        seed: the engine's random seed.
        engine_kwargs: further ``vllm.LLM`` arguments (e.g. ``enforce_eager``, ``quantization``).
    """

    @classmethod
    def chat_template_problem(cls, cfg: dict[str, Any], scoring: bool) -> str | None:
        """A checkpoint folder must have a chat template; a hub id is found out at load time."""
        path = os.path.expanduser(str(cfg.get("path", "")))
        return template_problem(ModelSource("folder", path)) if os.path.isdir(path) else None

    def __init__(
        self,
        abbr: str,
        path: str,
        max_out_len: int = 256,
        batch_size: int = 256,
        generation_kwargs: dict | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        use_chat_template: bool | None = None,
        trust_remote_code: bool = False,
        seed: int = 0,
        engine_kwargs: dict | None = None,
    ) -> None:
        where = f"model {abbr}"
        for name, value in (("tensor_parallel_size", tensor_parallel_size), ("data_parallel_size", data_parallel_size)):
            if value < 1:
                raise ConfigError(f"{where}: {name} must be >= 1, got {value}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ConfigError(f"{where}: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        check_local_model_args(where, generation_kwargs, dtype=dtype)
        super().__init__(
            abbr, path, batch_size=batch_size, max_out_len=max_out_len, generation_kwargs=generation_kwargs
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size = data_parallel_size
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = dtype
        self.use_chat_template = use_chat_template
        self.trust_remote_code = trust_remote_code
        self.seed = seed
        self.engine_kwargs = dict(engine_kwargs or {})
        self._init_kwargs = {
            "abbr": abbr,
            "path": path,
            "max_out_len": max_out_len,
            "batch_size": batch_size,
            "generation_kwargs": generation_kwargs,
            "tensor_parallel_size": tensor_parallel_size,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": dtype,
            "use_chat_template": use_chat_template,
            "trust_remote_code": trust_remote_code,
            "seed": seed,
            "engine_kwargs": engine_kwargs,
        }
        self._llm: Any = None
        self._replicas: list[tuple[Any, Any]] = []  # (process, connection)

    # -- what the model asks of the machine ---------------------------------------------
    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        """GPUs of one task: ``tensor_parallel_size * data_parallel_size`` unless ``run_cfg`` says."""
        return run_cfg_for(cfg)

    def llm_kwargs(self) -> dict[str, Any]:
        """Arguments of ``vllm.LLM`` for one replica."""
        kwargs: dict[str, Any] = {
            "model": self.path,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "seed": self.seed,
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        kwargs.update(self.engine_kwargs)
        return kwargs

    def sampling_kwargs(self, req: GenRequest) -> dict[str, Any]:
        """Arguments of ``vllm.SamplingParams`` for one generation request.

        A greedy, unseeded request takes the model's ``generation_kwargs`` as defaults.
        """
        settings = self.sampling(req)
        kwargs: dict[str, Any] = {
            "max_tokens": self.out_len(req),
            "temperature": float(settings["temperature"]),
            "top_p": float(settings["top_p"]) if settings["temperature"] else 1.0,
            "stop": list(req.stop),
        }
        if settings.get("seed") is not None:
            kwargs["seed"] = int(settings["seed"])
        if settings.get("top_k") is not None:
            kwargs["top_k"] = int(settings["top_k"])
        if settings.get("repetition_penalty") is not None:
            kwargs["repetition_penalty"] = float(settings["repetition_penalty"])
        return kwargs

    # -- engines ------------------------------------------------------------------------
    def engine(self) -> Any:
        """The in-process ``vllm.LLM`` (one replica), built on first use."""
        if self._llm is None:
            vllm = _import_vllm(self.abbr)
            self._llm = vllm.LLM(**self.llm_kwargs())
        return self._llm

    def _start_replicas(self) -> None:
        if self._replicas:
            return
        _import_vllm(self.abbr)  # fail here, in one line, rather than in every replica
        need = gpus_needed(self.tensor_parallel_size, self.data_parallel_size)
        devices = replica_devices(visible_gpus(need), self.tensor_parallel_size, self.data_parallel_size)
        ctx = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
        for dev in devices:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_replica_main, args=(child, dev, self._init_kwargs), daemon=True)
            proc.start()
            child.close()
            self._replicas.append((proc, parent))
        for i, (_, conn) in enumerate(self._replicas):
            status, detail = self._receive(i, conn)
            if status != "ready":
                self._stop_replicas()
                raise ModelError(f"model {self.abbr}: replica {i} failed to start: {detail}")

    def _receive(self, index: int, conn: Any) -> tuple[str, Any]:
        try:
            status, detail = conn.recv()
        except EOFError:
            raise ModelError(f"model {self.abbr}: replica {index} exited unexpectedly") from None
        return status, detail

    def _stop_replicas(self) -> None:
        for proc, conn in self._replicas:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
        self._replicas = []

    def _fan_out(self, kind: str, requests: list[Any]) -> list[Any]:
        self._start_replicas()
        ranges = even_ranges(len(requests), len(self._replicas))
        used = [(i, lo, hi) for i, (lo, hi) in enumerate(ranges) if hi > lo]
        for i, lo, hi in used:
            self._replicas[i][1].send((kind, requests[lo:hi]))
        results: list[Any] = []
        for i, _, _ in used:
            status, detail = self._receive(i, self._replicas[i][1])
            if status != "ok":
                raise ModelError(f"model {self.abbr}: replica {i}: {detail}")
            results.extend(detail)
        return results

    async def aclose(self) -> None:
        self._stop_replicas()
        self._llm = None

    # -- requests -----------------------------------------------------------------------
    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        if self.data_parallel_size > 1:
            return self._fan_out("gen", requests)
        vllm = _import_vllm(self.abbr)
        llm = self.engine()
        tok = llm.get_tokenizer()
        prompts = []
        for req in requests:
            text, templated = render_prompt(tok, req.prompt, self.use_chat_template, req.lmeval_chat)
            prompts.append({"prompt_token_ids": encode(tok, text, templated)})
        params = [vllm.SamplingParams(**self.sampling_kwargs(req)) for req in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [truncate_at_stop(out.outputs[0].text, req.stop) for out, req in zip(outputs, requests)]

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        if self.data_parallel_size > 1:
            return self._fan_out("loglik", requests)
        vllm = _import_vllm(self.abbr)
        llm = self.engine()
        # vLLM wants room for the one token it generates: prompt + max_tokens <= max_model_len.
        max_len = self.max_model_len - 1 if self.max_model_len else None
        rows = loglik_rows(llm.get_tokenizer(), requests, self.use_chat_template, max_len)
        values: list[float] = []
        if rows:
            params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
            outputs = llm.generate([{"prompt_token_ids": r.ids} for r in rows], params, use_tqdm=False)
            for row, out in zip(rows, outputs):
                per_pos = out.prompt_logprobs  # position 0 is None: nothing predicts it
                scored = range(len(row.ids) - row.n, len(row.ids))
                values.append(float(sum(per_pos[j][row.ids[j]].logprob for j in scored)))
        return loglik_scores(requests, rows, values)
