"""Image start-up benchmark: lazy FUSE mount against pull-and-extract, in one run.

    python bench/image.py [--size-mb 1024] [--trials 3] [--quick] [--json PATH|-]
                          [--data-dir bench/.data/image]

The image: Debian bookworm minbase plus ``size_mb`` of files start-up never
reads (``bench._image_setup``). Start-up is a shell that lists the installed
packages and prints ``ready``: the first output. Rows, interleaved per trial:

    pull+extract   fetch every blob of the image from the store into
                   ``docker load`` (the engine extracts it), then ``docker run``
                   until ``ready``; the image is removed before each trial
    lazy           mount the image lazily (empty chunk cache, no profile) and
                   run the container over it until ``ready``
    lazy+profile   the same, with the profile the previous start recorded:
                   those files are prefetched while the container boots

Measured per trial: seconds to first output, and bytes fetched from the store
before it (framed chunk bytes for lazy rows). ``--json`` prints one object
with ``bytes_fraction`` (lazy+profile bytes / pull bytes) and ``speedup``
(pull seconds / lazy+profile seconds), medians over trials. Targets: at most
25% of the bytes, at least 3x faster.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from bench._common import REPO_ROOT, write_json
from bench._image_setup import BenchImage, ensure_bench_image, fetch_into
from snapshotter.config import StoreConfig
from snapshotter.images import resolve_image
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from worker.child_protocol import ContainerSpec, StoreSpec
from worker.runtimes.docker import DockerConfig, DockerRuntime

STARTUP = "dpkg-query -W >/dev/null && echo ready"
READY = b"ready"
FIRST_OUTPUT_TIMEOUT_S = 300.0
ROWS = ("pull+extract", "lazy", "lazy+profile")


@dataclass(frozen=True)
class Trial:
    row: str
    seconds: float
    fetched_bytes: int
    files_read: int = 0


def pull_and_extract(registry: Registry, image: BenchImage) -> Trial:
    subprocess.run(["docker", "rmi", "-f", image.tag], capture_output=True, check=False)
    t0 = time.perf_counter()
    with subprocess.Popen(
        ["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    ) as load:
        assert load.stdin is not None
        fetched = fetch_into(registry, image.pull_keys, load.stdin)
        load.stdin.close()
    if load.returncode:
        raise RuntimeError(f"docker load failed with code {load.returncode}")
    cmd = ["docker", "run", "--rm", "--network", "none", image.tag, "/bin/sh", "-c", STARTUP]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE) as run:
        assert run.stdout is not None
        _await_line(run.stdout, time.monotonic() + FIRST_OUTPUT_TIMEOUT_S)
        seconds = time.perf_counter() - t0
    return Trial("pull+extract", seconds, fetched)


def lazy_start(store: StoreConfig, image: BenchImage, work: Path, *, profile: bool) -> Trial:
    registry = Registry(open_store(store))
    digest = resolve_image(registry, image.ref)
    if not profile:
        registry.store.delete(f"profiles/{digest.split(':', 1)[1]}")
    cache = Path(tempfile.mkdtemp(dir=work, prefix="cache-"))
    spec = StoreSpec(url=store.url, cache_dir=str(cache), cache_max_bytes=64 << 30,
                     bundles_dir=str(work / "bundles"))  # fmt: skip
    runtime = DockerRuntime(DockerConfig(store=spec, state_dir=work / "state"))
    try:
        runtime.ensure_root_image(image.ref)  # once per image digest, like image metadata
        t0 = time.perf_counter()
        launched = runtime.launch(ContainerSpec(image=image.ref), ["/bin/sh", "-c", STARTUP])
        try:
            logs = launched.container.logs(stream=True, follow=True)
            _await_chunks(logs, time.monotonic() + FIRST_OUTPUT_TIMEOUT_S)
            seconds = time.perf_counter() - t0
            stats = launched.mount.stats()
            launched.mount.save_profile()  # what the runtime does at the first output
        finally:
            launched.close()
    finally:
        runtime.close()
        shutil.rmtree(cache, ignore_errors=True)
    row = "lazy+profile" if profile else "lazy"
    return Trial(row, seconds, stats.store_bytes, stats.files_read)


def _await_line(stream: Any, deadline: float) -> None:
    for line in stream:
        if READY in line:
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError("the container exited or timed out before printing 'ready'")


def _await_chunks(chunks: Any, deadline: float) -> None:
    seen = b""
    for chunk in chunks:
        seen += chunk
        if READY in seen:
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError("the lazy container exited or timed out before printing 'ready'")


def summarize(trials: list[Trial], image: BenchImage) -> dict[str, Any]:
    med: dict[str, dict[str, float]] = {}
    for row in ROWS:
        mine = [t for t in trials if t.row == row]
        med[row] = {
            "seconds": statistics.median(t.seconds for t in mine),
            "fetched_bytes": statistics.median(t.fetched_bytes for t in mine),
            "files_read": statistics.median(t.files_read for t in mine),
        }
    pull, lazy, warm = med["pull+extract"], med["lazy"], med["lazy+profile"]
    return {
        "image_bytes": image.archive_bytes,
        "image_files": image.files_total,
        "bytes_fraction": warm["fetched_bytes"] / pull["fetched_bytes"],
        "speedup": pull["seconds"] / warm["seconds"],
        "bytes_fraction_no_profile": lazy["fetched_bytes"] / pull["fetched_bytes"],
        "speedup_no_profile": pull["seconds"] / lazy["seconds"],
        "files_read_fraction": warm["files_read"] / image.files_total,
        "rows": med,
        "trials": [t.__dict__ for t in trials],
    }


def render(doc: dict[str, Any], console: Console) -> None:
    table = Table("row", "first output (s)", "fetched (MB)", "files read",
                  title=f"image start-up, {doc['image_bytes'] / 1e6:.0f} MB image")  # fmt: skip
    for row, m in doc["rows"].items():
        files = f"{m['files_read']:.0f}" if row != "pull+extract" else "all (extracted)"
        table.add_row(row, f"{m['seconds']:.2f}", f"{m['fetched_bytes'] / 1e6:.1f}", files)
    console.print(table)
    console.print(
        f"lazy+profile: {doc['bytes_fraction']:.1%} of the bytes (target <= 25%), "
        f"{doc['speedup']:.1f}x faster (target >= 3x); without a profile: "
        f"{doc['bytes_fraction_no_profile']:.1%}, {doc['speedup_no_profile']:.1f}x; "
        f"start-up read {doc['files_read_fraction']:.1%} of the image's files"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="64 MB image, one trial (smoke test)")
    p.add_argument("--json", default=None, help="write results to PATH, or '-' for stdout")
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / "bench" / ".data" / "image")
    args = p.parse_args(argv)
    size_mb, trials = (64, 1) if args.quick else (args.size_mb, args.trials)
    console = Console(stderr=args.json == "-")
    store = StoreConfig(url=str(args.data_dir / "store"))
    registry = Registry(open_store(store))
    console.print(f"setting up a {size_mb} MB image (cached in {args.data_dir}) ...")
    image = ensure_bench_image(args.data_dir, size_mb, registry)
    results: list[Trial] = []
    with tempfile.TemporaryDirectory(dir=args.data_dir, prefix="run-") as tmp:
        for i in range(trials):
            results.append(pull_and_extract(registry, image))
            results.append(lazy_start(store, image, Path(tmp), profile=False))
            results.append(lazy_start(store, image, Path(tmp), profile=True))
            console.print(f"trial {i + 1}/{trials}: " + ", ".join(
                f"{t.row} {t.seconds:.2f}s" for t in results[-3:]))  # fmt: skip
    doc = summarize(results, image)
    render(doc, console)
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
