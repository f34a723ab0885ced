"""A store in a local directory: temp file, fsync, rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from snapshotter.errors import NotFoundError, StoreError
from snapshotter.stores.base import ObjectInfo, Store, check_key


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.url = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{key} is not in store {self.url}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {key} from store {self.url}: {exc}") from exc

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write {key} to store {self.url}: {exc}") from exc
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> Iterator[str]:
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                yield str((Path(dirpath) / name).relative_to(self.root))

    def list_info(self, prefix: str) -> Iterator[ObjectInfo]:
        for key in self.list(prefix):
            try:
                st = (self.root / key).stat()
            except FileNotFoundError:
                continue  # deleted since it was listed
            yield ObjectInfo(key, st.st_size, st.st_mtime)
