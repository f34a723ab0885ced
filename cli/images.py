"""``thaw images``: push local container images into the store as lazily mountable chunks.

``thaw images push IMAGE[:TAG]`` streams ``docker save IMAGE`` from the local
engine (or ``--archive FILE``, a saved tar) through the layer reader: each
layer becomes a per-file table of contents plus chunks, deduplicated against
everything already in the store. Exit codes as ``thaw models``: 2 when the
image is refused (the offending entry is named) or the engine fails.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from cli.models import EXIT_ERROR, StoreOption, snapshotter_errors
from cli.progress import human_bytes, transfer_bar
from cli.store import open_registry
from control_plane.settings import Settings
from snapshotter.images import ImagePushResult, push_image_archive
from snapshotter.layers import LayerProgress
from snapshotter.registry import Registry

app = typer.Typer(no_args_is_help=True, help="Push container images as lazily mountable chunks.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class EngineError(Exception):
    """The local Docker engine could not produce the image."""


class _GeneratorReader(io.RawIOBase):
    """A read-only stream over an iterator of byte strings (the SDK's save stream)."""

    def __init__(self, parts: Iterator[bytes]) -> None:
        self._parts = parts
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._pending:
            try:
                self._pending = next(self._parts)
            except StopIteration:
                return 0
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


@contextmanager
def docker_save(image: str) -> Iterator[tuple[IO[bytes], int]]:
    """``docker save IMAGE`` as a stream, and the image's size in bytes (for the bar)."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        client = docker.from_env()
        found = client.images.get(image)
    except ImageNotFound:
        raise EngineError(
            f"image {image} is not in the local Docker engine; build or load it first"
        ) from None
    except DockerException as exc:
        raise EngineError(f"cannot reach the Docker engine: {exc}; is dockerd running?") from None
    try:
        stream = io.BufferedReader(_GeneratorReader(iter(found.save(named=True))), 1 << 20)
        yield stream, int(found.attrs.get("Size") or 0)
    finally:
        client.close()


@app.command("push")
def push_cmd(
    image: Annotated[str, typer.Argument(help="local image IMAGE[:TAG], e.g. myapp:v1")],
    as_ref: Annotated[
        str | None, typer.Option("--as", help="store it under this NAME:TAG (default: IMAGE)")
    ] = None,
    archive: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="read this `docker save` tar instead"),
    ] = None,
    store: StoreOption = None,
    chunk_size_bytes: Annotated[
        int | None, typer.Option(min=1, help="default: THAW_CHUNK_SIZE_BYTES (8 MiB)")
    ] = None,
) -> None:
    """Store IMAGE's layers as tables of contents plus deduplicated chunks."""
    settings = Settings()
    ref = as_ref or (image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest")
    with snapshotter_errors():
        registry = open_registry(settings, store)
        try:
            with _source(image, archive) as (stream, total_bytes):
                size = chunk_size_bytes or settings.chunk_size_bytes
                result = _push(stream, total_bytes, ref, registry, size)
        except EngineError as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(EXIT_ERROR) from None
    _print(result, registry)


@contextmanager
def _source(image: str, archive: Path | None) -> Iterator[tuple[IO[bytes], int]]:
    if archive is not None:
        with archive.open("rb") as f:
            yield f, archive.stat().st_size
        return
    with docker_save(image) as found:
        yield found


def _push(
    stream: IO[bytes],
    total_bytes: int,
    ref: str,
    registry: Registry,
    chunk_size_bytes: int,
) -> ImagePushResult:
    with transfer_bar(out, "push") as update:

        def on_progress(p: LayerProgress) -> None:
            note = f"{p.chunks_new} new, {p.chunks_deduplicated} dedup chunks"
            update(p.bytes_done, max(total_bytes, p.bytes_done), note)

        return push_image_archive(
            stream, ref, registry, chunk_size_bytes=chunk_size_bytes, progress=on_progress,
            annotations={"source": ref},
        )  # fmt: skip


def _print(result: ImagePushResult, registry: Registry) -> None:
    out.print(f"pushed image {result.ref} to {registry.store.url}", soft_wrap=True)
    out.print(f"digest  {result.digest}", soft_wrap=True)
    out.print(
        f"{len(result.layers)} layers, {result.files} files, "
        f"{human_bytes(result.content_bytes)} of file content, "
        f"new {human_bytes(result.new_stored_bytes)} stored "
        f"({result.chunks_new} new, {result.chunks_deduplicated} deduplicated chunks)",
        soft_wrap=True,
    )
