"""``thaw invoke NAME --data JSON`` and ``thaw calls show ID``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cli.control import check, client, fail, out, print_json
from control_plane.settings import Settings

calls_app = typer.Typer(no_args_is_help=True, help="Look up calls.")


def _parse(data: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise fail(f"--data is not JSON: {exc}") from None


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
