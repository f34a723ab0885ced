#!/usr/bin/env bash
# Wheels for a GPU machine whose image has CUDA torch but not the rest of thaw:
#
#     bench/gpu-wheels.sh DIR
#
# Downloads (here, where pip reaches an index) CPython 3.12 x86-64 wheels of the
# project's runtime dependencies that such an image lacks, the loader peers the
# CUDA rows compare against (fastsafetensors, Run:ai streamer), the openai SDK that
# bench/llm.py drives thaw with, py-spy for bench/llm_profile.py, and the transformers
# this checkout is tested with. There they install with no index:
#
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#     PYTHONPATH=/tmp/site bench/gpu.sh OUT
#
# torch, numpy, safetensors and what the image already holds are left out (their
# wheels are large; the image's CUDA torch is the point). boto3 and docker too:
# the CUDA checks use the local store and the process runtime.
set -eu
dir=${1:?usage: bench/gpu-wheels.sh DIR}
mkdir -p "$dir"
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
transformers=$("$py" -c 'import transformers; print(transformers.__version__)')
openai=$("$py" -c 'import openai; print(openai.__version__)')
platforms=()
for p in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
         manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${p}_x86_64")
done
"$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dir" \
  zstandard blake3 "pydantic>=2.6" "pydantic-settings>=2.2" "fastapi>=0.165" uvicorn \
  httptools python-multipart "sqlalchemy>=2.0" alembic cryptography "celery[redis]>=5.4" \
  "psycopg[binary]>=3.1" trio opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
  opentelemetry-proto "openai==$openai"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dir" fastsafetensors runai-model-streamer py-spy \
  "transformers==$transformers"
# What the CUDA image has already (its own versions stay).
cd "$dir"
rm -f certifi-* charset_normalizer-* idna-* requests-* six-* sortedcontainers-* \
  python_dateutil-* markupsafe-* attrs-* packaging-* click-8* urllib3-*
du -sh .
