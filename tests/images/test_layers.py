"""Layer tars → TOC + chunks: refused entries, round trip, dedup, whiteouts."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from snapshotter import codec
from snapshotter.config import StoreConfig
from snapshotter.errors import BadArtifactError, IntegrityError
from snapshotter.images import (
    get_image,
    image_layers,
    merge_layers,
    push_image_archive,
    resolve_image,
)
from snapshotter.layers import (
    ChunkSink,
    LayerToc,
    get_layer,
    layer_key,
    put_layer,
    read_layer,
    symlink_escapes,
)
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import Member, layer_tar, save_archive


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(open_store(StoreConfig(url=str(tmp_path / "store"))))


def _read(registry: Registry, members: list[Member], chunk_size_bytes: int = 1024) -> LayerToc:
    sink = ChunkSink(registry)
    return read_layer(io.BytesIO(layer_tar(members)), sink, chunk_size_bytes=chunk_size_bytes)


BAD_ENTRIES = [
    (Member("/etc/passwd", data=b"x"), "absolute path"),
    (Member("usr/../../etc/passwd", data=b"x"), "'..' component"),
    (Member("../escape", data=b"x"), "'..' component"),
    (Member("usr/lib/evil", "symlink", link="../../../etc/shadow"), "leaves the image's root"),
    (Member("evil", "symlink", link="/../../etc"), "leaves the image's root"),
    (Member("usr/hard", "hardlink", link="/etc/passwd"), "leaves the layer's root"),
    (Member("usr/hard", "hardlink", link="../etc/passwd"), "leaves the layer's root"),
    (Member("usr/hard", "hardlink", link="usr/missing"), "not an earlier regular file"),
    (Member("dev/sda", "blk"), "block device node"),
    (Member("dev/null", "chr"), "character device node"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_ENTRIES, ids=[b.name for b, _ in BAD_ENTRIES])
def test_push_refuses_entry_naming_it(
    registry: Registry, tmp_path: Path, bad: Member, reason: str
) -> None:
    layer = layer_tar([Member("usr", "dir", mode=0o755), Member("usr/ok", data=b"fine"), bad])
    with pytest.raises(BadArtifactError) as info:
        push_image_archive(io.BytesIO(save_archive([layer])), "bad:v1", registry)
    assert repr(bad.name) in str(info.value)
    assert reason in str(info.value)
    # Nothing refers to what was uploaded: no layer, image or tag.
    assert list(registry.store.list("layers/")) == []
    assert list(registry.store.list("images/")) == []
    assert list(registry.store.list("image-tags/")) == []


def test_entry_below_a_symlink_of_the_same_layer_is_refused(registry: Registry) -> None:
    members = [Member("etc", "symlink", link="/tmp"), Member("etc/cron.d/job", data=b"x")]
    with pytest.raises(BadArtifactError, match=r"etc/cron.d/job.*symbolic link"):
        _read(registry, members)


def test_symlink_escape_is_lexical_and_allows_absolute_targets_inside() -> None:
    assert not symlink_escapes("bin", "usr/bin")
    assert not symlink_escapes("usr/bin/python3", "/usr/bin/python3.11")
    assert not symlink_escapes("usr/lib/x", "../../etc/x")
    assert symlink_escapes("usr/lib/x", "../../../etc/x")
    assert symlink_escapes("a", "/..")


def test_round_trip_preserves_metadata_and_bytes(registry: Registry) -> None:
    big = bytes(range(256)) * 20  # 5120 bytes: five 1 KiB chunks
    members = [
        Member("usr", "dir", mode=0o755),
        Member("usr/bin", "dir", mode=0o755),
        Member("usr/bin/tool", data=big, mode=0o4755, uid=0, gid=50),
        Member("usr/bin/alias", "hardlink", link="usr/bin/tool"),
        Member("usr/bin/sh", "symlink", link="dash"),
        Member("usr/empty", data=b""),
        Member("run-fifo", "fifo", mode=0o600),
    ]
    toc = _read(registry, members)
    by_path = {e.path: e for e in toc.entries}
    tool = by_path["usr/bin/tool"]
    assert (tool.type, tool.mode, tool.gid, tool.size) == ("file", 0o4755, 50, len(big))
    assert len(tool.chunks) == 5
    assert by_path["usr/bin/alias"].chunks == tool.chunks
    assert by_path["usr/bin/sh"].link == "dash"
    assert by_path["usr/empty"].chunks == ()
    assert by_path["run-fifo"].type == "fifo"
    content = b"".join(codec.decode(registry.get_chunk(c.digest), c.size) for c in tool.chunks)
    assert content == big
    assert LayerToc.from_json(toc.to_json()) == toc


def test_chunks_are_deduplicated_across_layers_and_images(registry: Registry) -> None:
    shared = b"shared library bytes " * 100
    one = layer_tar([Member("lib.so", data=shared), Member("a", data=b"only in one")])
    two = layer_tar([Member("copy/lib.so", data=shared)])
    first = push_image_archive(io.BytesIO(save_archive([one, two])), "img:one", registry)
    assert first.chunks_deduplicated >= 1  # the second layer's copy
    second = push_image_archive(io.BytesIO(save_archive([two])), "img:two", registry)
    assert second.chunks_new == 0
    assert second.new_stored_bytes == 0


def test_whiteouts_and_opaque_directories_hide_lower_layers(registry: Registry) -> None:
    lower = layer_tar(
        [
            Member("etc", "dir", mode=0o755),
            Member("etc/motd", data=b"hello"),
            Member("etc/keep", data=b"keep"),
            Member("var/cache", "dir", mode=0o755),
            Member("var/cache/old", data=b"old"),
            Member("opt/thing", data=b"file that becomes a dir"),
        ]
    )
    upper = layer_tar(
        [
            Member("etc/.wh.motd", data=b""),
            Member("var/cache/.wh..wh..opq", data=b""),
            Member("var/cache/new", data=b"new"),
            Member("opt/thing/inside", data=b"now a dir"),
        ]
    )
    result = push_image_archive(io.BytesIO(save_archive([lower, upper])), "wh:v1", registry)
    digest = resolve_image(registry, "wh:v1")
    assert digest == result.digest
    merged = merge_layers(image_layers(registry, get_image(registry, digest)))
    assert "etc/motd" not in merged
    assert "etc/keep" in merged
    assert "var/cache/old" not in merged
    assert merged["var/cache/new"].type == "file"
    assert merged["opt/thing"].type == "dir"
    assert merged["opt/thing/inside"].size == len(b"now a dir")


def test_stored_toc_is_verified(registry: Registry) -> None:
    toc = _read(registry, [Member("a", data=b"x")])
    digest = put_layer(registry, toc)
    registry.store.put(layer_key(digest), toc.to_json().replace(b'"a"', b'"b"'))
    with pytest.raises(IntegrityError, match="corrupt"):
        get_layer(registry, digest)


def test_push_on_s3_and_local(store_config: StoreConfig) -> None:
    registry = Registry(open_store(store_config))
    layer = layer_tar([Member("hello.txt", data=b"hello from a layer")])
    result = push_image_archive(io.BytesIO(save_archive([layer])), "hello:v1", registry)
    image = get_image(registry, resolve_image(registry, "hello:v1"))
    assert image.config.cmd == ("/bin/sh",)
    assert image.layers == result.layers
    (entry,) = get_layer(registry, image.layers[0]).entries
    assert entry.path == "hello.txt"
