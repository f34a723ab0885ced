"""``thaw models``: push, list, pull and verify models, adapters and code bundles.

The store is ``--store`` (a directory or ``s3://bucket/prefix``), else
``THAW_STORE``, else the control plane's store when ``THAW_SERVER_URL`` is set
(``cli.store``), else ``THAW_HOME/store``; S3 keys come from ``THAW_S3_*``. Exit codes:
0 success, 1 ``verify`` found corruption, 2 the snapshotter refused or failed
(the error is printed as one red line, never a traceback).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.progress import human_bytes, transfer_bar
from cli.store import STORE_HELP, open_registry
from control_plane.settings import Settings
from snapshotter.errors import SnapshotterError
from snapshotter.manifest import ArtifactKind
from snapshotter.pull import PullProgress, VerifyReport, pull, verify
from snapshotter.push import PushProgress, PushResult, push_directory
from snapshotter.registry import Registry, chunk_key

app = typer.Typer(no_args_is_help=True, help="Push, list, pull and verify model artifacts.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_CORRUPT = 1
EXIT_ERROR = 2


class KindChoice(enum.StrEnum):
    model = "model"
    adapter = "adapter"
    bundle = "bundle"


StoreOption = Annotated[str | None, typer.Option("--store", help=STORE_HELP)]


@contextmanager
def snapshotter_errors() -> Iterator[None]:
    """Turn a ``SnapshotterError`` into one red line and exit code 2."""
    try:
        yield
    except SnapshotterError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


def _registry(settings: Settings, store: str | None) -> Registry:
    return open_registry(settings, store)


def _digest_short(digest: str) -> str:
    return digest.split(":", 1)[-1][:12]


@app.command("push")
def push_cmd(
    directory: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="model, adapter or code folder")
    ],
    ref: Annotated[str, typer.Argument(help="NAME:TAG, e.g. llama-tiny:v1")],
    store: StoreOption = None,
    kind: Annotated[
        KindChoice | None,
        typer.Option(help="default: adapter if adapter_config.json is present, else model"),
    ] = None,
    chunk_size_bytes: Annotated[
        int | None, typer.Option(min=1, help="default: THAW_CHUNK_SIZE_BYTES (8 MiB)")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="hash/compress/upload threads")] = 8,
    convert: Annotated[
        bool,
        typer.Option(
            help="a transformers checkpoint saved in an older form (a mixture of experts' "
            "matrices apart) is pushed as its model class holds it, so it loads with no "
            "copy; the converted shards are written under TMPDIR first"
        ),
    ] = True,
) -> None:
    """Push DIRECTORY to the store and tag it REF; chunks already stored are skipped."""
    settings = Settings()
    with snapshotter_errors():
        registry = _registry(settings, store)
        with ExitStack() as bars:
            conversion = ExitStack()  # its bar ends when the conversion has read everything
            bars.enter_context(conversion)
            converting = conversion.enter_context(transfer_bar(out, "convert"))

            def on_convert(done: int, total: int) -> None:
                converting(done, total, "to the model's form")
                if done >= total:
                    conversion.close()

            def on_progress(p: PushProgress) -> None:
                conversion.close()  # no conversion, or it is done
                note = f"{p.chunks_done}/{p.chunks_total} chunks, {p.chunks_deduplicated} dedup"
                update(p.bytes_done, p.bytes_total, note)

            update = bars.enter_context(transfer_bar(out, "push"))
            result = push_directory(
                directory,
                ref,
                registry,
                kind=ArtifactKind(kind.value) if kind else None,
                chunk_size_bytes=chunk_size_bytes or settings.chunk_size_bytes,
                progress=on_progress,
                threads=threads,
                convert=convert,
                convert_progress=on_convert,
            )
    _print_push(result, registry)


def _print_push(result: PushResult, registry: Registry) -> None:
    out.print(f"pushed {result.ref} ({result.kind.value}) to {registry.store.url}", soft_wrap=True)
    out.print(f"digest  {result.digest}", soft_wrap=True)
    if result.converted:
        out.print(f"converted  {result.converted}", soft_wrap=True)
    out.print(
        f"raw {human_bytes(result.raw_size_bytes)}, "
        f"stored {human_bytes(result.stored_size_bytes)}, "
        f"new {human_bytes(result.new_bytes)}, "
        f"deduplicated {human_bytes(result.dedup_bytes)} "
        f"({result.chunks_deduplicated} of {result.chunks_total} chunks)",
        soft_wrap=True,
    )


@app.command("ls")
def ls_cmd(store: StoreOption = None) -> None:
    """List every NAME:TAG in the store with its kind, digest and sizes."""
    settings = Settings()
    with snapshotter_errors():
        registry = _registry(settings, store)
        tags = registry.tags()
        if not tags:
            out.print(f"no artifacts in {registry.store.url}", soft_wrap=True)
            return
        table = Table("NAME:TAG", "KIND", "DIGEST", "RAW", "STORED", title=registry.store.url)
        for entry in tags:
            table.add_row(entry.ref, *_row(registry, entry.digest))
    out.print(table)


def _row(registry: Registry, digest: str) -> tuple[str, str, str, str]:
    try:
        manifest = registry.get_manifest(digest)
    except SnapshotterError:
        # One broken artifact must not hide the others; `verify` explains it.
        return "[red]unreadable[/red]", _digest_short(digest), "-", "-"
    return (
        manifest.kind.value,
        _digest_short(digest),
        human_bytes(manifest.raw_size),
        human_bytes(manifest.stored_size),
    )


@app.command("pull")
def pull_cmd(
    ref: Annotated[str, typer.Argument(help="NAME:TAG or a manifest digest")],
    directory: Annotated[Path, typer.Argument(file_okay=False, help="destination folder")],
    store: StoreOption = None,
) -> None:
    """Write the files of REF into DIRECTORY, every chunk verified."""
    settings = Settings()
    with snapshotter_errors():
        registry = _registry(settings, store)
        with transfer_bar(out, "pull") as update:

            def on_progress(p: PullProgress) -> None:
                update(p.bytes_done, p.bytes_total, f"{p.chunks_done}/{p.chunks_total} chunks")

            result = pull(ref, directory, registry, progress=on_progress)
    out.print(
        f"pulled {result.ref} ({_digest_short(result.digest)}) into {directory}: "
        f"{result.files} files, {human_bytes(result.raw_size_bytes)}",
        soft_wrap=True,
    )


@app.command("verify")
def verify_cmd(
    ref: Annotated[str, typer.Argument(help="NAME:TAG or a manifest digest")],
    store: StoreOption = None,
    delete_bad: Annotated[
        bool,
        typer.Option(help="delete each corrupt chunk, so that pushing again re-uploads it"),
    ] = False,
) -> None:
    """Check REF's manifest and every chunk; exit 1 and name each bad chunk if corrupt."""
    settings = Settings()
    with snapshotter_errors():
        registry = _registry(settings, store)
        report = verify(ref, registry)
        if delete_bad:
            for bad in report.bad_chunks:
                registry.store.delete(chunk_key(bad.digest))
    _print_report(report)
    if delete_bad and report.bad_chunks:
        out.print(
            f"deleted {len(report.bad_chunks)} bad chunks; push the artifact again to restore them",
            soft_wrap=True,
        )
    if not report.ok:
        raise typer.Exit(EXIT_CORRUPT)


def _print_report(report: VerifyReport) -> None:
    if report.manifest_error:
        err.print(f"[red]corrupt manifest:[/red] {escape(report.manifest_error)}", soft_wrap=True)
        return
    for bad in report.bad_chunks:
        err.print(
            f"[red]bad chunk[/red] {bad.digest} in {escape(', '.join(bad.files))}: "
            f"{escape(bad.reason)}",
            soft_wrap=True,
        )
    verdict = "[green]ok[/green]" if report.ok else f"[red]{len(report.bad_chunks)} bad[/red]"
    out.print(
        f"{report.ref} {report.digest}: {report.chunks_checked} chunks, "
        f"{human_bytes(report.bytes_checked)} checked, {verdict}",
        soft_wrap=True,
    )
