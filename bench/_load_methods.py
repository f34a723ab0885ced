"""One load of one method, run in a fresh process: ``python -m bench._load_methods SPEC``.

Every method ends its timed region holding every byte of the model in memory
it owns (CPU) or on the device (CUDA): eager loaders (Run:ai, tensorizer,
thaw) already do; the lazy one (``safetensors.load_file``, which mmaps)
is followed by ``clone()`` of every tensor inside the timed region. The
``mmap`` row is the exception by design: ``load_file`` and one read of every
page of every tensor, no copy (what a server that serves from the mapping pays). After the
clock stops the child checksums every tensor it holds and reports whether
the checksum equals the model's, so a method that skipped bytes or loaded
wrong ones is caught, not timed.

The timed region starts after imports and (for CUDA) device initialization,
and ends after the last byte is in place (``torch.cuda.synchronize``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench._common import emit_result
from bench._model import tensor_checksum

# The raw-read ceiling reads with the parallelism and block size of thaw's own fetch
# pool (16 threads, 8 MiB chunks): a ceiling must not be weaker than the loaders' I/O.
READ_THREADS = 16
READ_BLOCK_BYTES = 8 << 20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Span:
    """One timed region: wall seconds, and CPU seconds of all this process's threads."""

    load_s: float
    cpu_s: float


class Clock:
    """Starts at construction; ``stop()`` gives the ``Span`` since then."""

    def __init__(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def stop(self) -> Span:
        return Span(time.perf_counter() - self._wall0, time.process_time() - self._cpu0)


@dataclass
class Loaded:
    """What a method produced: its tensors (None for ceilings) and extra facts to report."""

    span: Span
    tensors: dict[str, torch.Tensor] | None
    extra: dict[str, Any] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # objects the tensors' memory depends on


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"file ended early at byte {offset + done}")
        done += n


def _read_files(paths: list[str]) -> list[torch.Tensor]:
    """Each file's bytes in a fresh uint8 tensor, read by a pool of ``READ_THREADS``."""
    bufs = [torch.empty(os.path.getsize(p), dtype=torch.uint8) for p in paths]
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        jobs = [
            (fd, buf.numpy().data[off : off + READ_BLOCK_BYTES], off)
            for fd, buf in zip(fds, bufs, strict=True)
            for off in range(0, buf.numel(), READ_BLOCK_BYTES)
        ]
        with ThreadPoolExecutor(READ_THREADS) as pool:
            list(pool.map(lambda j: _pread_into(*j), jobs))
    finally:
        for fd in fds:
            os.close(fd)
    return bufs


def method_read(spec: dict[str, Any]) -> Loaded:
    """Ceiling: the files' bytes into fresh memory with parallel ``preadv``, nothing else."""
    clock = Clock()
    bufs = _read_files(spec["files"])
    span = clock.stop()
    return Loaded(span, None, {"bytes": sum(b.numel() for b in bufs)}, keep=bufs)


def method_memcpy(spec: dict[str, Any]) -> Loaded:
    """Ceiling: copy the model's byte count from RAM into fresh memory (``Tensor.copy_``)."""
    n = int(spec["total_bytes"])
    src = torch.ones(n, dtype=torch.uint8)  # ones, not empty: its pages must exist
    clock = Clock()
    dst = torch.empty(n, dtype=torch.uint8)
    dst.copy_(src)
    span = clock.stop()
    return Loaded(span, None, {"bytes": n}, keep=[src, dst])


def method_safetensors(spec: dict[str, Any]) -> Loaded:
    """``safetensors.torch.load_file`` per shard; on the CPU, ``clone()`` forces the mmap read."""
    from safetensors.torch import load_file

    device = spec.get("device", "cpu")
    _warm_device(device)
    clock = Clock()
    out: dict[str, torch.Tensor] = {}
    for path in spec["files"]:
        state = load_file(path, device=device)
        out.update(state if device != "cpu" else {k: v.clone() for k, v in state.items()})
    _sync(device)
    return Loaded(clock.stop(), out)


def method_mmap(spec: dict[str, Any]) -> Loaded:
    """``safetensors.torch.load_file`` per shard (mmap), then one byte of every page read."""
    from safetensors.torch import load_file

    clock = Clock()
    out: dict[str, torch.Tensor] = {}
    touched = 0
    for path in spec["files"]:
        for name, tensor in load_file(path).items():
            u8 = tensor.reshape(-1).view(torch.uint8)
            touched += int(u8[::PAGE_BYTES].sum()) + int(u8[-1:].sum())
            out[name] = tensor
    return Loaded(clock.stop(), out, {"touched_sum": touched})


def method_runai(spec: dict[str, Any]) -> Loaded:
    """Run:ai Model Streamer's ``SafetensorsStreamer`` over all shards (owned tensors);
    to the device, each tensor is copied there as it arrives (as vLLM does with it)."""
    from runai_model_streamer import SafetensorsStreamer

    device = spec.get("device", "cpu")
    _warm_device(device)
    clock = Clock()
    out: dict[str, torch.Tensor] = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(spec["files"], device="cpu")
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.to(device) if device != "cpu" else tensor
    _sync(device)
    return Loaded(clock.stop(), out)


