"""Dequantising a GGUF checkpoint into a Hugging Face folder, reading the file once.

transformers reads a GGUF three times to build a model and its tokenizer (the tokenizer, the
config, then the weights), and each time ``gguf.GGUFReader`` parses every metadata field (a
49k-token vocabulary is ~300k small reads); then, mapping tensor names, it builds
``gguf.TensorNameMap`` once per module of the model (~400 times for SmolLM2).  Those parses
were most of the ~20 s a first load of SmolLM2 took on two cores, the dequantisation itself a
few seconds.  :func:`convert_gguf` runs the same transformers calls with both memoised for the
length of one conversion: the reader is read-only (a memory map) and the name map is built
from ``(arch, n_blocks)`` alone, so sharing them changes nothing in what is built.

torch, transformers and gguf are imported inside the functions only.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)
#: one conversion at a time in a process: the memoisation swaps module attributes of ``gguf``
_PATCH_LOCK = threading.Lock()


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader`` of one path (read-only) is built once and shared,
    and ``gguf.get_tensor_name_map`` is memoised; both are restored after.  transformers
    imports both names from ``gguf`` at each call, so it picks the memoised ones up."""
    import gguf

    with _PATCH_LOCK:
        reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], Any] = {}

        def shared_reader(path: Any, mode: Any = "r") -> Any:
            if mode != "r":  # a writable map is never shared
                return reader_cls(path, mode)
            key = (os.path.realpath(os.fspath(path)), mode)
            if key not in readers:
                readers[key] = reader_cls(path, mode)
            return readers[key]

        gguf.GGUFReader = shared_reader  # type: ignore[misc,assignment]
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader = reader_cls  # type: ignore[misc]
            gguf.get_tensor_name_map = name_map
            readers.clear()


def convert_gguf(abbr: str, gguf_path: str, out_dir: str) -> bool:
    """Dequantise ``gguf_path`` into ``out_dir`` (model and tokenizer, float32), reading the
    file once (:func:`gguf_read_once`)."""
    import torch
    import transformers

    folder, name = os.path.split(gguf_path)
    log.info("%s: converting %s (once; later loads use the weights cache)", abbr, gguf_path)
    with gguf_read_once():
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers refuses to save a model that still says it is GGUF-quantised.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return True
