"""Where an LLM stream's time goes, process by process and thread by thread: py-spy
samples of thaw's server and its worker (with the replica) while streams run through
the OpenAI routes on a private installation.

    python bench/llm_profile.py [--model DIR] [--quick] [--device cuda] [--streams 1]
                                [--seconds 10] [--max-tokens 64] [--gil] [--out DIR]

The companion of ``bench/llm.py``: where that shows thaw's tokens/s below the
in-process engine's, this shows which thread of which process spends the time (the
replica's generation loop waiting for the GIL, a relay thread, the server's
recording). Needs py-spy (``pip install py-spy``) and the right to read another
process's memory (root, or ptrace allowed). Writes OUT/server.txt and OUT/worker.txt
(py-spy's raw format: a stack a line, then its sample count; threads on a CPU only)
and prints, per process and kind of thread, its share of the samples and the leaf
frames that hold most. ``--gil`` also records, at the same time, only the thread
that holds the GIL in the worker and its replica (OUT/worker-gil.txt, py-spy's
``--gil``): a thread's share there against its share on the CPU shows whether the
replica's generation loop waits for the GIL behind its call and router threads.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _llm_baselines as base
from bench._common import no_cuda
from bench.llm import check_model_dir, model_dir_of

TOP_FRAMES = 6
TOP_THREADS = 12


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when it is not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    model_dir = model_dir_of(args)
    if (why := check_model_dir(model_dir)) is not None:
        raise SystemExit(f"--model: {why}")
    from bench._llm_stack import FUNCTION, installation

    sizes = {"max_num_seqs": 32, "max_batch_tokens": 512, "kv_cache_mb": args.kv_cache_mb}
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="thaw-llm-profile-") as tmp,
        installation(model_dir, Path(tmp), sizes, args.streams, args.device, narrow=False) as stack,
    ):
        url, key = f"{stack.url}/openai/v1", stack.admin_key
        base.openai_levels(url, key, FUNCTION, [args.streams], 1, args.max_tokens)  # warm
        pids = {p.name: p.popen.pid for p in stack.procs}
        recorders = [
            _record(spy, pids["server"], args.out / "server.txt", args.seconds, False),
            _record(spy, pids["w1"], args.out / "worker.txt", args.seconds, True),
        ]
        if args.gil:
            gil = args.out / "worker-gil.txt"
            recorders.append(_record(spy, pids["w1"], gil, args.seconds, True, gil=True))
        rounds = 0
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            base.openai_levels(url, key, FUNCTION, [args.streams], 1, args.max_tokens)
            rounds += 1
        for r in recorders:
            r.wait()
    print(f"{rounds} rounds of {args.streams} streams, {args.max_tokens} tokens each")
    for name in ("server", "worker", *(["worker-gil"] if args.gil else [])):
        print(summary(args.out / f"{name}.txt"))
    return 0


def _record(
    spy: str, pid: int, out: Path, seconds: float, children: bool, *, gil: bool = False
) -> subprocess.Popen:
    command = record_command(spy, pid, out, seconds, children, gil=gil)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def record_command(
    spy: str, pid: int, out: Path, seconds: float, children: bool, *, gil: bool = False
) -> list[str]:
    """py-spy's command line: ``pid`` (and with ``children`` its subprocesses) sampled
    for ``seconds`` into ``out``, raw, per thread; with ``gil`` only the GIL's holder."""
    command = [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds)))]
    command += ["--format", "raw", "--output", str(out), "--threads", "--nonblocking"]
    if children:
        command.append("--subprocesses")
    if gil:
        command.append("--gil")
    return command


def summary(raw: Path, top: int = TOP_FRAMES) -> str:
    """Per process and thread of a py-spy raw file: its share of the samples and the
    leaf frames (function, file:line) that hold most of them."""
    if not raw.exists():
        return f"{raw}: no samples (py-spy could not attach?)"
    threads: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        processes = [_PID.sub("", f) for f in frames if f.startswith("process ")]
        thread = next((f for f in reversed(frames) if f.startswith("thread ")), "thread ?")
        where = f"{processes[-1][:60] if processes else ''} {_kind(thread)}".strip()
        threads[where] += int(count)
        leaves[where][frames[-1][:140]] += int(count)
        total += int(count)
    lines = [f"== {raw.name}: {total} samples"]
    for where, n in threads.most_common(TOP_THREADS):
        lines.append(f"{100 * n / max(total, 1):5.1f}%  {where}")
        for frame, m in leaves[where].most_common(top):
            lines.append(f"          {100 * m / n:5.1f}%  {frame}")
    return "\n".join(lines)


_PID = re.compile(r"process \d+:")
_THREAD_ID = re.compile(r"^thread \(\d+\): |[-_][0-9a-f]{6,}$|[-_ ]\d+$")


def _kind(thread: str) -> str:
    """A thread's name without its id or a call's id: threads of one kind together."""
    return _THREAD_ID.sub("", _THREAD_ID.sub("", thread))[:60]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument(
        "--gil", action="store_true", help="also record who holds the GIL (worker-gil.txt)"
    )
    p.add_argument("--out", type=Path, default=Path("llm-profile"))
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    args = p.parse_args(argv)
    if args.streams < 1 or args.seconds <= 0 or args.max_tokens < 1:
        p.error("--streams, --seconds and --max-tokens must be positive")
    if args.device == "cuda" and (why := no_cuda()) is not None:
        p.error(f"--device cuda: {why}")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
