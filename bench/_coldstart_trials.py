"""Fresh-process trials of the baselines the cold-start bench compares thaw against.

    python -m bench._coldstart_trials '<spec JSON>'

``spec["method"]``:

- ``naive``: import torch and transformers, ``from_pretrained`` from local
  files, tokenizer, one forward pass (what a serverless function without
  thaw does on its cold start).
- ``boto3``: the same, after downloading every file of the model from S3
  with boto3 into an empty directory.

The model keeps its checkpoint's dtype (transformers' default, ``dtype="auto"``).
With ``spec["forward_ids"]`` (a user's model, ``--model DIR``) the forward pass
runs on fixed token ids instead of the tokenizer's (a model directory need not
hold a tokenizer); ``bench/causal_lm_fn`` does the same.

``spec["spawned_at"]`` is the parent's ``time.time()`` just before it started
this process, so ``total_s`` includes interpreter start, like a thaw cold
start includes everything from the request on. Phase times are reported too.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import emit_result

PROMPT = "Hello"


def _download(spec: dict[str, Any], into: Path) -> int:
    """Every object under the model's S3 prefix into ``into``; returns bytes fetched."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    s3 = boto3.client(
        "s3",
        endpoint_url=spec["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    config = TransferConfig(max_concurrency=16)  # as many streams as thaw's fetch threads
    total_bytes = 0
    listing = s3.list_objects_v2(Bucket=spec["bucket"], Prefix=spec["prefix"])
    for obj in listing.get("Contents", []):
        rel = obj["Key"][len(spec["prefix"]) :].lstrip("/")
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(spec["bucket"], obj["Key"], str(target), Config=config)
        total_bytes += int(obj["Size"])
    return total_bytes


def _load_and_forward(
    model_dir: Path, forward_ids: bool = False, device: str = "cpu"
) -> dict[str, float]:
    """``from_pretrained`` + tokenizer (or fixed ids) + one forward pass; phase seconds.

    On CUDA the device's context is made first (``device_init_s``, what a fresh
    process pays before any weight reaches the GPU) and the weights are loaded
    straight onto it (``device_map``), as a user's function would."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t1 = time.perf_counter()
    phases = {"imports_s": t1 - t0}
    if device != "cpu":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
        phases["device_init_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
    placement = {"device_map": device} if device != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **placement).eval()  # its dtype
    if forward_ids:
        from bench.causal_lm_fn.app import forward_ids as fixed_ids

        ids = fixed_ids(model.config.vocab_size)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    t2 = time.perf_counter()
    with torch.inference_mode():
        out = model(input_ids=ids.to(device))
        float(out.logits[0, -1, 0])  # waits for the device, as the function's call does
    t3 = time.perf_counter()
    return {**phases, "load_s": t2 - t1, "forward_s": t3 - t2}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    phases: dict[str, float] = {}
    if spec["method"] == "naive":
        model_dir, forward_ids = Path(spec["model_dir"]), bool(spec.get("forward_ids"))
        phases.update(_load_and_forward(model_dir, forward_ids, spec.get("device", "cpu")))
    elif spec["method"] == "boto3":
        with tempfile.TemporaryDirectory(dir=spec.get("scratch")) as tmp:
            t0 = time.perf_counter()
            fetched = _download(spec, Path(tmp))
            phases["download_s"] = time.perf_counter() - t0
            phases.update(_load_and_forward(Path(tmp)))
            phases["bytes"] = float(fetched)
    else:
        raise ValueError(f"unknown method {spec['method']!r}; use naive or boto3")
    return {"total_s": time.time() - float(spec["spawned_at"]), "phases": phases}


if __name__ == "__main__":
    emit_result(run(json.loads(sys.argv[1])))
