"""The FUSE operations of a lazy image mount (pyfuse3), read-only.

Metadata comes from the in-memory ``Tree`` (no I/O); a file's bytes come
from ``ContentReader`` on a worker thread, so a slow fetch never blocks the
loop that serves other requests. Every entry and attribute is immutable, so
the kernel may cache them for a long time and keep file pages across opens.
Opening for writing answers ``EROFS``.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import pyfuse3
import trio

from worker.lazyfs.content import AccessRecorder, ContentReader
from worker.lazyfs.tree import Node, Tree

CACHE_TIMEOUT_S = 3600.0
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class LazyFs(pyfuse3.Operations):
    def __init__(self, tree: Tree, reader: ContentReader, recorder: AccessRecorder) -> None:
        super().__init__()
        self.tree = tree
        self.reader = reader
        self.recorder = recorder
        # A hard-linked inode is recorded under its first path (the link's source).
        self._paths: dict[int, str] = {}
        for path, ino in tree.by_path.items():
            self._paths.setdefault(ino, path)

    # --- metadata ------------------------------------------------------------
    def _node(self, inode: int) -> Node:
        node = self.tree.nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        e = node.entry
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.entry_timeout = CACHE_TIMEOUT_S
        a.attr_timeout = CACHE_TIMEOUT_S
        a.st_mode = node.st_mode
        a.st_nlink = node.nlink
        a.st_uid = e.uid
        a.st_gid = e.gid
        a.st_rdev = 0
        a.st_size = e.size if node.is_file else len(e.link.encode()) if e.link else 0
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        ns = e.mtime * 1_000_000_000
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = ns
        return a

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attrs(self._node(inode))

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            return self._attrs(parent)
        if text == "..":
            return self._attrs(self._node(parent.parent))
        node = self.tree.lookup(parent_inode, text)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(node)

    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._node(inode)
        if node.entry.type != "symlink":
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(node.entry.link)

    async def opendir(self, inode: int, ctx: Any) -> int:
        if not self._node(inode).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        children = sorted(self._node(fh).children.items())
        for index in range(start_id, len(children)):
            name, ino = children[index]
            attrs = self._attrs(self.tree.nodes[ino])
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, index + 1):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        total = sum(n.entry.size for n in self.tree.files())
        s.f_blocks = (total + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = len(self.tree.nodes)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return []

    # --- contents ------------------------------------------------------------
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        node = self._node(fh)
        if not node.is_file:
            return b""
        self.recorder.record(self._paths[fh])
        return await trio.to_thread.run_sync(self.reader.read, node.entry, off, size)

    async def release(self, fh: int) -> None:
        return None
