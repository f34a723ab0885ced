"""``thaw invoke NAME --data JSON`` and ``thaw calls ls|show|cancel``.

A key sees the calls it made (an admin key: every call); another key's call
answers 404, as a call that does not exist would."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from cli.control import check, client, fail, out, print_json
from control_plane.settings import Settings

CALL_ID_CHARS = 32  # uuid4 hex: shown whole, to be pasted

calls_app = typer.Typer(no_args_is_help=True, help="Look up calls.")


def _parse(data: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise fail(f"--data is not JSON: {exc}") from None
    except RecursionError:  # the decoder recurses per level: ~1000 deep is past it
        raise fail("--data nests arrays and objects too deeply to parse") from None


def invoke(
    name: str,
    data: Annotated[str, typer.Option("--data", "-d", help="the input, as JSON")] = "null",
    stream: Annotated[bool, typer.Option("--stream", help="print outputs as they come")] = False,
    async_: Annotated[bool, typer.Option("--async", help="return the call id at once")] = False,
    adapter: Annotated[
        str | None, typer.Option(help="a LoRA adapter: a name the spec lists, or any NAME:TAG")
    ] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="same key, same call")] = None,
    session: Annotated[
        str | None, typer.Option(help="a session id: back to the replica that served it last")
    ] = None,
) -> None:
    """Call a function and print its result (exit 2 when the call did not succeed)."""
    body = {"input": _parse(data), "adapter": adapter}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    if session:
        headers["X-Thaw-Session"] = session
    with client(Settings()) as c:
        path = f"/v1/functions/{name}/invoke"
        if async_:
            r = c.post(path, json=body, headers={**headers, "Prefer": "respond-async"})
            out.print(check(r)["call_id"])
        elif stream:
            _stream(c, path, body, {**headers, "Accept": "text/event-stream"})
        else:
            r = c.post(path, json=body, headers=headers)
            call = check(r, ok=(200,))
            print_json(call["output"])
            cold = r.headers.get("X-Thaw-Cold", "?")
            timing = r.headers.get("Server-Timing", "")
            out.print(f"[dim]call {call['call_id']} cold={cold} {timing}[/dim]")


def _stream(c: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    with c.stream("POST", path, json=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            check(r, ok=(200,))
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                payload = json.loads(line[len("data: ") :])
                if event == "output":
                    print_json(payload)
                elif event == "error":
                    raise fail(
                        json.dumps(payload.get("error") if isinstance(payload, dict) else payload)
                    )


@calls_app.command("show")
def show(call_id: str) -> None:
    """A call's status, output or error, cold or warm, and its timings."""
    with client(Settings()) as c:
        print_json(check(c.get(f"/v1/calls/{call_id}")))


@calls_app.command("ls")
def ls(
    function: Annotated[str | None, typer.Option(help="only this function's calls")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="at most this many")] = 20,
) -> None:
    """Your latest calls, newest first (an admin key: every key's)."""
    params: dict[str, str | int] = {"limit": limit}
    if function:
        params["function"] = function
    with client(Settings()) as c:
        listed = check(c.get("/v1/calls", params=params))
    call_column = Column("call", no_wrap=True, min_width=CALL_ID_CHARS)
    table = Table(call_column, "function", "version", "status", "cold", "accepted")
    for call in listed:
        accepted = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(call["accepted_at"]))
        cold = "cold" if call["cold"] else ""
        table.add_row(
            call["call_id"], call["function"], str(call["version"]), call["status"], cold, accepted
        )
    out.print(table)


@calls_app.command("cancel")
def cancel(call_id: str) -> None:
    """Cancel a call unless it already ended; prints its (now) final state."""
    with client(Settings()) as c:
        print_json(check(c.delete(f"/v1/calls/{call_id}")))
