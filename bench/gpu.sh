#!/usr/bin/env bash
# The CUDA checks, in one time-boxed run on a machine with an NVIDIA GPU:
#
#     bench/gpu.sh OUT_DIR [SECONDS] [STEPS]
#
# 1. the tests marked gpu (the loader's CUDA path, CUDA replicas and CUDA forks of
#    the zygote, the RAM tier registered as pinned memory, a CUDA function through
#    the control plane, the LLM engine and function on CUDA);
# 2. bench/llm.py --device cuda: thaw's OpenAI routes and the engine in-process
#    at 1, 8 and 32 streams after 2 warm rounds that capture the shapes a level meets
#    (not counted), thaw with CUDA graphs off (its off switch), and the LLM
#    cold start (its engine's start now captures graphs and probes them);
#    llm-graphs (only when named): bench/llm_graphs.py, the engine in-process at 8 and
#    32 streams, each round's requests sent over 80 ms as a server's accepts reach it:
#    eager (with its step masks, and with the library's dense mask), thaw's graphs (a
#    shape captured when it comes again), thaw's with each shape captured the first time,
#    and thaw's graphs under step masks;
#    llm-baselines (only when named in STEPS): the same at 8 and 32 streams with
#    sequential `generate` and `transformers serve` beside it, for the x generate and
#    x serve ratios (its log alone comes back: OUT holds 8 files at most);
#    llm-servers (only when named): thaw at 8 and 32 streams with 4 control-plane
#    processes, whose bursts' accepts run side by side on the machine's cores;
#    llm-step-profile (only when named): bench/llm_step_profile.py, py-spy's view of
#    the engine's generation thread on graphs at 32 streams (is the step host-bound?);
# 3. bench/coldstart.py --device cuda on a 1.1 B-parameter Llama made here
#    (random bf16 weights, 3 shards): naive against pool miss, pool hit and the
#    RAM tier, with the phases;
# 4. bench/load.py's CUDA rows for a 1 GiB model (pinned host-to-device ceiling,
#    safetensors and fastsafetensors and Run:ai to cuda, thaw from the disk cache
#    and from the RAM tier);
# 5. bench/llm_profile.py: py-spy's view of thaw's processes while one stream runs;
# 6. the load rows again for an 8 GiB model, if time is left.
#
# STEPS (default tests,llm,coldstart,load-1g,llm-profile,load-8g) names the steps, so a
# second run in the same lease can skip what the first measured.
# Each step is cut at its own limit and at SECONDS (default 520) from the start,
# so that one run and a machine's start fit a 15-minute lease (on an H200 on
# 2026-11-26: tests 63 s, load 118 s, 2 cold-start trials per row 140 s).
# Whatever ran comes back: logs and JSON land in OUT_DIR (8 files at most). The
# machine needs torch with CUDA and the project's dependencies importable
# (PYTHONPATH; bench/gpu-wheels.sh makes the wheels for an image that lacks them).
set -u
out=${1:?usage: bench/gpu.sh OUT_DIR [SECONDS]}
budget=${2:-520}
steps=,${3:-tests,llm,coldstart,load-1g,llm-profile,load-8g},
start=$(date +%s)
cd "$(dirname "$0")/.."
export COLUMNS=160 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
for site in ${PYTHONPATH//:/ }; do  # pip --target puts scripts (py-spy) in its bin/
  [[ -d $site/bin ]] && PATH="$site/bin:$PATH"
done
data=${THAW_GPU_DATA:-/tmp/thaw-gpu}
mkdir -p "$out" "$data"

step() {  # step NAME LIMIT_S CMD...: run CMD into OUT/NAME.log, cut at LIMIT_S or the budget
    local name=$1 limit=$2 left
    shift 2
    if [[ $steps != *,$name,* ]]; then echo "== $name: not asked for"; return; fi
    left=$((budget - ($(date +%s) - start)))
    if ((left < 20)); then echo "== $name: skipped, ${left}s left"; return; fi
    ((limit > left)) && limit=$left
    echo "== $name: up to ${limit}s, at $(($(date +%s) - start))s"
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $(($(date +%s) - start))s"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__,
torch.version.cuda, torch.cuda.get_device_name(0))'
  nproc; free -g | head -2; df -h /dev/shm "$data" | tail -2
} >"$out/env.log" 2>&1
cat "$out/env.log"

