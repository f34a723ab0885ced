"""The web console: ``web/`` served at ``/`` (static files, no build step).

    GET /                 web/index.html
    GET /web/{path}       any other file under web/ (scripts, styles, vendor)

The console is a client of the public REST API like any other; this router
only hands out files, never data, so it needs no key. Paths that leave
``web/`` or name a missing file answer 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from control_plane.errors import NotFoundError

WEB_DIR = Path(__file__).resolve().parents[3] / "web"
# The files change with the code; make browsers revalidate instead of caching stale modules.
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(tags=["console"], include_in_schema=False)


def resolve_web_file(web_dir: Path, rel: str) -> Path:
    """The file ``rel`` under ``web_dir``; ``NotFoundError`` if missing or outside it."""
    root = web_dir.resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise NotFoundError(f"no console file {rel!r}")
    return target


@router.get("/")
def index() -> FileResponse:
    return FileResponse(resolve_web_file(WEB_DIR, "index.html"), headers=NO_CACHE)


@router.get("/web/{rel:path}")
def web_file(rel: str) -> FileResponse:
    return FileResponse(resolve_web_file(WEB_DIR, rel), headers=NO_CACHE)
