"""Which store a CLI command that touches the store uses, in this order:

1. ``--store`` (a directory or ``s3://bucket/prefix``);
2. ``THAW_STORE``;
3. with ``THAW_SERVER_URL`` set, the control plane's own store (``GET
   /v1/store``): its directory when this machine has it, its bucket with this
   CLI's S3 keys; where the CLI cannot use it, one line says so;
4. else ``<THAW_HOME>/store`` (``./.thaw/store``).

So a push from any directory lands where the server reads, and the CLI and
the server never disagree about the store silently.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cli.control import check, client, fail
from control_plane.settings import Settings
from snapshotter.config import StoreConfig
from snapshotter.registry import Registry
from snapshotter.stores import open_store

STORE_HELP = (
    "a directory or s3://bucket/prefix (default: THAW_STORE, else the control plane's "
    "store when THAW_SERVER_URL is set, else THAW_HOME/store)"
)
_NOT_THERE = "; pass --store or set THAW_STORE to a store the control plane reads"


def open_registry(settings: Settings, override: str | None = None) -> Registry:
    """The registry on the store this command uses (see the module docstring)."""
    return Registry(open_store(store_config(settings, override)))


def store_config(settings: Settings, override: str | None = None) -> StoreConfig:
    if override or settings.store or "server_url" not in settings.model_fields_set:
        return settings.store_config(override)
    return _servers_store(settings)


def _servers_store(settings: Settings) -> StoreConfig:
    if not settings.api_key:
        raise fail(
            f"THAW_API_KEY is not set: it is needed to ask the control plane at "
            f"{settings.server_url} where its store is; set it, or pass --store / THAW_STORE"
        )
    with client(settings, timeout_s=30) as c:
        r = c.get("/v1/store")
    if r.status_code == 404:
        raise fail(
            f"the control plane at {settings.server_url} does not tell its store{_NOT_THERE}"
        )
    where = check(r)
    url = str(where["url"])
    mine = settings.store_config(url)
    if not url.startswith("s3://"):
        if not Path(url).is_dir():
            raise fail(
                f"the control plane's store is {url}, a directory this machine does not have"
                f"{_NOT_THERE}"
            )
        return mine
    s3 = replace(
        mine.s3,
        endpoint_url=settings.s3_endpoint_url or where.get("s3_endpoint_url"),
        region=settings.s3_region
        if "s3_region" in settings.model_fields_set
        else where.get("s3_region") or settings.s3_region,
    )
    from snapshotter.stores.s3 import has_credentials

    if not has_credentials(s3):
        raise fail(
            f"the control plane's store is {url}, and this CLI has no S3 keys for it: set "
            f"THAW_S3_ACCESS_KEY_ID and THAW_S3_SECRET_ACCESS_KEY{_NOT_THERE}"
        )
    return replace(mine, s3=s3)
