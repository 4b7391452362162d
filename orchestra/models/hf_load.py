"""Loading a causal LM with transformers: device, dtype, threads, weights and tokenizer.

:class:`~orchestra.models.hf.HFCausalLM` calls :func:`load_causal_lm` once per worker and
keeps the :class:`LoadedLM` it returns.  A GGUF is dequantised once per machine and kept in
the weights cache (:mod:`orchestra.models.weights_cache`).  torch and transformers are
imported inside the functions only.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from orchestra.errors import ModelError
from orchestra.models import weights_cache
from orchestra.models.gguf_convert import convert_gguf
from orchestra.models.hf_common import ModelSource, auto_num_threads
from orchestra.privdir import private_dir, temp_folder

log = logging.getLogger(__name__)
#: errors that mean "this cache folder cannot be written", not "the weights are bad"
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.ENOENT, errno.ENOTDIR}


@dataclass
class LoadedLM:
    """A causal LM and its tokenizer in memory, and what running a batch on them needs."""

    model: Any
    tokenizer: Any  # left padding; pad token set (EOS when the tokenizer has none)
    torch: Any  # the torch module
    input_device: Any  # where input tensors go
    threads: int | None  # torch CPU threads of the thread that runs a batch (None: torch's)
    #: How the weights were loaded: 'converted' (GGUF dequantised now and cached), 'cache'
    #: (an earlier conversion), 'gguf' (converted, cache not writable), 'folder' or 'hub'.
    loaded_from: str
    weights_path: str | None  # the folder the weights were read from (the cache entry for a GGUF)

    def apply_threads(self) -> None:
        """Set torch's thread count on the calling thread.

        torch's intra-op thread count is kept per OS thread by OpenMP, and batches run on an
        executor thread, so it is set again where the work happens.
        """
        if self.threads is not None and self.torch.get_num_threads() != self.threads:
            self.torch.set_num_threads(self.threads)

    def max_len(self, explicit: int | None) -> int:
        """The longest input: ``explicit``, else the model's ``max_position_embeddings``."""
        if explicit:
            return explicit
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if n else 2048

    def left_pad(self, seqs: list[list[int]]) -> tuple[Any, Any, Any]:
        """Left-padded ids, attention mask and position ids for a list of token lists."""
        torch = self.torch
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.input_device
        return ids.to(dev), mask.to(dev), positions.to(dev)


