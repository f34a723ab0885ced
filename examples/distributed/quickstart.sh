#!/usr/bin/env bash
# thaw distributed, step by step: PostgreSQL, a broker (Redis or RabbitMQ), an S3
# store, one control plane and two workers. The README's "Distributed" section is
# this file; a test runs it (tests/e2e/test_quickstart.py). Run it from the repo
# root with thaw installed (make install; PATH=.venv/bin:$PATH). Every setting
# below is a default: export your own value first to change it.
set -euo pipefail
RUN=${THAW_QUICKSTART_DIR:-$PWD/.thaw-distributed}   # logs, pids, the example model
mkdir -p "$RUN"

# 1. A database. thaw creates its tables (migrations) when `thaw server` starts.
: "${PGHOST:=127.0.0.1}" "${PGUSER:=postgres}" "${THAW_DB_NAME:=thaw}"
export PGHOST PGUSER
psql -lqt | cut -d'|' -f1 | grep -qw "$THAW_DB_NAME" || createdb "$THAW_DB_NAME"
export THAW_DATABASE_URL=${THAW_DATABASE_URL:-postgresql+psycopg://$PGUSER@$PGHOST:5432/$THAW_DB_NAME}

# 2. A broker: the control plane sends replica starts and calls through it.
export THAW_BROKER_URL=${THAW_BROKER_URL:-redis://127.0.0.1:6379/0}   # or amqp://guest:guest@host:5672//

# 3. A bucket for the store (models, adapters, code bundles), on any S3 API.
export THAW_STORE=${THAW_STORE:-s3://thaw/store}
export THAW_S3_ENDPOINT_URL=${THAW_S3_ENDPOINT_URL:-http://127.0.0.1:9000}  # unset for AWS itself
export THAW_S3_ACCESS_KEY_ID=${THAW_S3_ACCESS_KEY_ID:?set your S3 access key id}
export THAW_S3_SECRET_ACCESS_KEY=${THAW_S3_SECRET_ACCESS_KEY:?set your S3 secret key}
python - <<'PY'
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["THAW_S3_ENDPOINT_URL"] or None,
                  aws_access_key_id=os.environ["THAW_S3_ACCESS_KEY_ID"],
                  aws_secret_access_key=os.environ["THAW_S3_SECRET_ACCESS_KEY"],
                  region_name=os.environ.get("THAW_S3_REGION", "us-east-1"))
bucket = os.environ["THAW_STORE"].removeprefix("s3://").split("/")[0]
if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket=bucket)
PY

# 4. The control plane: every `thaw server` shares the database, broker, store and
#    one secrets key (function secrets are sealed with it). Run several behind a
#    load balancer if you like; the first start prints the admin key once.
export THAW_SECRETS_KEY=${THAW_SECRETS_KEY:-$(python -c \
  'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')}
export THAW_SERVER_PORT=${THAW_SERVER_PORT:-8420}
THAW_HOME=$RUN/server THAW_ADMIN_KEY_FILE=$RUN/admin.key \
  thaw server --host 127.0.0.1 >"$RUN/server.log" 2>&1 &
echo $! >>"$RUN/pids"
export THAW_SERVER_URL=http://127.0.0.1:$THAW_SERVER_PORT
until curl -sf "$THAW_SERVER_URL/healthz" >/dev/null; do sleep 0.5; done
export THAW_API_KEY=$(cat "$RUN/admin.key")   # the CLI's key: admin (or deploy + invoke)

# 5. Two workers (one per GPU machine; here both on this one). A worker needs the
#    server URL, a worker-scoped key, the broker and the store; each gets its own
#    THAW_HOME (its id, caches) and name.
WORKER_KEY=$(thaw keys create --scope worker --name workers | tail -n 1)
for w in w1 w2; do
  THAW_HOME=$RUN/$w THAW_API_KEY=$WORKER_KEY THAW_WORKER_NAME=$w \
    thaw worker >"$RUN/$w.log" 2>&1 &
  echo $! >>"$RUN/pids"
done
until [ "$(curl -sf -H "Authorization: Bearer $THAW_API_KEY" "$THAW_SERVER_URL/v1/workers" \
  | python -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 2 ]; do sleep 0.5; done
thaw workers ls

# 6. Push the example's model and adapters, deploy the example, call it.
python examples/build_model.py "$RUN/example"
thaw models push "$RUN/example/model" textgen-llama:v1
thaw models push "$RUN/example/adapters/pirate" textgen-pirate:v1
thaw models push "$RUN/example/adapters/poet" textgen-poet:v1
thaw deploy examples/textgen
thaw invoke textgen --data '{"prompt": "Hello", "max_tokens": 8}'                    # cold
thaw invoke textgen --data '{"prompt": "Hello", "max_tokens": 8}' --adapter pirate   # warm
echo "thaw is running: logs in $RUN; stop it with: kill \$(cat $RUN/pids)"
