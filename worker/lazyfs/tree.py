"""The inode table a lazy mount serves: an image's merged layers, built once, immutable.

``build_tree(merged, extra_dirs=..., extra_files=...)`` is pure: from the
merged entries (``snapshotter.images.merge_layers``) it assigns inode
numbers (the root is ``ROOT_INO``, the rest follow sorted paths, so a given
image always gets the same numbers), links each entry to its parent, and
gives a hard link the inode of its source when the source is still visible.

``extra_dirs`` and ``extra_files`` are empty placeholders added where the
image lacks them: a read-only filesystem cannot create mount points, yet the
container engine must mount things there (the worker's venv and code,
``/etc/hosts``). An existing entry is never replaced.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from snapshotter.layers import TocEntry

ROOT_INO = 1
_TYPE_BITS = {
    "file": stat.S_IFREG,
    "hardlink": stat.S_IFREG,
    "dir": stat.S_IFDIR,
    "symlink": stat.S_IFLNK,
    "fifo": stat.S_IFIFO,
}


@dataclass
class Node:
    ino: int
    entry: TocEntry
    parent: int
    children: dict[str, int] = field(default_factory=dict)
    nlink: int = 1

    @property
    def st_mode(self) -> int:
        if self.entry.type == "symlink":
            return stat.S_IFLNK | 0o777  # Linux ignores, and always shows, a link's mode
        return _TYPE_BITS[self.entry.type] | (self.entry.mode & 0o7777)

    @property
    def is_dir(self) -> bool:
        return self.entry.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.entry.has_content


@dataclass
class Tree:
    nodes: dict[int, Node]
    by_path: dict[str, int]

    def lookup(self, parent: int, name: str) -> Node | None:
        ino = self.nodes[parent].children.get(name)
        return None if ino is None else self.nodes[ino]

    def node(self, path: str) -> Node | None:
        ino = self.by_path.get(path)
        return None if ino is None else self.nodes[ino]

    def files(self) -> Iterable[Node]:
        return (n for n in self.nodes.values() if n.is_file)


def build_tree(
    merged: Mapping[str, TocEntry],
    *,
    extra_dirs: Iterable[str] = (),
    extra_files: Iterable[str] = (),
) -> Tree:
    """Inodes for ``merged`` (every parent present, as ``merge_layers`` guarantees)."""
    entries = dict(merged)
    for path in extra_dirs:
        _add_placeholder(entries, path.strip("/"), "dir")
    for path in extra_files:
        _add_placeholder(entries, path.strip("/"), "file")
    root = entries.pop("", None) or TocEntry(path="", type="dir", mode=0o755)
    nodes = {ROOT_INO: Node(ROOT_INO, root, ROOT_INO, nlink=2)}
    by_path = {"": ROOT_INO}
    for path in sorted(entries, key=lambda p: (p.count("/"), p)):
        entry = entries[path]
        parent = nodes[by_path[posixpath.dirname(path)]]
        if not parent.is_dir:
            continue  # unreachable under merge_layers' guarantee; never attach to a file
        ino = _hardlink_source(entry, by_path, nodes)
        if ino is None:
            ino = len(nodes) + 1
            nodes[ino] = Node(ino, entry, parent.ino, nlink=2 if entry.type == "dir" else 1)
        else:
            nodes[ino].nlink += 1
        parent.children[posixpath.basename(path)] = ino
        by_path[path] = ino
    return Tree(nodes, by_path)


def _hardlink_source(
    entry: TocEntry, by_path: dict[str, int], nodes: dict[int, Node]
) -> int | None:
    if entry.type != "hardlink":
        return None
    ino = by_path.get(entry.link)
    if ino is None or nodes[ino].entry.digest != entry.digest:
        return None  # the source was replaced or hidden by an upper layer
    return ino


def _add_placeholder(entries: dict[str, TocEntry], path: str, kind: str) -> None:
    if not path or path in entries:
        return
    parent = posixpath.dirname(path)
    if parent:
        _add_placeholder(entries, parent, "dir")
        if entries[parent].type != "dir":
            return  # the image has a file or link there: leave the image as it is
    mode = 0o755 if kind == "dir" else 0o644
    entries[path] = TocEntry(path=path, type=kind, mode=mode)
