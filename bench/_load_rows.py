"""The rows of the loader bench and the ratios it reports: data and pure functions.

A row is one (method, temperature) pair. Temperature says what state the
bytes start in before each trial:

* ``cold``  — the files the row reads were evicted from the page cache;
* ``warm``  — those files were read once just before, so they are in RAM;
* ``memory``— the source is already in process memory (ceilings);
* ``s3``    — the source is the S3 server on loopback; the local side
  (download dir, thaw's disk cache) starts empty every trial.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

COLD, WARM, MEMORY, S3 = "cold", "warm", "memory", "s3"


@dataclass(frozen=True)
class Row:
    family: str  # what --methods selects, e.g. "thaw"
    temperature: str
    method: str  # the trial function in bench._load_methods
    label: str
    files: str  # which files cold/warm applies to: model | tensorizer | thaw_cache |
    # thaw_store | none
    device: str = "cpu"
    needs_gpu: bool = False
    needs_module: str | None = None

    @property
    def key(self) -> str:
        return f"{self.family}/{self.temperature}"


def _both(family: str, method: str, label: str, files: str, **kw: object) -> list[Row]:
    return [Row(family, t, method, label, files, **kw) for t in (COLD, WARM)]  # type: ignore[arg-type]


CATALOG: tuple[Row, ...] = (
    *_both("read", "read", "raw read ceiling (parallel preadv)", "model"),
    Row("memcpy", MEMORY, "memcpy", "memcpy ceiling (RAM to fresh RAM)", "none"),
    *_both("safetensors", "safetensors", "safetensors load_file + clone", "model"),
    *_both("mmap", "mmap", "safetensors mmap, every page touched", "model"),
    *_both("runai", "runai", "Run:ai Model Streamer", "model", needs_module="runai_model_streamer"),
    *_both("tensorizer", "tensorizer", "tensorizer TensorDeserializer", "tensorizer",
           needs_module="tensorizer"),
    Row("thaw-store", COLD, "thaw", "thaw from the local store, empty cache", "thaw_store"),
    *_both("thaw", "thaw", "thaw from disk cache", "thaw_cache"),
    Row("thaw-ram", MEMORY, "thaw", "thaw from host-RAM tier (tmpfs)", "none"),
    Row("boto3-s3", S3, "boto3", "boto3 download_file + load_file", "none"),
    Row("thaw-s3", S3, "thaw", "thaw from S3, empty cache", "none"),
    Row("h2d", MEMORY, "h2d", "pinned host-to-device ceiling", "none", "cuda", True),
    Row("safetensors-cuda", WARM, "safetensors", "safetensors load_file(device=cuda)", "model",
        "cuda", True),
    Row("fastsafetensors", WARM, "fastsafetensors", "fastsafetensors (no GDS)", "model", "cuda",
        True, "fastsafetensors"),
    Row("sllm-store", WARM, "sllm", "ServerlessLLM sllm-store", "none", "cuda", True, "sllm_store"),
    Row("runai-cuda", WARM, "runai", "Run:ai Model Streamer to cuda", "model", "cuda", True,
        "runai_model_streamer"),
    Row("thaw-cuda", WARM, "thaw", "thaw from disk cache to cuda", "thaw_cache", "cuda", True),
    Row("thaw-ram-cuda", MEMORY, "thaw", "thaw from host-RAM tier to cuda (pinned ahead)", "none",
        "cuda", True),
    Row("thaw-ram-cuda-unpinned", MEMORY, "thaw", "thaw from RAM tier to cuda, pinned by the load",
        "none", "cuda", True),
)  # fmt: skip


def select_rows(catalog: tuple[Row, ...], methods: list[str] | None) -> list[Row]:
    """Rows whose family or key is named in ``methods`` (all when None), catalog order.

    Raises ``ValueError`` naming any unknown entry and listing the valid ones.
    """
    if not methods:
        return list(catalog)
    valid = {r.family for r in catalog} | {r.key for r in catalog}
    unknown = [m for m in methods if m not in valid]
    if unknown:
        raise ValueError(
            f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(sorted(valid))}"
        )
    wanted = set(methods)
    return [r for r in catalog if r.family in wanted or r.key in wanted]


def skip_reason(row: Row, *, has_cuda: bool) -> str | None:
    """Why this row cannot run here (None when it can)."""
    if row.needs_gpu and not has_cuda:
        return "no CUDA device"
    if row.needs_module and importlib.util.find_spec(row.needs_module) is None:
        return f"{row.needs_module} is not installed"
    if row.method == "sllm":
        return "sllm-store needs its own server and format; not automated by this bench"
    return None


@dataclass(frozen=True)
class Ratio:
    """``numerator`` over ``denominator`` throughput (GB/s); met when >= ``target``."""

    name: str
    numerator: str  # row key
    denominator: str  # row key
    target: float


RATIOS: tuple[Ratio, ...] = (
    Ratio("thaw warm vs Run:ai warm", "thaw/warm", "runai/warm", 3.0),
    Ratio("thaw warm vs tensorizer warm", "thaw/warm", "tensorizer/warm", 3.0),
    Ratio("thaw RAM tier vs Run:ai warm", "thaw-ram/memory", "runai/warm", 3.0),
    Ratio("thaw RAM tier vs tensorizer warm", "thaw-ram/memory", "tensorizer/warm", 3.0),
    Ratio("thaw cold vs raw read cold", "thaw/cold", "read/cold", 0.9),
    Ratio("thaw S3 vs boto3 + load_file", "thaw-s3/s3", "boto3-s3/s3", 1.5),
    Ratio("thaw warm vs safetensors warm", "thaw/warm", "safetensors/warm", 1.0),
    Ratio("thaw warm vs safetensors mmap warm", "thaw/warm", "mmap/warm", 1.0),
    Ratio("thaw from store vs safetensors cold", "thaw-store/cold", "safetensors/cold", 1.0),
    Ratio("thaw RAM tier to cuda vs pinned ceiling", "thaw-ram-cuda/memory", "h2d/memory", 0.8),
    Ratio(
        "thaw RAM tier to cuda vs safetensors to cuda",
        "thaw-ram-cuda/memory",
        "safetensors-cuda/warm",
        1.0,
    ),
    Ratio(
        "thaw RAM tier to cuda vs fastsafetensors",
        "thaw-ram-cuda/memory",
        "fastsafetensors/warm",
        1.0,
    ),
    Ratio(
        "thaw RAM tier to cuda vs Run:ai to cuda", "thaw-ram-cuda/memory", "runai-cuda/warm", 1.0
    ),
    Ratio(
        "thaw RAM tier to cuda, pinned ahead vs pinned by the load",
        "thaw-ram-cuda/memory",
        "thaw-ram-cuda-unpinned/memory",
        1.0,
    ),
    Ratio(
        "thaw disk cache to cuda vs safetensors to cuda",
        "thaw-cuda/warm",
        "safetensors-cuda/warm",
        1.0,
    ),
)


def ratio_value(gbps: dict[str, float], ratio: Ratio) -> float | None:
    """The ratio from per-row throughputs; None when a row is missing or zero. Pure."""
    num, den = gbps.get(ratio.numerator), gbps.get(ratio.denominator)
    if not num or not den:
        return None
    return num / den
