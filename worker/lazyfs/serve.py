"""The mount process: ``python -m worker.lazyfs --config JSON``.

It builds the image's tree, mounts it read-only with pyfuse3 (one mount per
process: pyfuse3 keeps one session per process), starts fetching the
recorded prefetch profile, answers control requests on a Unix socket (see
``worker.lazyfs.config``), and serves FUSE requests until SIGTERM or SIGINT,
when it unmounts (lazily, so a still-running container cannot block it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pyfuse3
import trio

from snapshotter.cache import DiskCache
from snapshotter.images import get_image, image_layers, merge_layers
from snapshotter.registry import Registry
from snapshotter.source import ChunkSource
from snapshotter.stores import open_store
from worker.frames import FrameError, FrameSocket
from worker.lazyfs.config import MountConfig, MountStats
from worker.lazyfs.content import AccessRecorder, ContentReader, Prefetcher
from worker.lazyfs.fs import LazyFs
from worker.lazyfs.tree import Tree, build_tree

MOUNT_OPTIONS = ("fsname=thaw-lazyfs", "subtype=thaw", "ro", "allow_other")


class MountService:
    """Everything one mount holds, and the control requests it answers."""

    def __init__(self, config: MountConfig) -> None:
        self.config = config
        self.registry = Registry(open_store(config.store_config()))
        image = get_image(self.registry, config.image_digest)
        merged = merge_layers(image_layers(self.registry, image))
        self.tree: Tree = build_tree(
            merged, extra_dirs=config.extra_dirs, extra_files=config.extra_files
        )
        self.source = ChunkSource(self.registry, DiskCache(config.cache_config()))
        self.reader = ContentReader(self.source, config.memory_bytes)
        self.recorder = AccessRecorder(recording=config.record_profile)
        self.prefetcher = Prefetcher(self.reader, config.prefetch_threads)
        self.profile: list[str] = []

    def start_prefetch(self) -> None:
        """Fetch the recorded profile's files, in order, while the container boots."""
        if not self.config.prefetch:
            return
        self.profile = self.registry.get_profile(self.config.image_digest) or []
        nodes = (self.tree.node(p) for p in self.profile)
        self.prefetcher.submit(n.entry for n in nodes if n is not None and n.is_file)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "stats":
            return {"ok": True, "stats": self.stats().model_dump()}
        if op == "save_profile":
            order = self.recorder.freeze()
            self.registry.put_profile(self.config.image_digest, order)
            return {"ok": True, "order": order}
        if op == "wait_prefetch":
            deadline = time.monotonic() + float(request.get("timeout_s", 30))
            while not self.prefetcher.done and time.monotonic() < deadline:
                time.sleep(0.01)
            return {"ok": True, "done": self.prefetcher.done}
        return {"ok": False, "error": f"unknown control op {op!r}"}

    def stats(self) -> MountStats:
        c = self.source.counters()
        r = self.reader.counters
        return MountStats(
            store_gets=c.store_gets,
            store_bytes=c.store_bytes,
            cache_hits=c.cache_hits,
            cache_hit_bytes=c.cache_hit_bytes,
            files_read=self.recorder.files_read,
            bytes_served=r.bytes_served,
            chunks_fetched=r.chunks_fetched,
            profile_length=len(self.profile),
            prefetch_started=self.prefetcher.started(),
            prefetch_done=self.prefetcher.done,
            prefetch_errors=self.prefetcher.errors(),
        )


def serve_control(path: str, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> socket.socket:
    """Answer control requests on a daemon thread; returns the listening socket."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the mount is going away
            threading.Thread(target=_answer, args=(conn, handle), daemon=True).start()

    threading.Thread(target=loop, daemon=True, name="thaw-lazyfs-control").start()
    return listener


def _answer(conn: socket.socket, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    frames = FrameSocket(conn)
    try:
        request = frames.recv()
        try:
            reply = handle(request)
        except Exception as exc:  # a failed request must not take the mount down
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        frames.send(reply)
    except (FrameError, OSError):
        pass  # the asker went away
    finally:
        frames.close()


async def _run_until_signal() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pyfuse3.main)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                pyfuse3.terminate()
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.lazyfs")
    parser.add_argument("--config", required=True, help="MountConfig as JSON")
    args = parser.parse_args(argv)
    config = MountConfig.model_validate_json(args.config)
    service = MountService(config)
    ops = LazyFs(service.tree, service.reader, service.recorder)
    pyfuse3.init(ops, config.mountpoint, set(pyfuse3.default_options) | set(MOUNT_OPTIONS))
    listener = None
    try:
        service.start_prefetch()
        listener = serve_control(config.control_socket, service.handle)
        trio.run(_run_until_signal)
    finally:
        if listener is not None:
            listener.close()
        service.prefetcher.close()
        pyfuse3.close(unmount=True)
    return 0
