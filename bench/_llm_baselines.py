"""What the LLM bench sets thaw beside, each on the same model, prompts and sampling:

    engine in-process      ``worker.llm.engine`` (transformers' continuous batching) in
                           this process, a thread per stream: the ceiling thaw adds to
    sequential generate    ``model.generate`` per request, one after another: what a
                           function without batching does
    transformers serve     ``transformers serve --continuous-batching`` in a process of
                           its own, driven by the same OpenAI client as thaw

A level is ``streams`` requests sent at once; every stream is timed from the level's
start (``sent``) to its first text and its end, so a request that waits behind
others (sequential generate) shows the wait in its TTFT. The first text, in every
mode: an OpenAI client sees a token only once it decodes to text (a byte-level
tokenizer's token can end inside a character, whose text waits for the next), so
the in-process modes decode incrementally too (``worker.llm.detokenize``), or
their TTFT would count tokens no client of a server could have shown. Call ``i`` of
a level uses prompt ``i % len(PROMPTS)`` and sampling seed ``i``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._cpu import TreeMeter
from cli.loadtest_llm import PROMPTS
from worker.llm.detokenize import IncrementalDetokenizer


@dataclass(frozen=True)
class StreamTiming:
    """One stream, in seconds from its level's start (``sent``) or its own."""

    sent_s: float
    first_s: float | None  # None: no text came back
    end_s: float
    tokens: int

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_s is None or self.tokens < 2:
            return None
        return (self.end_s - self.first_s) / (self.tokens - 1)


Level = list[StreamTiming]


def in_threads(count: int, run: Callable[[int], None]) -> None:
    """``run(i)`` for each ``i`` below ``count``, each in a thread of its own, all at
    once; returns when every one has."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


Progress = Callable[[str], None]

# TTFT at one stream: the two clients thaw is read through, and the tokens asked for.
RAW_HTTP = "raw HTTP"
OPENAI_SDK = "openai SDK"
IN_PROCESS = "in-process"  # the engine alone, alternated with them
# The clients a level's streams are read with (``openai_levels``).
RAW, SDK = "raw", "sdk"
FIRST_TOKEN_MAX = 4


def prompt(i: int) -> str:
    return PROMPTS[i % len(PROMPTS)]


# --- OpenAI routes (thaw, transformers serve) ---------------------------------------


async def _openai_levels(
    base_url: str,
    key: str,
    model: str,
    levels: list[int],
    rounds: int,
    max_tokens: int,
    cpu: CpuSplit | None,
    client_kind: str,
) -> list[list[Level]]:
    async with _client(base_url, key, client_kind) as stream:
        await stream(model, 0, 4, time.perf_counter())  # warm-up
        out = []
        for streams in levels:
            per_round = []
            meter = None if cpu is None else TreeMeter(cpu.groups)
            for _ in range(rounds):
                t0 = time.perf_counter()
                calls = (stream(model, i, max_tokens, t0) for i in range(streams))
                per_round.append(list(await asyncio.gather(*calls)))
            if cpu is not None and meter is not None:
                cpu.levels.append(meter.spent_s())
            out.append(per_round)
    return out


# A streamed completion: (model, call i of its level, max_tokens, t0) -> its timing.
Stream = Callable[[str, int, int, float], Awaitable[StreamTiming]]


@asynccontextmanager
async def _client(base_url: str, key: str, kind: str) -> AsyncIterator[Stream]:
    """``kind``'s streamed completion: ``RAW`` (``RawClient``) or ``SDK`` (the
    ``openai`` SDK's async client)."""
    if kind == RAW:
        async with RawClient(base_url, key) as raw:
            yield raw.completion
        return
    import openai

    sdk = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    async with sdk:

        async def completion(model: str, i: int, max_tokens: int, t0: float) -> StreamTiming:
            return await _openai_stream(sdk, model, i, max_tokens, t0)

        yield completion