# The 1.1 B model is built on the CPU while the tests run.
llama="$data/llama-1b"
builder=
if [[ $steps == *,coldstart,* ]]; then
python3 - "$llama" >"$data/model.log" 2>&1 <<'EOF' &
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)
torch.manual_seed(0)
with torch.device("cpu"):
    model = LlamaForCausalLM(config).to(torch.bfloat16)
print(sum(p.numel() for p in model.parameters()) / 1e9, "B parameters")
model.save_pretrained(sys.argv[1], max_shard_size="800MB")
EOF
builder=$!
fi

tests=(tests/snapshotter/test_loader_cuda.py tests/worker/test_cuda.py
       tests/snapshotter/test_ram_tier_mapping.py tests/snapshotter/test_ram_tier.py
       tests/control_plane/test_end_to_end.py tests/worker/llm/test_cuda.py
       tests/snapshotter/test_loader_pinned.py tests/snapshotter/test_piece_sums.py)
step tests 150 python3 -m pytest -m gpu -p no:cacheprovider -rA -q -W ignore::DeprecationWarning \
  -W ignore::FutureWarning "${tests[@]}"
grep -E "passed|failed|error" "$out/tests.log" | tail -3

step llm 240 python3 bench/llm.py --device cuda --streams 1,8,32 --rounds 2 --warm-rounds 2 \
  --cold-trials 2 --skip serve,generate --data-dir "$data/llm" --json "$out/llm.json"
# The stack's own logs (server, worker, replicas) follow, for a replica that never
# became ready or a call that failed.
find "$data/llm" -name '*.log' -newer "$out/env.log" 2>/dev/null | while read -r f; do
  printf '\n--- %s\n' "$f"; tail -n 80 "$f"
done >>"$out/llm.log"
tail -n 40 "$out/llm.log"

# The engine's CUDA graph settings, side by side in one process.
step llm-graphs 220 python3 bench/llm_graphs.py --device cuda --streams 8,32 --rounds 6 \
  --settings eager,eager-dense,thaw,thaw-first,thaw-masks --spread-ms 80 --data-dir "$data/llm"
tail -n 16 "$out/llm-graphs.log"

# thaw beside sequential generate and transformers serve on the same GPU, one run.
step llm-baselines 220 python3 bench/llm.py --device cuda --streams 8,32 --rounds 2 \
  --warm-rounds 2 --skip narrow,cold --ttft-trials 0 --data-dir "$data/llm"
tail -n 30 "$out/llm-baselines.log"

# The same bursts with the server as 4 processes (THAW_SERVER_PROCESSES), engine beside.
step llm-servers 150 python3 bench/llm.py --device cuda --streams 8,32 --rounds 3 \
  --warm-rounds 2 --skip narrow,serve,generate,cold --ttft-trials 0 --server-processes 4 --data-dir "$data/llm"
tail -n 20 "$out/llm-servers.log"

# Where the graphed engine's generation thread spends its steps at 32 streams (py-spy).
step llm-step-profile 120 python3 bench/llm_step_profile.py --device cuda --setting thaw \
  --streams 32 --rounds 6 --data-dir "$data/llm" --out "$data/llm-step-profile"
tail -n 34 "$out/llm-step-profile.log"

[[ -n $builder ]] && { wait "$builder"; tail -n 2 "$data/model.log"; }
step coldstart 160 python3 bench/coldstart.py --model "$llama" --device cuda --trials 2 \
  --data-dir "$data/coldstart"
tail -n 30 "$out/coldstart.log"

cuda_rows=memcpy,h2d,safetensors-cuda,fastsafetensors,runai-cuda,thaw-cuda,thaw-ram-cuda,thaw-ram-cuda-unpinned,thaw-ram
step load-1g 220 python3 bench/load.py --size-mb 1024 --trials 5 --methods "$cuda_rows" \
  --data-dir "$data/load"
tail -n 45 "$out/load-1g.log"

# Where a stream's time goes in each of thaw's processes on the GPU (py-spy), at 1 stream.
step llm-profile 90 python3 bench/llm_profile.py --device cuda --streams 1 --seconds 15 --gil \
  --data-dir "$data/llm" --out "$data/llm-profile"
tail -n 60 "$out/llm-profile.log"

step load-8g 200 python3 bench/load.py --size-mb 8192 --trials 2 \
  --methods h2d,safetensors-cuda,thaw-cuda,thaw-ram-cuda,thaw-ram-cuda-unpinned --data-dir "$data/load8"
tail -n 30 "$out/load-8g.log"
