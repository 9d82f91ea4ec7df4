"""`thaw cache gc --shared s3://BUCKET/PREFIX` against a real S3 store (Ceph
RGW, the `s3store` fixture): it deletes the objects under PREFIX/ written
more than --ttl ago, manifests before blocks, and nothing else; --dry-run
deletes nothing; a bad endpoint, URL or credentials is one clear line and a
nonzero exit.

LastModified cannot be set back, so the old objects are written first and
the new ones in a later second; THAW_TEST_NOW_S (test-only) then puts the
clock where the cut falls between them. One test runs on the real clock."""
import calendar
import os
import re
import socket
import subprocess
import time
import urllib.parse
import uuid

import pytest

from harness import THAW

BUCKET = "thaw-gc"


@pytest.fixture(scope="module")
def bucket(s3store):
    status, body = s3store.request("PUT", f"/{BUCKET}")
    assert status == 200, body
    return BUCKET


def quoted(key):
    # as SigV4 signs a path: only unreserved characters and '/' as they are
    return urllib.parse.quote(key, safe="/")


def put(s3store, key, data=b"x"):
    status, body = s3store.request("PUT", f"/{BUCKET}/{quoted(key)}", data)
    assert status == 200, (key, body)


def listing(s3store, prefix):
    """{key: LastModified as Unix seconds} under prefix (one page: the tests
    write fewer than 1000 objects). curl signs the query as it is written,
    so it is written in canonical form: sorted, '/' encoded."""
    query = "list-type=2&prefix=" + urllib.parse.quote(prefix, safe="")
    status, body = s3store.request("GET", f"/{BUCKET}?{query}")
    assert status == 200, body
    text = body.decode()
    assert "<IsTruncated>false</IsTruncated>" in text
    out = {}
    for c in re.findall(r"<Contents>(.*?)</Contents>", text):
        key = re.search(r"<Key>(.*?)</Key>", c).group(1)
        key = key.replace("&quot;", '"').replace("&apos;", "'").replace("&lt;", "<").replace("&gt;", ">")
        key = key.replace("&amp;", "&")
        t = re.search(r"<LastModified>(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", c).group(1)
        out[key] = calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%S"))
    return out


def gc(s3store, *args, now=None, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("THAW_TEST_")}
    e.update({k: v for k, v in s3store.env.items() if k.startswith("AWS_")})
    e["AWS_ENDPOINT_URL"] = s3store.endpoint
    if now is not None:
        e["THAW_TEST_NOW_S"] = str(now)
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}
    return subprocess.run([THAW, "cache", "gc", *args], capture_output=True, text=True, timeout=timeout, env=e)


def summary(p):
    m = re.search(r"scanned (\d+) objects under \S+ at \S+: (?:would delete|deleted) (\d+) \((\d+) manifests, "
                  r"(\d+) blocks, (\d+) other; [^)]*\), kept (\d+)", p.stdout)
    assert m, p.stdout + p.stderr
    return tuple(int(x) for x in m.groups())


def tier(prefix, tenant="t0"):
    """Keys as the shared tier names them: PREFIX/v1/<model>/<tenant>/{m,b}/<hex>."""
    base = f"{prefix}/v1/0123abcd/{tenant}"
    return lambda kind, i: f"{base}/{kind}/{i:064x}"


def wait_past(seconds):
    """Until the wall clock (the store's: this machine's) is past `seconds`,
    so what is written next has a later LastModified."""
    while time.time() < seconds + 1.05:
        time.sleep(0.05)


