"""The one line a failed database connection becomes (``control_plane.db.reach``)."""

from __future__ import annotations

from control_plane.db.reach import describe_failure

URL = "postgresql+psycopg://thaw:s3cret@db.example:5433/thaw"


def test_a_refused_login_keeps_the_first_line_of_the_reason_and_masks_the_password() -> None:
    reason = (
        'connection failed: connection to server at "10.0.0.5", port 5433 failed: FATAL:  '
        'password authentication failed for user "thaw"\n\tmore detail'
    )
    line = describe_failure(URL, reason)
    assert "s3cret" not in line and "\n" not in line
    assert line == (
        "cannot connect to the database at postgresql+psycopg://thaw:***@db.example:5433/thaw: "
        'connection failed: connection to server at "10.0.0.5", port 5433 failed: FATAL:  '
        'password authentication failed for user "thaw"; check THAW_DATABASE_URL'
    )


def test_a_missing_database_names_createdb_with_the_urls_host_port_and_user() -> None:
    line = describe_failure(URL, 'FATAL:  database "thaw" does not exist')
    assert "`createdb -h db.example -p 5433 -U thaw thaw`" in line
    assert 'CREATE DATABASE "thaw";' in line and "s3cret" not in line
