"""Checking a code bundle before a version goes live: does its entry import?

The check runs in a subprocess (``python -I``: isolated mode, no user site,
no ``PYTHON*`` variables), in a fresh temporary directory holding only the
bundle, with a minimal environment and a timeout. A bundle that does not
import, or whose entry class is missing or has neither ``__call__`` nor
``batch`` (a batched function's), is refused with the subprocess's own
error, and the function's previous version keeps serving. (The worker
validates again, for real, when it starts a replica.) What the check learns of
the class is returned (``EntryTraits``): whether it can load an adapter the spec
does not list (``load_adapter``), so a call naming one to a class that cannot is
refused before it is accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from control_plane.errors import BadRequestError
from snapshotter import codec
from snapshotter.digest import digest_bytes
from snapshotter.errors import IntegrityError
from snapshotter.manifest import Manifest
from snapshotter.registry import Registry


@dataclass(frozen=True)
class EntryTraits:
    """What the deploy check saw of the entry class."""

    loads_adapters: bool  # defines load_adapter(self, adapter): ad-hoc adapters work


BundleValidator = Callable[[Registry, str, str], EntryTraits]

_CHECK = """
import importlib, json, sys
mod_name, _, cls_name = sys.argv[1].partition(":")
mod = importlib.import_module(mod_name)
cls = getattr(mod, cls_name, None)
if cls is None:
    sys.exit(f"module {mod_name!r} has no attribute {cls_name!r}")
entry_points = ("__call__", "batch")  # batch(self, inputs): batched functions
if not isinstance(cls, type) or not any(
    n in vars(k) for k in cls.__mro__[:-1] for n in entry_points
):
    sys.exit(f"{sys.argv[1]} is not a class that defines __call__(self, input) "
             "or batch(self, inputs)")
print()  # the traits on a line of their own, whatever the module printed
print(json.dumps({"loads_adapters": callable(getattr(cls, "load_adapter", None))}))
"""


def materialize(registry: Registry, manifest: Manifest, dest: Path) -> None:
    """Write every file of ``manifest`` under ``dest``, each chunk verified."""
    for entry in manifest.files:
        rel = PurePosixPath(entry.path)
        if rel.is_absolute() or ".." in rel.parts:
            raise IntegrityError(f"bundle path {entry.path!r} escapes the bundle")
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            for c in entry.chunks:
                raw = codec.decode(registry.get_chunk(c.digest), c.size)
                if digest_bytes(raw) != c.digest:
                    raise IntegrityError(f"chunk {c.digest} of {entry.path} is corrupt")
                out.write(raw)


def subprocess_validator(timeout_s: float) -> BundleValidator:
    """A validator that imports ``entry`` from the bundle in an isolated subprocess."""

    def validate(registry: Registry, bundle_digest: str, entry: str) -> EntryTraits:
        manifest = registry.get_manifest(bundle_digest)
        with tempfile.TemporaryDirectory(prefix="thaw-bundle-") as tmp:
            root = Path(tmp)
            materialize(registry, manifest, root)
            return _run_check(root, entry, timeout_s)

    return validate


def _run_check(root: Path, entry: str, timeout_s: float) -> EntryTraits:
    # -I ignores PYTHONPATH, so the script puts the bundle first on sys.path itself.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    script = f"import sys; sys.path.insert(0, {str(root)!r})\n{_CHECK}"
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", script, entry],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise BadRequestError(
            f"importing {entry} took longer than {timeout_s:.0f} s; move slow work into setup()"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BadRequestError(f"the bundle's entry {entry} does not import:\n{tail}")
    # The last line is the check's own; the module may print before it.
    traits = json.loads(proc.stdout.strip().splitlines()[-1])
    return EntryTraits(loads_adapters=bool(traits["loads_adapters"]))
