"""Which files of a Hugging Face repository a node downloads: the files a runtime loads, never the
whole listing. A pure function of the listing; the job applies it before anything is fetched.

A model does not name its runtime (one model may serve vLLM and TensorRT-LLM deployments), so
the selection is the union of what Fabric's runtimes load from a model directory:

  metadata   config, tokenizer, generation and pooling files: ``*.json``, ``*.txt``, ``*.model``
             (SentencePiece), ``*.tiktoken``, ``*.jinja``, at any depth (TEI's sentence-transformers
             repositories keep ``1_Pooling/config.json``)
  weights    ``*.safetensors`` (vLLM, TensorRT-LLM's PyTorch backend, TEI); ``*.gguf`` (llama.cpp);
             ``*.bin`` only when the repository has no safetensors (TEI and vLLM still load such
             repositories); Triton's model repository files (``config.pbtxt``, ``*.onnx``,
             ``*.plan``)
  skipped    everything else (README, images, ``.gitattributes``, code); and, when the repository has
             safetensors, ``original/`` (Meta's consolidated checkpoints), ``*.bin`` copies of the
             weights and any pickle file (``.pt``, ``.pth``, ``.pkl``, ``.pickle``)

A pickle file that survives the selection (a repository whose only weights are pickles) is
kept, so that the scan refuses it with its own message naming the file. The scan judges the
selected files; the skipped ones are neither downloaded nor hashed. The patterns are matched by
huggingface_hub's ``filter_repo_objects``, the function ``snapshot_download`` applies its
``allow_patterns``/``ignore_patterns`` with, so a name matches here as it would there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from huggingface_hub.utils import filter_repo_objects

from agent.models.checks import PICKLE_SUFFIXES

METADATA_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
WEIGHT_PATTERNS = ("*.safetensors", "*.gguf", "*.pbtxt", "*.onnx", "*.plan")
BIN_PATTERNS = ("*.bin",)
PICKLE_PATTERNS = tuple(f"*{s}" for s in PICKLE_SUFFIXES)
# With safetensors present these are copies (or training leftovers) the runtimes never load.
SUPERSEDED_PATTERNS = ("original/*", *BIN_PATTERNS, *PICKLE_PATTERNS)


@dataclass(frozen=True)
class Selection:
    keep: tuple[str, ...]
    skipped: tuple[str, ...]
    allow_patterns: tuple[str, ...]
    ignore_patterns: tuple[str, ...]


def select_files(names: Iterable[str]) -> Selection:
    """The files of a listing to download (see the module docstring), in listing order."""
    names = list(names)
    has_safetensors = any(n.endswith(".safetensors") and not n.startswith("original/") for n in names)
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    if has_safetensors:
        allow = (*METADATA_PATTERNS, *WEIGHT_PATTERNS)
        ignore = SUPERSEDED_PATTERNS
    else:
        # Pickles stay selected so the scan refuses them by name (a pickle-only repository).
        allow = (*METADATA_PATTERNS, *WEIGHT_PATTERNS, *BIN_PATTERNS, *PICKLE_PATTERNS)
        ignore = ()
    keep = tuple(filter_repo_objects(names, allow_patterns=list(allow), ignore_patterns=list(ignore) or None))
    chosen = set(keep)
    return Selection(keep, tuple(n for n in names if n not in chosen), allow, ignore)
