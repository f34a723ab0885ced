"""Broker and store fingerprints (issue #25): credentials never kept, equal brokers
equal however spelled, differences named; and the function health decision."""

from __future__ import annotations

from pathlib import Path

from control_plane.fingerprints import (
    Fingerprint,
    broker_fingerprint,
    differences,
    store_fingerprint,
)
from control_plane.services.function_health import FailedStart, judge

FOLDER = Path("/srv/thaw/broker")


def test_broker_fingerprint_drops_credentials_and_fills_defaults() -> None:
    amqp = broker_fingerprint("amqp://guest:s3cret@rabbit:5672//", FOLDER)
    assert amqp == "amqp://rabbit:5672//"
    assert broker_fingerprint("pyamqp://u:p@rabbit", FOLDER) == amqp
    assert broker_fingerprint("redis://:pw@cache/3", FOLDER) == "redis://cache:6379/3"
    assert broker_fingerprint("redis://cache", FOLDER) == "redis://cache:6379/0"
    assert broker_fingerprint("filesystem://", FOLDER) == "filesystem:///srv/thaw/broker"
    assert "s3cret" not in amqp and "pw" not in broker_fingerprint("redis://:pw@c/1", FOLDER)


def test_store_fingerprint_keeps_bucket_and_endpoint_not_keys() -> None:
    s3 = store_fingerprint("s3://models/thaw/", "http://key:secret@minio:9000")
    assert s3 == "s3://models/thaw @ minio:9000"
    assert store_fingerprint("s3://models/thaw", None) == "s3://models/thaw @ AWS"
    assert store_fingerprint("file:///srv/store", None) == "/srv/store"


def test_differences_name_both_sides_and_loopback_hosts_match() -> None:
    server = Fingerprint("redis://localhost:6379/0", "/srv/store")
    assert differences(server, Fingerprint("redis://10.0.0.5:6379/0", "/srv/store")) == []
    [broker] = differences(server, Fingerprint("redis://localhost:6379/1", "/srv/store"))
    assert "redis://localhost:6379/1" in broker and "redis://localhost:6379/0" in broker
    both = differences(server, Fingerprint("filesystem:///tmp/b", "/tmp/store"))
    assert len(both) == 2 and "/tmp/store" in both[1] and "/srv/store" in both[1]


def test_health_fails_until_a_replica_is_ready_after_the_failure() -> None:
    failed = FailedStart("setup raised", at=100.0, replica_id="r1")
    assert judge(None, None).state == "ok"
    assert judge(failed, None).state == "failing"
    assert judge(failed, 50.0).last_error == "setup raised"
    assert judge(failed, 150.0).state == "ok"
