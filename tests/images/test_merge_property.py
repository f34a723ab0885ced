"""Property: merging layer TOCs gives exactly what extracting the layer tars gives."""

from __future__ import annotations

import hashlib
import io
import stat
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotter import codec
from snapshotter.config import StoreConfig
from snapshotter.images import merge_layers
from snapshotter.layers import ChunkSink, TocEntry, read_layer
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import Member, extract_layers, layer_tar, tree_listing

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)
KINDS = st.sampled_from(["file", "file", "dir", "symlink", "whiteout", "opaque"])
OPS = st.lists(st.tuples(PATHS, KINDS, st.binary(max_size=40), st.sampled_from([0o644, 0o600])),
               max_size=6)  # fmt: skip


def _marker_fits(path: str, marker: Member, added: dict[str, Member]) -> bool:
    """A marker must sit in a directory and not clash with what the layer adds."""
    parents = path.split("/")[:-1]
    if any(added.get("/".join(parents[: i + 1]), Member("", "dir")).type != "dir"
           for i in range(len(parents))):  # fmt: skip
        return False
    if marker.name.endswith(".wh..wh..opq"):
        return added.get(path, Member("", "file")).type == "dir"
    return not any(q == path or q.startswith(path + "/") for q in added)


def _layer(ops: list[tuple[str, str, bytes, int]]) -> list[Member]:
    """A realistic layer: parents listed as directories, markers never clash with entries."""
    added: dict[str, Member] = {}
    markers: dict[str, Member] = {}
    for path, kind, data, mode in ops:
        parents = path.split("/")[:-1]
        if kind in ("whiteout", "opaque"):
            name = path.rsplit("/", 1)
            if kind == "whiteout":
                marker = "/".join([*name[:-1], ".wh." + name[-1]])
            else:
                marker = path + "/.wh..wh..opq"
            markers[path] = Member(marker)
            if kind == "opaque":
                parents = path.split("/")
        for i in range(len(parents)):
            d = "/".join(parents[: i + 1])
            if d not in added or added[d].type != "dir":
                added[d] = Member(d, "dir", mode=0o755)  # a tar lists parents as directories
        if kind in ("file", "symlink") and any(q.startswith(path + "/") for q in added):
            continue  # it already holds entries: it stays a directory
        if kind == "file":
            added[path] = Member(path, data=data, mode=mode)
        elif kind == "dir":
            added[path] = Member(path, "dir", mode=0o755)
        elif kind == "symlink":
            added[path] = Member(path, "symlink", link="elsewhere")
    links = [q for q, n in added.items() if n.type == "symlink"]
    if any(p.startswith(q + "/") for p in added for q in links):
        return []  # nothing may lie below a link of the same layer (refused at push)
    kept = [m for p, m in markers.items() if _marker_fits(p, m, added)]
    return [*sorted(added.values(), key=lambda m: m.name), *kept]


def _listing(merged: dict[str, TocEntry], registry: Registry) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for path, e in merged.items():
        if e.type == "dir":
            out[path] = (stat.S_IFDIR, e.mode, e.uid, e.gid, 0, None)
        elif e.type == "symlink":
            out[path] = (stat.S_IFLNK, 0o777, e.uid, e.gid, 0, e.link)
        else:
            data = b"".join(codec.decode(registry.get_chunk(c.digest), c.size) for c in e.chunks)
            digest = hashlib.sha256(data).hexdigest()
            out[path] = (stat.S_IFREG, e.mode, e.uid, e.gid, e.size, digest)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=4))
def test_merge_matches_extraction(layer_ops: list[list[tuple[str, str, bytes, int]]]) -> None:
    layers = [layer_tar(_layer(ops)) for ops in layer_ops]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        registry = Registry(open_store(StoreConfig(url=str(root / "store"))))
        sink = ChunkSink(registry)
        tocs = [read_layer(io.BytesIO(t), sink, chunk_size_bytes=16) for t in layers]
        extract_layers(layers, root / "x")
        expected = tree_listing(root / "x")
        assert _listing(merge_layers(tocs), registry) == expected