def test_old_objects_go_manifests_first_outside_untouched(s3store, bucket):
    p = "gc-" + uuid.uuid4().hex[:8]
    k, k2 = tier(p), tier(p, "t1")
    old = [k("b", 1), k("b", 2), k("m", 3), k2("b", 4), k2("m", 5), k2("m", 6),
           f"{p}/v1/stray name & more+=.txt"]
    new = [k("b", 7), k("m", 8), k2("b", 9)]
    outside = [p, f"{p}-other/v1/0123abcd/t0/b/{1:064x}", f"other/{p}/v1/0123abcd/t0/m/{3:064x}"]
    for key in old + outside:
        put(s3store, key, b"old " + key.encode())
    max_old = max(listing(s3store, p).values())
    wait_past(max_old)
    for key in new:
        put(s3store, key, b"new")
    before = {**listing(s3store, p), **listing(s3store, "other/")}
    assert set(before) == set(old + new + outside)
    assert all(before[key] > max_old for key in new)
    # the cut falls between the two: old ones are ttl + 1 s old, new ones at most ttl
    ttl = 1000
    now = max_old + ttl + 1

    # a dry run names exactly the old ones and deletes nothing
    d = gc(s3store, "--shared", f"s3://{BUCKET}/{p}", "--ttl", str(ttl), "--dry-run", now=now,
           env={"THAW_TEST_LIST_PAGE": "2"})
    assert d.returncode == 0, d.stderr
    named = re.findall(r"^would delete (.*)  \d+ B, written", d.stdout, re.M)
    assert sorted(named) == sorted(old)
    assert summary(d) == (len(old) + len(new), len(old), 3, 3, 1, len(new))
    assert {**listing(s3store, p), **listing(s3store, "other/")} == before

    # the real run, in pages of 2 so that it deletes while it lists across pages
    r = gc(s3store, "--shared", f"s3://{BUCKET}/{p}/", "--ttl", str(ttl), "-v", now=now,
           env={"THAW_TEST_LIST_PAGE": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary(r) == (len(old) + len(new), len(old), 3, 3, 1, len(new))
    deleted = re.findall(r"^deleted (\S.*)$", r.stdout, re.M)
    assert sorted(deleted) == sorted(old)
    # every manifest went before any block (a listing alone would give t0's b/ first)
    kinds = [key.split("/")[-2] for key in deleted]
    assert kinds.index("b") > max(i for i, x in enumerate(kinds) if x == "m"), deleted
    after = {**listing(s3store, p), **listing(s3store, "other/")}
    assert set(after) == set(new + outside)
    for key in outside:  # untouched: same object, same bytes
        assert s3store.request("GET", f"/{BUCKET}/{quoted(key)}") == (200, b"old " + key.encode())

    # again: nothing is old any more
    r = gc(s3store, "--shared", f"s3://{BUCKET}/{p}", "--ttl", str(ttl), now=now)
    assert r.returncode == 0, r.stderr
    assert summary(r) == (len(new), 0, 0, 0, 0, len(new))


def test_default_ttl_is_the_servers(s3store, bucket):
    p = "gc-" + uuid.uuid4().hex[:8]
    k = tier(p)
    keys = [k("b", 1), k("m", 2)]
    for key in keys:
        put(s3store, key)
    written = listing(s3store, p).values()
    ttl = 259200  # thaw serve's --kv-cache-ttl default
    r = gc(s3store, "--shared", f"s3://{BUCKET}/{p}", now=min(written) + ttl)
    assert r.returncode == 0, r.stderr
    assert summary(r)[1] == 0
    assert set(listing(s3store, p)) == set(keys)
    r = gc(s3store, "--shared", f"s3://{BUCKET}/{p}", now=max(written) + ttl + 1)
    assert r.returncode == 0, r.stderr
    assert summary(r)[1:3] == (2, 1)
    assert listing(s3store, p) == {}


def test_on_the_real_clock(s3store, bucket):
    p = "gc-" + uuid.uuid4().hex[:8]
    k = tier(p)
    keys = [k("b", 1), k("m", 2), k("b", 3)]
    for key in keys:
        put(s3store, key)
    time.sleep(2.1)  # LastModified drops its fraction: 2 s later everything is more than 1 s old
    r = gc(s3store, "--shared", f"s3://{BUCKET}/{p}", "--ttl", "1")
    assert r.returncode == 0, r.stderr
    assert summary(r) == (3, 3, 1, 2, 0, 0)
    assert listing(s3store, p) == {}


def test_an_empty_prefix_is_fine(s3store, bucket):
    r = gc(s3store, "--shared", f"s3://{BUCKET}/nothing-here-{uuid.uuid4().hex[:8]}", "--ttl", "0")
    assert r.returncode == 0, r.stderr
    assert summary(r) == (0, 0, 0, 0, 0, 0)


def one_line(p, *words):
    """Exit status 2, one line on stderr naming what to do."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    # (a test setting, THAW_TEST_NOW_S, is announced on a line of its own)
    lines = [ln for ln in p.stderr.strip().splitlines() if "a test setting is on" not in ln]
    assert lines and lines[0].startswith("thaw cache gc: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_errors_are_one_clear_line(s3store, bucket, tmp_path):
    p = "gc-" + uuid.uuid4().hex[:8]
    put(s3store, f"{p}/v1/0123abcd/t0/b/{1:064x}")
    url = f"s3://{BUCKET}/{p}"
    now = int(time.time()) + 10**6  # everything would be old: nothing may go in any of these
    # a store that is not there (a port nothing listens on)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    one_line(gc(s3store, "--shared", url, "--endpoint", dead, now=now), "--endpoint", "store is up")
    assert time.monotonic() - t0 < 20
    one_line(gc(s3store, "--shared", url, now=now, env={"AWS_ENDPOINT_URL": dead}), "AWS_ENDPOINT_URL")
    one_line(gc(s3store, "--shared", url, "--endpoint", "ftp://x", now=now), "http(s)://")
    one_line(gc(s3store, "--shared", url, now=now, env={"AWS_ENDPOINT_URL": None}), "--endpoint")
    # URLs: no scheme, no prefix (gc never sweeps a whole bucket)
    for bad in (f"{BUCKET}/{p}", f"s3://{BUCKET}", f"s3://{BUCKET}/", f"s3:///{p}"):
        one_line(gc(s3store, "--shared", bad, now=now), "s3://BUCKET/PREFIX")
    # credentials: missing, wrong; a bucket that does not exist
    one_line(gc(s3store, "--shared", url, now=now, env={"AWS_SECRET_ACCESS_KEY": None}), "AWS_SECRET_ACCESS_KEY")
    one_line(gc(s3store, "--shared", url, now=now, env={"AWS_SECRET_ACCESS_KEY": "wrong"}), "HTTP 403",
             "AWS_SECRET_ACCESS_KEY")
    one_line(gc(s3store, "--shared", f"s3://no-such-bucket-{p}/{p}", now=now), "NoSuchBucket", "bucket")
    # usage: a DIR, --max, --dry-run alone
    for args in (["--shared", url, str(tmp_path)], ["--shared", url, "--max", "10"], ["--dry-run"],
                 ["--shared", url, "--ttl", "3x"]):
        p2 = gc(s3store, *args, now=now)
        assert p2.returncode == 2, p2
        assert "usage:" in p2.stderr or "--ttl 3x" in p2.stderr, p2
    # and nothing went
    assert len(listing(s3store, p)) == 1
