"""Pushing a folder from a browser: ``POST /v1/uploads`` (multipart).

Form fields: ``ref`` (NAME:TAG), ``kind`` (auto | model | adapter | bundle),
then one ``paths`` field and one ``files`` part per file, in the same order
(``paths[i]`` is ``files[i]``'s path relative to the chosen folder; sent
apart because browsers and parsers disagree on slashes in filenames).
The whole request is bounded by ``max_body_bytes`` (413 past it).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas_console import UploadPublic
from control_plane.errors import BadRequestError
from control_plane.services import uploads

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

MAX_UPLOAD_FILES = 10_000


@router.post("", status_code=201)
async def upload(request: Request, who: PrincipalDep, services: ServicesDep) -> UploadPublic:
    who.require("deploy")
    form = await request.form(max_files=MAX_UPLOAD_FILES, max_fields=MAX_UPLOAD_FILES + 10)
    try:
        if "ref" not in form:
            raise BadRequestError("the upload needs a ref field (NAME:TAG)")
        ref, kind = str(form["ref"]), str(form.get("kind") or "auto")
        paths = [str(p) for p in form.getlist("paths")]
        parts = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
        if len(paths) != len(parts):
            raise BadRequestError(
                f"{len(paths)} paths for {len(parts)} files; send one paths field per file"
            )
        files = [uploads.UploadedFile(p, f.file) for p, f in zip(paths, parts, strict=True)]
        result = await run_in_threadpool(
            uploads.push_upload,
            services.registry,
            ref,
            kind,
            files,
            services.settings.chunk_size_bytes,
        )
    finally:
        await form.close()
    return UploadPublic.of(result)
