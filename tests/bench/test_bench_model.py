"""``thaw bench coldstart|load --model DIR``: a user's model, end to end and refused.

The models are made here from transformers' configs with random weights (a few
hundred KB): a Llama in bf16 in three shards and a GPT-2 in fp32 in one file, each
with a PEFT LoRA adapter. Nothing is downloaded. No timing assertions.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import coldstart, load
from bench._coldstart_model import OVERHEAD_FIXED_S, ROWS, WARM_CALLS
from bench._user_model import BadInput, Room, check_adapter, check_model, room_problem

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _llama(out: Path, hidden: int = 64) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    LlamaForCausalLM(config).bfloat16().save_pretrained(out, max_shard_size="100KB")


def _gpt2(out: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    config.bos_token_id = config.eos_token_id = 0
    GPT2LMHeadModel(config).save_pretrained(out)


def _lora(model_dir: Path, out: Path, targets: list[str], fan_in_fan_out: bool = False) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, target_modules=targets, fan_in_fan_out=fan_in_fan_out)
    get_peft_model(base, config).save_pretrained(str(out))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    _llama(root / "llama")
    _lora(root / "llama", root / "llama-lora", ["q_proj", "v_proj"])
    _llama(root / "llama-wide", hidden=128)
    _lora(root / "llama-wide", root / "llama-wide-lora", ["q_proj", "v_proj"])
    _gpt2(root / "gpt2")
    _lora(root / "gpt2", root / "gpt2-lora", ["c_attn"], fan_in_fan_out=True)
    return {p.name: p for p in root.iterdir()}


def test_the_test_models_are_what_the_issue_asks_for(models: dict[str, Path]) -> None:
    llama = check_model(models["llama"])
    assert len(llama.shards) == 3 and {t.dtype for t in llama.tensors.values()} == {"BF16"}
    gpt2 = check_model(models["gpt2"])
    assert len(gpt2.shards) == 1 and {t.dtype for t in gpt2.tensors.values()} == {"F32"}


def test_adapters_made_on_the_model_fit_it(models: dict[str, Path]) -> None:
    check_adapter(models["llama-lora"], check_model(models["llama"]))
    check_adapter(models["gpt2-lora"], check_model(models["gpt2"]))  # Conv1D: (in, out)


def test_an_adapter_of_another_architecture_is_refused(models: dict[str, Path]) -> None:
    with pytest.raises(BadInput, match="has no module named 'c_attn'"):
        check_adapter(models["gpt2-lora"], check_model(models["llama"]))


def test_an_adapter_of_another_width_is_refused_naming_the_weight(
    models: dict[str, Path],
) -> None:
    with pytest.raises(BadInput, match=r"q_proj is \(64, 64\) in the model .* maps 128 -> 128"):
        check_adapter(models["llama-wide-lora"], check_model(models["llama"]))


def test_room_problem_names_what_is_short() -> None:
    assert room_problem(Room(GIB, 2 * GIB, GIB, 2 * GIB)) is None
    why = room_problem(Room(3 * GIB, GIB, GIB, 2 * GIB))
    assert why is not None and "disk: needs 3.0 GiB, 1.0 GiB free" in why and "RAM" not in why
    why = room_problem(Room(GIB, 2 * GIB, 5 * GIB, GIB))
    assert why is not None and "RAM: needs 5.0 GiB, 1.0 GiB available" in why


def _sparse_model(root: Path, tensor_bytes: int) -> Path:
    """A model directory whose one shard declares ``tensor_bytes`` of F32 (a sparse file:
    nothing is written, the header alone says how big it is)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    shard = root / "model.safetensors"
    with shard.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + tensor_bytes)
    return root


def _bad_inputs(tmp_path: Path, models: dict[str, Path]) -> list[tuple[list[str], str]]:
    pickle_dir = tmp_path / "pickled"
    pickle_dir.mkdir()
    (pickle_dir / "config.json").write_text("{}")
    (pickle_dir / "pytorch_model.bin").write_bytes(b"never unpickled")
    huge = _sparse_model(tmp_path / "huge", 4 << 40)  # 4 TiB: more than any test disk
    return [
        (["--model", str(tmp_path / "missing")], "is not a directory"),
        (["--model", str(models["llama-lora"])], "has no config.json"),
        (["--model", str(pickle_dir)], "pytorch_model.bin: convert to safetensors"),
        (["--model", str(huge)], "too little room for this run (disk: needs"),
    ]


