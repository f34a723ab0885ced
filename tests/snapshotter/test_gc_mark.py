"""GC's pure decisions: what ``mark`` keeps and what ``plan_sweep`` may delete."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from snapshotter.digest import digest_bytes, hex_part
from snapshotter.gc_mark import Live, Roots, classify, mark, plan_sweep
from snapshotter.images import Image
from snapshotter.layers import LayerToc, TocEntry
from snapshotter.manifest import ArtifactKind, ChunkRef, FileEntry, Manifest
from snapshotter.stores.base import ObjectInfo

NOW_S = 1_000_000.0
OLD_S = NOW_S - 10_000


def d(name: str) -> str:
    return digest_bytes(name.encode())


def chunk_refs(*names: str) -> tuple[ChunkRef, ...]:
    return tuple(ChunkRef(d(n), i * 10, 10, 12, "raw") for i, n in enumerate(names))


def manifest(*chunk_names: str) -> Manifest:
    refs = chunk_refs(*chunk_names)
    return Manifest(ArtifactKind.MODEL, (FileEntry("w.bin", 10 * len(refs), d("f"), refs),))


def layer(*chunk_names: str) -> LayerToc:
    refs = chunk_refs(*chunk_names)
    return LayerToc((TocEntry("bin/x", "file", size=10 * len(refs), digest=d("x"), chunks=refs),))


@dataclass
class DictGraph:
    manifests: dict[str, Manifest] = field(default_factory=dict)
    images: dict[str, Image] = field(default_factory=dict)
    layers: dict[str, LayerToc] = field(default_factory=dict)

    def manifest(self, digest: str) -> Manifest | None:
        return self.manifests.get(digest)

    def image(self, digest: str) -> Image | None:
        return self.images.get(digest)

    def layer(self, digest: str) -> LayerToc | None:
        return self.layers.get(digest)


def chunk_obj(name: str, modified_s: float = OLD_S) -> ObjectInfo:
    h = hex_part(d(name))
    return ObjectInfo(f"chunks/{h[:2]}/{h}", 12, modified_s)


def doc_obj(prefix: str, digest: str, modified_s: float = OLD_S) -> ObjectInfo:
    return ObjectInfo(f"{prefix}/{hex_part(digest)}", 100, modified_s)


def test_a_tagged_manifest_keeps_its_chunks_and_an_untagged_one_does_not() -> None:
    kept, dropped = manifest("a", "b"), manifest("b", "c")
    graph = DictGraph(manifests={d("m1"): kept, d("m2"): dropped})
    live = mark(Roots(manifests=frozenset({d("m1")})), graph)
    assert live.chunks == {d("a"), d("b")}
    assert live.manifests == {d("m1")}


def test_an_image_keeps_its_layers_their_chunks_and_its_profile() -> None:
    graph = DictGraph(
        images={d("img"): Image(layers=(d("l1"), d("l2")))},
        layers={d("l1"): layer("x"), d("l2"): layer("y", "z")},
    )
    live = mark(Roots(images=frozenset({d("img")})), graph)
    assert live.layers == {d("l1"), d("l2")}
    assert live.chunks == {d("x"), d("y"), d("z")}
    assert live.holds("profile", d("img"))
    assert not live.holds("profile", d("other"))


def test_lease_roots_are_live_even_before_their_manifest_is_stored() -> None:
    roots = Roots(manifests=frozenset({d("pending")}), chunks=frozenset({d("c1")}))
    live = mark(roots, DictGraph())
    assert live.holds("manifest", d("pending"))
    assert live.holds("chunk", d("c1"))


def test_plan_sweeps_only_unreferenced_objects_older_than_the_grace() -> None:
    m = manifest("a")
    live = mark(Roots(manifests=frozenset({d("m")})), DictGraph(manifests={d("m"): m}))
    objects = [
        chunk_obj("a"),  # live
        chunk_obj("old"),  # garbage
        chunk_obj("young", modified_s=NOW_S - 5),  # garbage, but inside the grace
        doc_obj("manifests", d("m")),
        doc_obj("manifests", d("gone")),
        doc_obj("profiles", d("m")),
        doc_obj("profiles", d("gone")),
        ObjectInfo("tags/m/v1", 71, OLD_S),
        ObjectInfo("leases/x.json", 10, OLD_S),
        ObjectInfo("gc/plans/p.json", 10, OLD_S),
        ObjectInfo("chunks/zz/not-a-digest", 10, OLD_S),
    ]
    doomed = plan_sweep(reversed(objects), live, NOW_S, grace_s=60)
    gone = [chunk_obj("old"), doc_obj("manifests", d("gone")), doc_obj("profiles", d("gone"))]
    assert [o.key for o in doomed] == sorted(o.key for o in gone)


def test_classify_refuses_keys_gc_must_never_touch() -> None:
    assert classify("tags/m/v1") is None
    assert classify("image-tags/m/v1") is None
    assert classify("leases/abc.json") is None
    h = hex_part(d("a"))
    assert classify(f"chunks/{h[:2]}/{h}") == ("chunk", d("a"))
    assert classify(f"chunks/00/{h}") is None  # wrong fan-out folder
    assert classify(f"layers/{h}") == ("layer", d("a"))


names = st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=5)


@given(st.lists(names, min_size=1, max_size=6), st.sets(st.integers(0, 5)))
def test_no_chunk_of_a_rooted_manifest_is_ever_planned(
    manifests: list[list[str]], rooted: set[int]
) -> None:
    graph = DictGraph(manifests={d(f"m{i}"): manifest(*ns) for i, ns in enumerate(manifests)})
    roots = Roots(manifests=frozenset(d(f"m{i}") for i in rooted if i < len(manifests)))
    live = mark(roots, graph)
    objects = [chunk_obj(n) for n in "abcdefghij"]
    doomed = {o.key for o in plan_sweep(objects, live, NOW_S, grace_s=0)}
    for i in rooted:
        if i < len(manifests):
            assert not doomed & {chunk_obj(n).key for n in manifests[i]}
    referenced = {n for ns in manifests for n in ns}
    unreferenced_anywhere = {chunk_obj(n).key for n in "abcdefghij" if n not in referenced}
    assert unreferenced_anywhere <= doomed


def test_live_update_is_a_union() -> None:
    a, b = Live(chunks={d("a")}), Live(chunks={d("b")}, manifests={d("m")})
    a.update(b)
    assert a.chunks == {d("a"), d("b")} and a.manifests == {d("m")}