def _request(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    """Call ``i`` of a level, as both clients send it."""
    return {
        "model": model,
        "prompt": prompt(i),
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,  # the same sampling whatever the model's generation_config.json says
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _openai_stream(
    client: Any, model: str, i: int, max_tokens: int, t0: float
) -> StreamTiming:
    sent = time.perf_counter() - t0
    first, tokens = None, 0
    stream = await client.completions.create(**_request(model, i, max_tokens))
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return StreamTiming(sent, first, time.perf_counter() - t0, tokens)


class StreamRefused(RuntimeError):
    """The server answered a streamed completion with something else (an error)."""


class RawClient:
    """Streamed completions over kept HTTP/1.1 connections, read by hand: chunked
    transfer, server-sent events, one ``json.loads`` an event, the way vLLM's serving
    benchmark reads them. A load generator on the machine it measures takes its CPU
    from the server beside it: the ``openai`` SDK builds pydantic objects for every
    chunk (about 0.19 ms of CPU a token on two vCPUs, as much as thaw's worker
    spends), this reader a fraction of that. A connection is kept for the next call
    unless the server says it closes it; one it closed while kept (its keep-alive
    timeout) is replaced, and the call sent again."""

    def __init__(self, base_url: str, key: str) -> None:
        url = httpx.URL(base_url)
        self._addr = (url.host, url.port or 80)
        self._head = (
            f"POST {url.path.rstrip('/')}/completions HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        )
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def completion(self, model: str, i: int, max_tokens: int, t0: float) -> StreamTiming:
        """Call ``i`` (``_request``), timed from ``t0``; its tokens are its usage's."""
        sent = time.perf_counter() - t0
        body = json.dumps(_request(model, i, max_tokens)).encode()
        request = f"{self._head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        while True:
            kept = bool(self._idle)  # a kept connection the server may have closed since
            conn = self._idle.pop() if kept else await asyncio.open_connection(*self._addr)
            try:
                conn[1].write(request)
                first, tokens, keep = await _read_events(conn[0], t0)
                break
            except ConnectionResetError:
                conn[1].close()
                if not kept:
                    raise
            except BaseException:
                conn[1].close()
                raise
        if keep:
            self._idle.append(conn)
        else:
            conn[1].close()
        return StreamTiming(sent, first, time.perf_counter() - t0, tokens)


async def _read_events(reader: asyncio.StreamReader, t0: float) -> tuple[float | None, int, bool]:
    """A streamed completion's response: seconds from ``t0`` to its first text, its
    completion tokens (from its usage event) and whether its connection may be kept.
    Raises ``StreamRefused``, with the body's start, for any answer but an event stream."""
    status = await reader.readline()
    if not status:
        raise ConnectionResetError("the server closed the connection before it answered")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if b" 200 " not in status or headers.get("transfer-encoding") != "chunked":
        length = int(headers.get("content-length") or 0)
        body = await reader.read(min(length, 4096)) if length else b""
        answer = body[:500].decode(errors="replace")
        raise StreamRefused(f"a streamed completion got {status.decode().strip()}: {answer}")
    first, tokens, pending = None, 0, b""
    while size := int((await reader.readline()).strip() or b"0", 16):
        pending += (await reader.readexactly(size + 2))[:-2]
        *events, pending = pending.split(b"\n\n")
        for event in events:  # its data lines; a comment (": waiting ...") has none
            data = b"\n".join(
                line[5:].strip() for line in event.split(b"\n") if line[:5] == b"data:"
            )
            if not data or data == b"[DONE]":
                continue
            chunk = json.loads(data)
            choices = chunk.get("choices")
            if first is None and choices and choices[0].get("text"):
                first = time.perf_counter() - t0
            if usage := chunk.get("usage"):
                tokens = int(usage.get("completion_tokens", 0))
    await reader.readline()  # the CRLF after the last, empty chunk
    return first, tokens, headers.get("connection") != "close"


async def _first_tokens(
    base_url: str, key: str, model: str, trials: int, max_tokens: int, engine: InProcess | None
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {RAW_HTTP: [], OPENAI_SDK: []}
    if engine is not None:
        out[IN_PROCESS] = []
    async with _client(base_url, key, RAW) as raw, _client(base_url, key, SDK) as sdk:
        for warm_up in (raw, sdk):
            await warm_up(model, 0, max_tokens, time.perf_counter())
        for _ in range(trials):  # alternated, call by call
            timed = [
                (RAW_HTTP, await raw(model, 0, max_tokens, time.perf_counter())),
                (OPENAI_SDK, await sdk(model, 0, max_tokens, time.perf_counter())),
            ]
            if engine is not None:  # timed in its own thread, from its request on
                timed.append((IN_PROCESS, await asyncio.to_thread(engine.one, 0, max_tokens)))
            for name, t in timed:
                if t.ttft_s is not None:
                    out[name].append(t.ttft_s)
    return out


def first_tokens(
    base_url: str,
    key: str,
    model: str,
    trials: int,
    max_tokens: int = FIRST_TOKEN_MAX,
    engine: InProcess | None = None,
) -> dict[str, list[float]]:
    """TTFT at one stream, in seconds, by client, alternated call by call (the VM's
    drift between runs is larger than what thaw adds): a raw HTTP/1.1 reader (what the
    server adds), the ``openai`` SDK (what a user's client adds on top) and, with
    ``engine``, the same engine in this process (``IN_PROCESS``); prompt 0, seed 0,
    ``trials`` each."""
    return asyncio.run(_first_tokens(base_url, key, model, trials, max_tokens, engine))


def openai_levels(
    base_url: str,
    key: str,
    model: str,
    levels: list[int],
    rounds: int,
    max_tokens: int,
    cpu: CpuSplit | None = None,
    client: str = RAW,
) -> list[list[Level]]:
    """Each level's rounds through an OpenAI-compatible server (one warm-up call first),
    read by ``client`` (``RAW`` or ``SDK``); with ``cpu``, the CPU seconds its
    processes spent on each level's rounds."""
    levels_read = _openai_levels(base_url, key, model, levels, rounds, max_tokens, cpu, client)
    return asyncio.run(levels_read)


@dataclass
class CpuSplit:
    """Processes by part (``bench._cpu.stack_groups``) and, once measured, the CPU
    seconds each part spent per level, in the levels' order."""

    groups: dict[str, list[int]]
    levels: list[dict[str, float]] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_blocks(model_dir: Path, sizes: dict[str, int]) -> int:
    """The KV blocks (of 64 tokens) the engine's ``kv_cache_mb`` makes for this model."""
    import torch
    from transformers import AutoConfig

    from worker.llm.engine import EngineSizes, kv_blocks

    engine_sizes = EngineSizes(kv_cache_bytes=sizes["kv_cache_mb"] << 20)
    return kv_blocks(AutoConfig.from_pretrained(model_dir), torch.float32, engine_sizes)


# transformers' own command line, run by this interpreter: a venv's ``bin/transformers``
# is not beside every interpreter that has the package (``pip --target`` on a GPU box).
_TRANSFORMERS_CLI = (
    sys.executable,
    "-c",
    "import sys; from transformers.cli.transformers import main; "
    "sys.argv[0] = 'transformers'; sys.exit(main())",
)


@contextmanager
def transformers_serve(
    model_dir: Path, sizes: dict[str, int], log_path: Path, device: str = "cpu"
) -> Iterator[str]:
    """``transformers serve`` on ``model_dir`` (fp32, sdpa, continuous batching, no hub)
    with the engine's KV blocks and batch tokens (it has no sequence limit); its base
    URL. Raises RuntimeError with its log's tail when it does not come up."""
    port = _free_port()
    cmd = [
        *_TRANSFORMERS_CLI, "serve", str(model_dir), "--continuous-batching", "--device", device,
        "--dtype", "float32", "--attn-implementation", "sdpa",
        "--cb-num-blocks", str(serve_blocks(model_dir, sizes)),
        "--cb-max-batch-tokens", str(sizes["max_batch_tokens"]), "--cb-block-size", "64",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = open(log_path, "wb")  # noqa: SIM115 (closed below)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"transformers serve did not come up: {tail}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# --- in this process -----------------------------------------------------------------


def load(model_dir: Path, device: str = "cpu") -> tuple[Any, Any]:
    """The model (fp32, sdpa, eval, on ``device``) and its tokenizer, as every in-process
    mode has them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    return model.to(device), tokenizer


def eos_ids(model: Any) -> list[int]:
    eos = model.config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def engine_sizes(sizes: dict[str, int]) -> Any:
    """The bench's sizes as ``worker.llm.engine.EngineSizes``."""
    from worker.llm.engine import EngineSizes

    return EngineSizes(
        max_num_seqs=sizes["max_num_seqs"],
        max_batch_tokens=sizes["max_batch_tokens"],
        kv_cache_bytes=sizes["kv_cache_mb"] << 20,
    )


def make_engine(model: Any, sizes: dict[str, int]) -> Any:
    """``worker.llm.engine.Engine`` over ``model`` with the bench's sizes."""
    from worker.llm.engine import Engine

    return Engine(model, engine_sizes(sizes), eos_token_ids=eos_ids(model))


@dataclass
class InProcess:
    """The engine thaw's LLM functions run, in this process, with the prompts tokenized."""

    engine: Any
    tokenizer: Any
    ids: list[list[int]]

    def one(self, i: int, max_tokens: int, t0: float | None = None) -> StreamTiming:
        """Request ``i`` (prompt ``i % len(PROMPTS)``, seed ``i``), from ``t0`` (default:
        now) to its first text and its end (blocking)."""
        from worker.llm.engine import Sampling

        t0 = time.perf_counter() if t0 is None else t0
        sent = time.perf_counter() - t0
        first, tokens = None, 0
        sampling = Sampling(max_new_tokens=max_tokens, temperature=1.0, seed=i)
        prompt = self.ids[i % len(self.ids)]
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids=prompt)  # as thaw's replica
        for step in self.engine.generate(prompt, sampling):
            if first is None and detok.add(step.token_ids):
                first = time.perf_counter() - t0
            tokens += len(step.token_ids)
        return StreamTiming(sent, first, time.perf_counter() - t0, tokens)

    def level(self, streams: int, max_tokens: int, spread_s: float = 0.0, seed: int = 0) -> Level:
        """``streams`` requests, a thread each: at once, or with ``spread_s`` each sent
        at a random offset in ``[0, spread_s)`` (drawn from ``seed``), as requests that
        reach a server one by one reach its engine."""
        out: list[StreamTiming | None] = [None] * streams
        draw = random.Random(seed)
        offsets = [draw.uniform(0, spread_s) if spread_s > 0 else 0.0 for _ in range(streams)]
        t0 = time.perf_counter()

        def run(i: int) -> None:
            if (wait := t0 + offsets[i] - time.perf_counter()) > 0:
                time.sleep(wait)
            out[i] = self.one(i, max_tokens, t0)

        in_threads(streams, run)
        return [t for t in out if t is not None]


@contextmanager
def in_process(model_dir: Path, sizes: dict[str, int], device: str = "cpu") -> Iterator[InProcess]:
    """The engine in this process on ``model_dir``, warmed up; closed after."""
    model, tokenizer = load(model_dir, device)
    engine = make_engine(model, sizes)
    try:
        ran = InProcess(engine, tokenizer, [list(tokenizer(p)["input_ids"]) for p in PROMPTS])
        ran.level(1, 4)  # warm-up, as for thaw
        yield ran
    finally:
        engine.close()


def engine_levels(
    engine: InProcess, levels: list[int], rounds: int, max_tokens: int, progress: Progress
) -> list[list[Level]]:
    """Each level's rounds on the engine in this process, a thread per stream."""
    result = []
    for streams in levels:
        result.append([engine.level(streams, max_tokens) for _ in range(rounds)])
        progress(f"engine in-process, {streams} streams: done")
    return result


class _FirstText:
    """A ``generate`` streamer that notes when the new tokens first decoded to text."""

    def __init__(self, t0: float, tokenizer: Any) -> None:
        self.t0 = t0
        self.first_s: float | None = None
        self._detok = IncrementalDetokenizer(tokenizer)
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate puts the prompt first
            self._prompt_seen = True
        elif self.first_s is None and self._detok.add(value.reshape(-1).tolist()):
            self.first_s = time.perf_counter() - self.t0

    def end(self) -> None:
        pass


def generate_levels(
    model_dir: Path,
    levels: list[int],
    rounds: int,
    max_tokens: int,
    progress: Progress,
    device: str = "cpu",
) -> list[list[Level]]:
    """``model.generate`` per request, one after another; all of a level sent at once."""
    import torch

    model, tokenizer = load(model_dir, device)
    eos = eos_ids(model)

    def level(streams: int, n: int) -> Level:
        t0 = time.perf_counter()
        out = []
        for i in range(streams):
            ids = tokenizer(prompt(i), return_tensors="pt").input_ids.to(device)
            streamer = _FirstText(t0, tokenizer)
            torch.manual_seed(i)
            with torch.inference_mode():
                gen = model.generate(
                    ids,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    max_new_tokens=n,
                    eos_token_id=eos or None,
                    pad_token_id=eos[0] if eos else None,
                    streamer=streamer,
                )
            tokens = int(gen.shape[1] - ids.shape[1])
            out.append(StreamTiming(0.0, streamer.first_s, time.perf_counter() - t0, tokens))
        return out

    level(1, 4)  # warm-up
    result = []
    for streams in levels:
        result.append([level(streams, max_tokens) for _ in range(rounds)])
        progress(f"sequential generate, {streams} streams: done")
    return result
