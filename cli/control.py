"""The HTTP client the control-plane commands share: base URL and key from settings,
errors turned into one red line and exit code 2 (never a traceback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from control_plane.settings import Settings

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
EXIT_ERROR = 2


def fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(EXIT_ERROR)


@contextmanager
def client(settings: Settings, timeout_s: float = 330.0) -> Iterator[httpx.Client]:
    """An authenticated client for ``settings.server_url``; refuses to run without a key."""
    if not settings.api_key:
        raise fail("no API key: set THAW_API_KEY (the admin key `thaw server` printed once)")
    headers = {"Authorization": f"Bearer {settings.api_key}"}
    with httpx.Client(base_url=settings.server_url, headers=headers, timeout=timeout_s) as c:
        try:
            yield c
        except httpx.TransportError as exc:
            raise fail(f"cannot reach the control plane at {settings.server_url}: {exc}") from None


def check(response: httpx.Response, ok: tuple[int, ...] = (200, 201, 202, 204)) -> Any:
    """The JSON body of a successful response; else the server's message and exit 2."""
    if response.status_code in ok:
        return response.json() if response.content else None
    raise check_failed(response)


def check_failed(response: httpx.Response) -> typer.Exit:
    """The server's message for a refused request, printed; the exit to raise."""
    try:
        detail = response.json().get("detail", response.text)
    except (json.JSONDecodeError, AttributeError):
        detail = response.text
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    return fail(f"{response.status_code}: {detail}")


def print_json(value: Any) -> None:
    out.print_json(json.dumps(value))
