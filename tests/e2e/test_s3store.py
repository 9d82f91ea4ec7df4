"""The S3 store the shared tier (DESIGN §11, issue #11) is tested against:
scripts/s3store.sh starts a single-node Ceph RGW, and these tests pin down
what the tier relies on: signed requests with curl, immutable objects by
conditional PUT (first writer wins, also under a race) and a store that stops
answering turning into a time-out within the deadline, then coming back."""
import os
import signal
import subprocess
import time
import uuid

import pytest

BUCKET = "thaw-test"


@pytest.fixture(scope="module")
def bucket(s3store):
    status, body = s3store.request("PUT", f"/{BUCKET}")
    assert status == 200, body
    return f"/{BUCKET}"


def key():
    return "k-" + uuid.uuid4().hex


def test_the_bucket_is_created_and_listed(s3store, bucket):
    status, body = s3store.request("GET", "/")
    assert status == 200, body
    assert f"<Name>{BUCKET}</Name>".encode() in body


def test_put_get_delete(s3store, bucket):
    k = f"{bucket}/{key()}"
    data = os.urandom(4096) + b"\n"  # binary, and a trailing newline survives
    assert s3store.request("PUT", k, data)[0] == 200
    assert s3store.request("GET", k) == (200, data)
    assert s3store.request("DELETE", k)[0] == 204
    status, body = s3store.request("GET", k)
    assert status == 404 and b"NoSuchKey" in body


def test_unsigned_requests_are_refused(s3store, bucket):
    k = f"{bucket}/{key()}"
    assert s3store.request("PUT", k, b"secret")[0] == 200
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                        s3store.endpoint + k], capture_output=True, text=True)
    assert p.stdout == "403"


def test_if_none_match_keeps_the_first_object(s3store, bucket):
    k = f"{bucket}/{key()}"
    assert s3store.request("PUT", k, b"first", ["If-None-Match: *"])[0] == 200
    status, body = s3store.request("PUT", k, b"second", ["If-None-Match: *"])
    assert status == 412 and b"PreconditionFailed" in body
    assert s3store.request("GET", k) == (200, b"first")


def test_racing_conditional_puts_have_one_winner(s3store, bucket):
    k = f"{bucket}/{key()}"
    procs = []
    for i in range(8):
        args = s3store.curl_args("PUT", k, ["If-None-Match: *"])
        args[1:1] = ["--data-binary", f"writer {i}"]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        results.append(s3store.parse(subprocess.CompletedProcess(p.args, p.returncode, out, err)))
    statuses = [s for s, _ in results]
    assert sorted(statuses) == [200] + [412] * 7, results
    winner = statuses.index(200)
    assert s3store.request("GET", k) == (200, f"writer {winner}".encode())


def test_a_stopped_store_times_out_then_resumes(s3store, bucket):
    k = f"{bucket}/{key()}"
    assert s3store.request("PUT", k, b"still here")[0] == 200
    rgw = s3store.pid("rgw")
    os.kill(rgw, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        args = s3store.curl_args("GET", k, max_time=1)
        p = subprocess.run(args, capture_output=True, timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(rgw, signal.SIGCONT)
    assert p.returncode == 28, p.stderr  # curl: operation timed out
    assert s3store.parse(p)[0] == 0
    assert 0.9 < elapsed < 3, elapsed
    assert s3store.request("GET", k, max_time=10) == (200, b"still here")
