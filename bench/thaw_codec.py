"""What zstd chunks cost thaw's cache loads: the same model, zstd chunks vs raw chunks.

    python bench/thaw_codec.py [--size-mb 1024] [--trials 5] [--data-dir bench/.data]

Pushes the bench model twice to local thaw stores — once as thaw pushes it
(zstd where it saves >= ``codec.MIN_SAVING``), once with compression off
(``MIN_SAVING`` raised to 1.0 for that push only) — fills a disk cache from
each, then loads from each cache in fresh processes, interleaved, warm and
cold, and prints median wall and CPU seconds. A diagnosis for the loader, not
a row of ``bench/load.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import files_under, run_fresh_process
from bench._model import ensure_model
from bench._pagecache import drop_page_cache, warm_page_cache
from bench._thaw import push_model

TRIAL_MODULE = "bench._load_methods"


def _push_raw(model_dir: str, store: dict[str, Any]) -> None:
    from snapshotter import codec

    saved = codec.MIN_SAVING
    codec.MIN_SAVING = 1.0  # no zstd frame can save 100%: every chunk is stored raw
    try:
        push_model(model_dir, store)
    finally:
        codec.MIN_SAVING = saved


def _trial(spec: dict[str, Any], temperature: str) -> dict[str, Any]:
    files = files_under([Path(spec["cache_dir"])])
    if temperature == "warm":
        warm_page_cache(files)
    else:
        drop_page_cache(files)
    result = run_fresh_process(TRIAL_MODULE, spec).result
    if not result["checksum_ok"]:
        raise RuntimeError(f"thaw returned wrong bytes from {spec['cache_dir']}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/thaw_codec.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    a = p.parse_args(argv)
    model = ensure_model(a.data_dir, a.size_mb)
    base = {"method": "thaw", "device": "cpu", "expected_checksum": model.checksum}
    specs: dict[str, dict[str, Any]] = {}
    for codec_name in ("zstd", "raw"):
        root = a.data_dir / f"codec-{codec_name}-{model.checksum:016x}"
        store = {"url": str(root / "store"), "endpoint_url": None}
        (_push_raw if codec_name == "raw" else push_model)(model.directory, store)
        specs[codec_name] = {**base, "store": store, "cache_dir": str(root / "cache")}
        run_fresh_process(TRIAL_MODULE, specs[codec_name])  # fill the cache
    for temperature in ("warm", "cold"):
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
        for _ in range(a.trials):
            for name, spec in specs.items():
                results[name].append(_trial(spec, temperature))
        for name, rs in results.items():
            wall = statistics.median(r["load_s"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            print(f"{temperature:5} {name:5} median wall {wall:6.2f} s   median CPU {cpu:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
