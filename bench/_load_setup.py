"""Setup the loader bench needs once per run: the tensorizer file and an S3 server.

The S3 server is moto's server mode on loopback, spoken to over real HTTP by
boto3 and by thaw's S3 store alike. Its objects are held in memory
(``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`` raised above any object size) so neither
S3 row pays for moto spilling objects to temp files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._model import ModelInfo

S3_KEYS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
S3_REGION = "us-east-1"
_MOTO_START_TIMEOUT_S = 60.0
_MOTO_KEY_BUFFER_BYTES = 4 << 30


def ensure_tensorizer_file(model: ModelInfo, data_dir: Path) -> Path:
    """The model's weights serialized once with tensorizer; reused while it exists."""
    path = data_dir / f"{Path(model.directory).name}.tensors"
    if path.exists():
        return path
    from safetensors.torch import load_file
    from tensorizer import TensorSerializer

    state: dict[str, Any] = {}
    for f in model.files:
        state.update(load_file(f))
    tmp = path.with_suffix(".tensors.tmp")
    serializer = TensorSerializer(str(tmp))
    serializer.write_state_dict(state)
    serializer.close()
    tmp.replace(path)  # only a complete file gets the final name
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _MOTO_START_TIMEOUT_S
    while True:
        try:
            httpx.get(url + "/moto-api/", timeout=1)
            return
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"moto server not answering at {url} after {_MOTO_START_TIMEOUT_S:.0f} s; "
                    "is moto[server] installed in this environment?"
                ) from None
            time.sleep(0.1)


@contextmanager
def moto_server() -> Iterator[str]:
    """Start ``moto.server`` on a free loopback port; yield its endpoint URL."""
    port = _free_port()
    env = dict(os.environ, MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=str(_MOTO_KEY_BUFFER_BYTES))
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def s3_client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=S3_REGION,
        config=Config(max_pool_connections=32),
        aws_access_key_id=S3_KEYS["aws_access_key_id"],
        aws_secret_access_key=S3_KEYS["aws_secret_access_key"],
    )


@dataclass(frozen=True)
class RawUpload:
    """The model's shard files as plain S3 objects (what a boto3 user downloads)."""

    endpoint_url: str
    bucket: str
    keys: list[str]

    def spec(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "bucket": self.bucket, "keys": self.keys}


def upload_raw_model(endpoint_url: str, model: ModelInfo, bucket: str = "bench-raw") -> RawUpload:
    """Create ``bucket`` and upload every shard under ``model/``."""
    client = s3_client(endpoint_url)
    client.create_bucket(Bucket=bucket)
    keys = []
    for f in model.files:
        key = "model/" + Path(f).name
        client.upload_file(f, bucket, key)
        keys.append(key)
    return RawUpload(endpoint_url, bucket, keys)
