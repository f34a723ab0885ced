"""``thaw invoke NAME --data JSON`` and ``thaw calls ls|show|cancel``.

A key sees the calls it made (an admin key: every call); another key's call
answers 404, as a call that does not exist would."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Column, Table

from cli.control import EXIT_ERROR, check, check_failed, client, err, fail, out, print_json
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
            if r.status_code != 200:
                raise _call_failed(r)
            call = r.json()
            print_json(call["output"])
            cold = r.headers.get("X-Thaw-Cold", "?")
            timing = r.headers.get("Server-Timing", "")
            out.print(f"[dim]call {call['call_id']} cold={cold} {timing}[/dim]")


def _call_failed(r: httpx.Response) -> typer.Exit:
    """A call that did not succeed: its status and message, the function's traceback
    as lines (not an escaped JSON string), and its id and timings; exit 2. A response
    that is not a call (a refusal before one was accepted) prints as ``check`` does."""
    try:
        call = r.json()
    except json.JSONDecodeError:
        call = None
    if not isinstance(call, dict) or "call_id" not in call:
        return check_failed(r)
    message = str(call.get("error") or call.get("detail") or "(no message)")
    first, _, trace = message.partition("\n")
    status = call.get("status") or ("timeout" if r.status_code == 504 else "failed")
    err.print(f"[red]error:[/red] call {status}: {escape(first)}", soft_wrap=True)
    if trace:
        err.print(escape(trace), style="dim", soft_wrap=True, highlight=False)
    err.print(f"[dim]{escape(_summary(call))}[/dim]", soft_wrap=True)
    return typer.Exit(EXIT_ERROR)


def _summary(call: dict[str, Any]) -> str:
    """``call ID cold=… attempt=N`` and its timings, as Server-Timing names them."""
    parts = [f"call {call['call_id']}"]
    if "cold" in call:
        parts.append(f"cold={str(bool(call['cold'])).lower()}")
    if call.get("attempt", 1) != 1:
        parts.append(f"attempt={call['attempt']}")
    timings = {**(call.get("phases_ms") or {}), **(call.get("timings_ms") or {})}
    parts += [f"{name};dur={ms:.1f}" for name, ms in timings.items() if isinstance(ms, int | float)]
    return " ".join(parts)


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
                elif event == "done" and isinstance(payload, dict) and "call_id" in payload:
                    out.print(f"[dim]{escape(_summary(payload))}[/dim]", soft_wrap=True)
                elif event == "error":
                    raise _stream_failed(payload)


def _stream_failed(payload: Any) -> typer.Exit:
    """A stream that ended in an error event: the call's message and traceback, as
    for a synchronous call."""
    if isinstance(payload, dict) and "call_id" in payload:
        return _call_failed(httpx.Response(500, json=payload))
    return fail(json.dumps(payload))


@calls_app.command("show")
def show(call_id: str) -> None:
    """A call's record (status, output or error, cold or warm, its timings) as JSON,
    then an LLM call's tokens."""
    with client(Settings()) as c:
        call = check(c.get(f"/v1/calls/{call_id}"))
    print_json(call)
    usage = call.get("usage")
    if usage:
        prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
        out.print(f"tokens: {prompt} prompt, {completion} completion")


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