def private_compile_cache() -> None:
    """Point torch.compile's cache at ``<tmp>/orchestra-inductor-<uid>``, a private folder,
    unless the user chose one (``TORCHINDUCTOR_CACHE_DIR``).

    transformers compiles some attention kernels (flex_attention) with ``torch.compile``, whose
    default cache is ``<tmp>/torchinductor_<user>``: a fixed name in the shared temporary folder,
    which torch creates with the umask's bits and uses whoever owns it.  It holds compiled
    shared libraries and pickled graphs that torch loads, so another local user who made that
    folder first could run code in this process.  Ours is created 0700 and refused when it is
    not private (:func:`~orchestra.privdir.private_dir`; the CLI checks it before a run).

    torch writes its default back into the environment the first time anything asks for the
    cache folder (importing ``evaluate``, which lm-eval does, is enough), so a value equal to
    torch's default counts as unset.  Called once torch is imported."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = private_dir(temp_folder("inductor"))


def load_causal_lm(
    abbr: str,
    path: str,
    source: ModelSource,
    *,
    torch_dtype: str,
    device: str,
    device_map: str | dict | None,
    num_threads: int | None,
    cache_dir: str | None,
    tokenizer_path: str | None,
    tokenizer_kwargs: dict[str, Any],
    model_kwargs: dict[str, Any],
    trust_remote_code: bool,
) -> LoadedLM:
    """Load the model ``path`` (resolved to ``source``) as HFCausalLM's arguments of the same
    names say; :class:`ModelError` (one line) when that is impossible."""
    where = f"model {abbr}"
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ModelError(
            f"{where}: HFCausalLM needs torch and transformers ({exc.name} is missing); "
            "pip install torch transformers accelerate"
        ) from None
    private_compile_cache()
    uses_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"{where}: device='cuda' but torch sees no CUDA device")
    threads = auto_num_threads(num_threads, uses_cuda)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    dtype = _dtype(torch, torch_dtype, uses_cuda)

    folder, loaded_from = _weights_folder(abbr, source, cache_dir, transformers)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code, **model_kwargs}
    if device_map is not None:
        kwargs["device_map"] = device_map
    elif uses_cuda and folder is not None and _places_on_load(transformers):
        # The weights go from the files straight to the GPU: loading on the CPU first and
        # moving them after cost 5 s of a 1B model's 9 s start-up (docs/benchmarks.md).
        kwargs["device_map"] = "cuda"
    model: Any
    try:
        if folder is None:  # GGUF without a usable cache: convert in memory
            gguf_dir, name = os.path.split(source.location)
            model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name, **kwargs)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        tok_kwargs = {"trust_remote_code": trust_remote_code, **tokenizer_kwargs}
        tokenizer = _load_tokenizer(transformers, source, folder, tokenizer_path, tok_kwargs)
    except (OSError, ValueError, _weights_error()) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{where}: cannot load {path}: {first}") from exc
    if "device_map" not in kwargs:
        model.to("cuda" if uses_cuda else "cpu")
    model.eval()
    input_device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("%s: loaded %s (%s) on %s as %s", abbr, path, loaded_from, input_device, dtype)
    return LoadedLM(model, tokenizer, torch, input_device, threads, loaded_from, folder)


def _places_on_load(transformers: Any) -> bool:
    """Whether ``from_pretrained(device_map='cuda')`` loads onto one GPU without accelerate's
    hooks: transformers 5 does that by itself; 4.x needs accelerate for any ``device_map``."""
    major = transformers.__version__.split(".", 1)[0]
    return (major.isdigit() and int(major) >= 5) or importlib.util.find_spec("accelerate") is not None


def _weights_error() -> type[Exception]:
    """What safetensors raises for a weights file it cannot read (cut short, not safetensors)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - transformers requires safetensors
        return OSError
    return SafetensorError


def _dtype(torch: Any, torch_dtype: str, uses_cuda: bool) -> Any:
    if torch_dtype != "auto":
        return getattr(torch, torch_dtype)
    if not uses_cuda:
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _weights_folder(abbr: str, source: ModelSource, cache_dir: str | None, transformers: Any) -> tuple[str | None, str]:
    """The folder to load from (None: convert the GGUF in memory), and how it came to be."""
    if source.kind in ("folder", "hub"):
        return source.location, source.kind
    gguf = source.location
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"model {abbr}: loading {gguf} needs the gguf package; pip install gguf")
    manifest = {"gguf": gguf, "transformers": transformers.__version__}
    fallback = temp_folder("weights")
    for root in (cache_dir, fallback):
        if root is fallback:  # a shared place: used only as a private folder of ours
            root = weights_cache.fallback_dir()
        entry = weights_cache.entry_for(gguf, root, extra=transformers.__version__)
        try:
            folder, converted = weights_cache.get_or_convert(
                entry, lambda out: convert_gguf(abbr, gguf, out), manifest)
            return folder, "converted" if converted else "cache"
        except OSError as exc:  # read-only, full or forbidden: the cache is a speed-up, not a need
            if exc.errno not in _UNWRITABLE:
                raise
            nxt = f"the temporary folder {fallback}" if root is cache_dir else "memory (nothing is kept)"
            log.warning("%s: weights cache %s cannot be written (%s); using %s", abbr, entry.root,
                        exc.strerror or exc, nxt)
            print(f"warning: model {abbr}: weights cache {entry.root} cannot be written ({exc.strerror or exc}); "
                  f"using {nxt}", file=sys.stderr, flush=True)
    return None, "gguf"


def _load_tokenizer(
    transformers: Any, source: ModelSource, folder: str | None, tokenizer_path: str | None, kwargs: dict[str, Any]
) -> Any:
    if tokenizer_path:
        return transformers.AutoTokenizer.from_pretrained(tokenizer_path, **kwargs)
    if folder is None:
        gguf_dir, name = os.path.split(source.location)
        return transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name, **kwargs)
    return transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