def method_tensorizer(spec: dict[str, Any]) -> Loaded:
    """tensorizer's ``TensorDeserializer`` of the same weights, eager, to the CPU."""
    from tensorizer import TensorDeserializer

    clock = Clock()
    deser = TensorDeserializer(spec["tensorizer_file"], device="cpu", lazy_load=False)
    out = {str(k): v for k, v in deser.items()}
    span = clock.stop()
    return Loaded(span, out, keep=[deser])


def _boto3_client(s3: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=s3["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(max_pool_connections=32),
    )


def method_boto3(spec: dict[str, Any]) -> Loaded:
    """boto3 ``download_file`` of every shard (default TransferConfig), then ``load_file``."""
    from safetensors.torch import load_file

    s3 = spec["s3"]
    dest = Path(spec["scratch_dir"])
    dest.mkdir(parents=True, exist_ok=True)
    client = _boto3_client(s3)
    clock = Clock()
    out: dict[str, torch.Tensor] = {}
    for key in s3["keys"]:
        local = dest / key.rsplit("/", 1)[-1]
        client.download_file(s3["bucket"], key, str(local))
        out.update({k: v.clone() for k, v in load_file(str(local)).items()})
    return Loaded(clock.stop(), out)


def _warm_device(device: str) -> None:
    """Create the CUDA context before the clock starts; a pool replica has one already."""
    if device.startswith("cuda"):
        torch.zeros(1, device=device)
        torch.cuda.synchronize()


def method_h2d(spec: dict[str, Any]) -> Loaded:
    """Ceiling: one pinned host buffer of the model's size copied to the device."""
    n = int(spec["total_bytes"])
    _warm_device("cuda")
    src = torch.ones(n, dtype=torch.uint8).pin_memory()
    clock = Clock()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return Loaded(clock.stop(), None, {"bytes": n}, keep=[src, dst])


def method_fastsafetensors(spec: dict[str, Any]) -> Loaded:
    """fastsafetensors ``SafeTensorsFileLoader`` (no GDS) to the device."""
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    _warm_device("cuda")
    clock = Clock()
    loader = SafeTensorsFileLoader(SingleGroup(), torch.device("cuda:0"), nogds=True)
    loader.add_filenames({0: spec["files"]})
    fb = loader.copy_files_to_device()
    out = {k: fb.get_tensor(k) for k in list(fb.key_to_rank_lidx.keys())}
    torch.cuda.synchronize()
    return Loaded(clock.stop(), out, keep=[fb, loader])


def method_thaw(spec: dict[str, Any]) -> Loaded:
    """thaw's ``Snapshotter.load`` from its disk cache, or from S3 through an empty cache."""
    from bench._thaw import BENCH_REF, open_snapshotter, report_dict

    device = spec.get("device", "cpu")
    _warm_device(device)
    snap = open_snapshotter(spec)
    if device.startswith("cuda"):
        # A pool replica allocates its staging buffers ahead, and pins the RAM tier's pages.
        snap.prewarm(device)
        snap.pinned_bytes(wait_s=60.0)  # as in a pool process that waited for a call
    clock = Clock()
    tensors = snap.load(spec.get("ref", BENCH_REF), device)
    _sync(device)
    span = clock.stop()
    return Loaded(span, dict(tensors), {"thaw_report": report_dict(tensors.report)})


METHODS: dict[str, Callable[[dict[str, Any]], Loaded]] = {
    "read": method_read,
    "memcpy": method_memcpy,
    "safetensors": method_safetensors,
    "mmap": method_mmap,
    "runai": method_runai,
    "tensorizer": method_tensorizer,
    "boto3": method_boto3,
    "h2d": method_h2d,
    "fastsafetensors": method_fastsafetensors,
    "thaw": method_thaw,
}


def _rss_anon_bytes() -> int:
    """Anonymous resident memory of this process (what owned tensors occupy)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Load once as ``spec`` says; the result dict the parent records."""
    fn = METHODS[spec["method"]]
    rss0 = _rss_anon_bytes()
    loaded = fn(spec)
    rss_delta = _rss_anon_bytes() - rss0
    result: dict[str, Any] = {
        "load_s": loaded.span.load_s,
        "cpu_s": loaded.span.cpu_s,
        "rss_anon_delta_bytes": rss_delta,
    }
    result.update(loaded.extra)
    if loaded.tensors is not None:
        result["n_tensors"] = len(loaded.tensors)
        result["bytes"] = sum(t.numel() * t.element_size() for t in loaded.tensors.values())
        result["checksum_ok"] = tensor_checksum(loaded.tensors) == int(spec["expected_checksum"])
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench._load_methods '<spec JSON>'", file=sys.stderr)
        return 2
    emit_result(run(json.loads(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