def test_bad_models_are_refused_before_anything_starts(
    tmp_path: Path, models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    for argv, message in _bad_inputs(tmp_path, models):
        for main in (coldstart.main, load.main):
            assert main([*argv, "--data-dir", str(data)]) == 2, argv
            err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
            assert message in err, (argv, err)
    assert not data.exists() or not any(data.iterdir())  # no store, no scratch


def test_a_mismatched_adapter_is_refused_through_the_cli(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    cmd = [sys.executable, "-m", "cli.main", "bench", "coldstart", "--model"]
    cmd += [str(models["gpt2"]), "--adapter", str(models["llama-lora"])]
    proc = subprocess.run(
        [*cmd, "--data-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2
    err = " ".join(proc.stderr.split())
    assert "does not fit --model" in err and "no module named 'q_proj' or 'v_proj'" in err
    assert not any(tmp_path.iterdir())


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cli.main", "bench", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(1600)
@pytest.mark.parametrize(("name", "adapter"), [("llama", "llama-lora"), ("gpt2", "gpt2-lora")])
def test_coldstart_on_a_users_model_reports_every_row(
    tmp_path: Path, models: dict[str, Path], name: str, adapter: str
) -> None:
    proc = _bench(
        "coldstart", "--model", str(models[name]), "--adapter", str(models[adapter]),
        "--trials", "1", "--json", "--data-dir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert set(doc["scenarios"]) == {*ROWS, "thaw_warm"}
    for key, s in doc["scenarios"].items():
        assert s["n"] == (WARM_CALLS if key == "thaw_warm" else 1) and s["median_s"] > 0, key
    # The RAM-tier pool hit's cost over a warm call, against a budget from this run's memcpy.
    over = doc["overhead"]
    assert over["memcpy_gb_per_s"] > 0 and over["budget_s"] > OVERHEAD_FIXED_S
    assert over["overhead_s"] == pytest.approx(over["cold_median_s"] - over["warm_median_s"])
    assert doc["ratios"][-1]["value"] == over["overhead_s"]
    assert {"imports_s", "load_s", "forward_s"} <= set(doc["scenarios"]["naive"]["phases_ms"])
    for key in ("thaw_pool_hit", "thaw_pool_miss", "thaw_ram_tier"):
        phases = doc["scenarios"][key]["phases_ms"]
        assert "weights_fetch" in phases and "adapters" in phases, key
    assert doc["scenarios"]["thaw_pool_miss"]["phases_ms"]["process_start"] > 0
    assert doc["scenarios"]["thaw_pool_hit"]["phases_ms"]["process_start"] == 0
    assert doc["model"]["shards"] == (3 if name == "llama" else 1)
    assert all(r["value"] is not None for r in doc["ratios"])
    assert not any(tmp_path.iterdir())  # the scratch store is gone without --keep


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_load_on_a_users_model_reports_its_files(
    tmp_path: Path, models: dict[str, Path], name: str
) -> None:
    out = tmp_path / "load.json"
    data = tmp_path / "data"
    proc = _bench(
        "load", "--model", str(models[name]), "--trials", "1", "--json", str(out),
        "--data-dir", str(data), "--keep",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["model"]["directory"] == str(models[name].resolve())
    assert len(doc["model"]["files"]) == (3 if name == "llama" else 1)
    rows = {r["key"]: r for r in doc["rows"] if not r["skipped"]}
    for key in ("thaw-store/cold", "thaw/warm", "thaw-ram/memory", "safetensors/warm",
                "mmap/warm", "read/warm", "memcpy/memory"):  # fmt: skip
        assert key in rows and rows[key]["gb_per_s"] > 0, key
    for r in rows.values():
        assert r["checksum_ok"] in (True, None), r["key"]
    assert rows["thaw-store/cold"]["thaw_report"]["store_bytes"] > 0  # from the store
    assert rows["thaw/warm"]["thaw_report"]["store_bytes"] == 0  # from the disk cache
    kept = [p.name for p in data.iterdir()]
    assert len(kept) == 1 and kept[0].startswith("load-model-")  # --keep kept the store


def test_options_of_the_synthetic_runs_do_not_mix_with_model(tmp_path: Path) -> None:
    for parse, extra in ((coldstart.parse_args, "--quick"), (load.parse_args, "--size-mb=8")):
        with pytest.raises(SystemExit):
            parse(["--model", str(tmp_path), extra])
    with pytest.raises(SystemExit):
        coldstart.parse_args(["--adapter", str(tmp_path)])  # an adapter needs --model
    with pytest.raises(SystemExit):
        coldstart.parse_args(["--device", "cuda"])  # the example's run is on the CPU
    assert coldstart.parse_args(["--model", str(tmp_path)]).device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_coldstart_on_cuda_without_a_device_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        coldstart.parse_args(["--model", str(tmp_path), "--device", "cuda"])
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err
