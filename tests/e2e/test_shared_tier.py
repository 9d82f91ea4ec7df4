"""The shared tier end to end (--kv-shared, DESIGN §11): replicas with their
own --kv-cache-dir over one real S3 store (Ceph RGW, scripts/s3store.sh).
A conversation continues on another replica from the store; a new one
fetches the shared prefix's blocks; poisoned objects (flipped, truncated,
another tenant's, another model's, another cluster's) are rejected; a store
that hangs costs the deadline, then the breaker keeps requests away until it
answers again; a replica killed mid-upload leaves no entry; two replicas
storing one conversation both serve it; tenants never share. Outputs are
compared with the resident reference (greedy, real binary, real store)."""
import base64
import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from harness import THAW, mkmodel, reply, text, timings

BUCKET = "thaw-shared"
B = 32  # small blocks: a short conversation spans several


class Tier:
    def __init__(self, store, d):
        self.store = store
        self.secret = d / "secret"
        self.secret.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        self.other_secret = d / "other-secret"
        self.other_secret.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        for f in (self.secret, self.other_secret):
            f.chmod(0o600)
        e = store.env
        self.env = {k: e[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}

    def objects(self, prefix):
        """Every object name under prefix/ (one page is plenty here)."""
        status, body = self.store.request("GET", f"/{BUCKET}?list-type=2&prefix={prefix}%2F")
        assert status == 200, body
        return re.findall(r"<Key>([^<]+)</Key>", body.decode())

    def manifests(self, prefix):
        return [k for k in self.objects(prefix) if "/m/" in k]

    def blocks(self, prefix):
        return [k for k in self.objects(prefix) if "/b/" in k]

    def get(self, name):
        status, body = self.store.request("GET", f"/{BUCKET}/{name}")
        assert status == 200, body
        return body

    def put(self, name, data):
        """Overwrites (no If-None-Match): someone with write access to the
        bucket but without the cluster secret."""
        assert self.store.request("PUT", f"/{BUCKET}/{name}", data)[0] == 200


@pytest.fixture(scope="module")
def tier(s3store, tmp_path_factory):
    status, body = s3store.request("PUT", f"/{BUCKET}")
    assert status in (200, 409), body
    return Tier(s3store, tmp_path_factory.mktemp("tier"))


@pytest.fixture
def prefix():
    return "t-" + uuid.uuid4().hex[:12]


def replica(serve, tier, prefix, kvdir, *extra, model="llama", secret=None, env=None):
    return serve(model, "-np", "1", "-c", "4096", "--kv-cache-dir", str(kvdir), "--cache-ram", "0",
                 "--kv-cache-min-tokens", "16", "--kv-cache-block", str(B),
                 "--kv-shared", f"s3://{BUCKET}/{prefix}", "--kv-shared-endpoint", tier.store.endpoint,
                 "--kv-shared-secret-file", str(secret or tier.secret), *extra, env={**tier.env, **(env or {})})


def conv(i):
    return [{"role": "system", "content": f"Rules of team {i}. " + text(260, 50 + i)},
            {"role": "user", "content": f"Task {i}: " + text(20, 80 + i)}]


def turn2(c, r1):
    return c + [{"role": "assistant", "content": reply(r1)}, {"role": "user", "content": "And the next step?"}]


def ask(s, messages, key=None, n=12):
    headers = {"Authorization": f"Bearer {key}"} if key else None
    r = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def reference(serve, *convs, model="llama"):
    """Each conversation's replies served alone, by prefill, no cache tier."""
    s = serve(model, "-np", "1", "-c", "4096", "--cache-ram", "0", "--no-cache-prompt")
    out = []
    for c in convs:
        r1 = ask(s, c)
        r2 = ask(s, turn2(c, r1))
        out.append((r1, r2))
    s.stop()
    return out


def wait_for(cond, what, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def uploaded(tier, prefix, n=1):
    return wait_for(lambda: len(tier.manifests(prefix)) >= n and tier.manifests(prefix), f"{n} entries uploaded")


def stored_when_idle(s):
    """How many entries s stored, once its slots are idle (post-reply work
    included): a turn that comes in while the turn before it is still being
    re-decoded takes the slot over, and that turn is then stored only as
    part of the next one, so a test cannot count on one entry per turn.
    A reply stored as it stood before its re-decode (stores_early) is
    superseded under the same key, and only the store after it is shared."""
    wait_for(lambda: metric(s, "thaw_slots_busy") == 0, "the slots to go idle")
    return int(metric(s, "thaw_kv_cache_stores_total") - metric(s, "thaw_kv_cache_stores_early_total"))


def metric(s, name, key="k-one"):
    """A counter of /metrics (with the key, for the replicas started with --api-key)."""
    body = s.get("/metrics", headers={"Authorization": f"Bearer {key}"}).text
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body, re.M)
    # a renamed or missing metric fails here, never reads as 0
    assert m, f"{name} is not in /metrics: {body[:500]}"
    return float(m.group(1))


@pytest.mark.parametrize("kind", ["blocks", "whole", "swa"])
def test_a_conversation_continues_on_another_replica(serve, tier, prefix, tmp_path, kind):
    """Blocks + manifest; whole-state entries (--kv-cache-block 0, as for
    recurrent models); an SWA model (its window and checkpoints travel in
    the entry)."""
    c = conv(1)
    model = "gemma3" if kind == "swa" else "llama"
    extra = ["--kv-cache-block", "0"] if kind == "whole" else []
    (ref1, ref2), = reference(serve, c, model=model)
    a = replica(serve, tier, prefix, tmp_path / "a", *extra, model=model)
    r1 = ask(a, c)
    assert reply(r1) == reply(ref1)
    uploaded(tier, prefix)
    n_blocks = 0 if kind == "whole" else r1["usage"]["prompt_tokens"] // B
    assert len(tier.blocks(prefix)) >= n_blocks
    b = replica(serve, tier, prefix, tmp_path / "b", *extra, model=model)
    r2 = ask(b, turn2(c, r1))
    t = timings(r2)
    assert t["cache_source"] == "shared", t
    assert t["cache_n"] >= r1["usage"]["prompt_tokens"] - (32 if kind == "swa" else 0), t
    assert reply(r2) == reply(ref2)
    assert metric(b, "thaw_kv_shared_hits_total") == 1
    assert metric(b, "thaw_kv_cache_hits_shared_total") == 1
    assert metric(b, "thaw_kv_shared_blocks_fetched_total") >= n_blocks
    assert metric(b, "thaw_kv_shared_rejected_total") == 0
    # and the store's copy is now B's local one: the next turn needs no fetch
    r3 = ask(b, turn2(turn2(c, r1), r2))
    assert r3["cache_source"] in ("slot", "disk"), r3["timings"]
    assert metric(b, "thaw_kv_shared_hits_total") == 1


def test_a_new_conversation_fetches_the_shared_prefix(serve, tier, prefix, tmp_path):
    first, second = conv(2), conv(2)
    second[1] = {"role": "user", "content": "Another task entirely: " + text(20, 999)}
    (ref, _), = reference(serve, second)
    a = replica(serve, tier, prefix, tmp_path / "a")
    ask(a, first)
    uploaded(tier, prefix)
    b = replica(serve, tier, prefix, tmp_path / "b")
    r = ask(b, second)
    t = timings(r)
    assert t["cache_source"] == "blocks", t
    assert t["cache_n"] >= 8 * B and t["cache_n"] % B == 0, t
    assert reply(r) == reply(ref)
    assert metric(b, "thaw_kv_shared_blocks_fetched_total") >= 8


def poison_flip(tier, prefix, name, **_):
    data = bytearray(tier.get(name))
    data[len(data) // 2] ^= 0x40
    tier.put(name, bytes(data))


def poison_truncate(tier, prefix, name, **_):
    tier.put(name, tier.get(name)[:-100])


def poison_block(tier, prefix, name, **_):
    block = sorted(tier.blocks(prefix))[0]
    data = bytearray(tier.get(block))
    data[-1] ^= 0x01
    tier.put(block, bytes(data))


def poison_from(tier, prefix, name, other, **_):
    """The same conversation stored by `other` (another tenant, model or
    cluster secret) lands under another name; its bytes are copied over the
    entry this replica will fetch."""
    before = set(tier.manifests(prefix))
    other()
    theirs = wait_for(lambda: set(tier.manifests(prefix)) - before, "the other entry")
    tier.put(name, tier.get(theirs.pop()))


@pytest.mark.parametrize("how", ["flip", "truncate", "block", "tenant", "model", "secret"])
def test_poisoned_objects_are_rejected(serve, tier, prefix, tmp_path, how):
    c = conv(3)
    (_, ref2), = reference(serve, c)
    keys = ["--api-key", "k-one,k-two"]
    a = replica(serve, tier, prefix, tmp_path / "a", *keys)
    r1 = ask(a, c, key="k-one")
    name, = uploaded(tier, prefix)
    key = "k-one"
    if how == "tenant":
        # tenant two's entry for the same messages gets tenant one's bytes
        before = set(tier.manifests(prefix))
        ask(a, c, key="k-two")
        name = wait_for(lambda: set(tier.manifests(prefix)) - before, "tenant two's entry").pop()
        tier.put(name, tier.get(next(iter(before))))
        key = "k-two"
    elif how == "model":
        other = mkmodel(tmp_path / "other.gguf", "--arch", "llama", "--seed", "9")
        poison_from(tier, prefix, name, other=lambda: ask(
            replica(serve, tier, prefix, tmp_path / "m", *keys, model=other), c, key="k-one"))
    elif how == "secret":
        poison_from(tier, prefix, name, other=lambda: ask(
            replica(serve, tier, prefix, tmp_path / "s", *keys, secret=tier.other_secret), c, key="k-one"))
    else:
        {"flip": poison_flip, "truncate": poison_truncate, "block": poison_block}[how](tier, prefix, name)
    b = replica(serve, tier, prefix, tmp_path / "b", *keys)
    r2 = ask(b, turn2(c, r1), key=key)
    assert r2["cache_source"] != "shared", r2["timings"]
    assert reply(r2) == reply(ref2)  # served by prefill, correctly
    assert metric(b, "thaw_kv_shared_rejected_total") >= 1
    assert metric(b, "thaw_kv_shared_hits_total") == 0
    assert "rejected" in b.log()


def test_a_store_that_hangs_costs_the_deadline_then_the_breaker_opens(serve, tier, prefix, tmp_path):
    convs = [conv(10 + i) for i in range(4)]
    a = replica(serve, tier, prefix, tmp_path / "a")
    firsts = [ask(a, c) for c in convs]
    uploaded(tier, prefix, len(convs))
    b = replica(serve, tier, prefix, tmp_path / "b", "--kv-shared-timeout-ms", "400", "--kv-shared-retry-s", "3")
    rgw = tier.store.pid("rgw")
    os.kill(rgw, signal.SIGSTOP)
    try:
        for i in range(3):  # each waits for the deadline, then prefills
            t0 = time.time()
            r = ask(b, turn2(convs[i], firsts[i]))
            assert r["cache_source"] not in ("shared", "disk"), r["timings"]
            assert time.time() - t0 < 30  # the deadline, not the store's silence
        assert metric(b, "thaw_kv_shared_fetch_errors_total") == 3
        assert metric(b, "thaw_kv_shared_breaker_open") == 1
        assert metric(b, "thaw_kv_shared_breaker_opens_total") == 1
        # open: the next request does not even try
        ask(b, turn2(convs[3], firsts[3]))
        assert metric(b, "thaw_kv_shared_fetch_errors_total") == 3
        assert "not trying the store" in b.log()
    finally:
        os.kill(rgw, signal.SIGCONT)
    time.sleep(3.5)  # the breaker's pause
    r = ask(b, turn2(convs[0], firsts[0]))
    assert r["cache_source"] == "shared", r["timings"]
    assert metric(b, "thaw_kv_shared_breaker_open") == 0
    assert "answers again" in b.log()


def test_a_replica_killed_mid_upload_leaves_no_entry(serve, tier, prefix, tmp_path):
    c = conv(4)
    (_, ref2), = reference(serve, c)
    a = replica(serve, tier, prefix, tmp_path / "a", env={"THAW_TEST_SHARED_UPLOAD_DELAY_MS": "30000"})
    r1 = ask(a, c)
    n_blocks = r1["usage"]["prompt_tokens"] // B
    wait_for(lambda: len(tier.blocks(prefix)) >= n_blocks, "the blocks uploaded")
    a.kill()  # SIGKILL while the entry waits
    assert tier.manifests(prefix) == []
    b = replica(serve, tier, prefix, tmp_path / "b")
    r2 = ask(b, turn2(c, r1))
    assert reply(r2) == reply(ref2)
    # no entry, but the blocks it uploaded serve the prefix
    assert r2["cache_source"] == "blocks", r2["timings"]
    assert metric(b, "thaw_kv_shared_rejected_total") == 0


def test_two_replicas_storing_one_conversation(serve, tier, prefix, tmp_path):
    c = conv(5)
    (ref1, ref2), = reference(serve, c)
    a = replica(serve, tier, prefix, tmp_path / "a")
    b = replica(serve, tier, prefix, tmp_path / "b")
    ra, rb = ask(a, c), ask(b, c)
    assert reply(ra) == reply(rb) == reply(ref1)
    for s in (a, b):
        # the reply's store (after its re-decode) queues its upload after the client has the
        # reply, and after the early store's blocks are on disk: idle slots first, then the queue
        assert stored_when_idle(s) >= 1
        wait_for(lambda: metric(s, "thaw_kv_shared_upload_queue") == 0, "uploads done")
    assert len(tier.manifests(prefix)) == 1  # one object won
    existing = metric(a, "thaw_kv_shared_uploads_existing_total") + metric(b, "thaw_kv_shared_uploads_existing_total")
    assert existing >= 1
    cr = replica(serve, tier, prefix, tmp_path / "c")
    r2 = ask(cr, turn2(c, ra))
    assert r2["cache_source"] == "shared", r2["timings"]
    assert reply(r2) == reply(ref2)


def test_tenants_never_share(serve, tier, prefix, tmp_path):
    c = conv(6)
    keys = ["--api-key", "k-one,k-two"]
    a = replica(serve, tier, prefix, tmp_path / "a", *keys)
    r1 = ask(a, c, key="k-one")
    uploaded(tier, prefix)
    b = replica(serve, tier, prefix, tmp_path / "b", *keys)
    # tenant two, same messages: neither the entry nor the blocks
    r = ask(b, turn2(c, r1), key="k-two")
    assert r["cache_source"] == "none", r["timings"]
    assert metric(b, "thaw_kv_shared_blocks_fetched_total") == 0
    r = ask(b, c, key="k-two")
    assert r["cache_source"] in ("none", "slot"), r["timings"]
    assert metric(b, "thaw_kv_shared_blocks_fetched_total") == 0
    # tenant one's own, on the other replica: a hit
    r = ask(b, turn2(c, r1), key="k-one")
    assert r["cache_source"] == "shared", r["timings"]


def test_a_store_that_is_down_is_a_miss_and_opens_the_breaker(serve, tier, tmp_path):
    """Nothing listens at the endpoint: every request is served by prefill
    at once, and after three failures the store is left alone."""
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        dead = sk.getsockname()[1]  # closed again: connections are refused
    s = serve("llama", "-np", "1", "-c", "4096", "--kv-cache-dir", str(tmp_path / "a"), "--cache-ram", "0",
              "--kv-cache-min-tokens", "16", "--kv-cache-block", str(B), "--kv-shared", f"s3://{BUCKET}/down",
              "--kv-shared-endpoint", f"http://127.0.0.1:{dead}", "--kv-shared-secret-file", str(tier.secret),
              env=tier.env)
    c = conv(9)
    r1 = ask(s, c)  # a first turn: its prompt's blocks are looked for, in vain
    assert metric(s, "thaw_kv_shared_fetch_errors_total") == 1
    for i in range(3):
        # sent as soon as the reply is in: the store of turn 1 is still being
        # captured, and the replica knows not to ask the store for it
        r = ask(s, turn2(c, r1))
        assert r["cache_source"] in ("slot", "disk"), r["timings"]
    assert metric(s, "thaw_kv_shared_fetch_errors_total") == 1
    # uploads of the stores fail too; with the first turns of new
    # conversations, three failures in a row open the breaker
    for i in range(4):
        ask(s, conv(20 + i))
    failures = metric(s, "thaw_kv_shared_fetch_errors_total") + metric(s, "thaw_kv_shared_upload_errors_total")
    assert failures >= 3
    assert metric(s, "thaw_kv_shared_breaker_opens_total") == 1
    assert metric(s, "thaw_kv_shared_breaker_open") == 1
    assert "not trying the store" in s.log()


def test_flags_are_checked(models, tier, tmp_path):
    short = tmp_path / "short"
    short.write_text("tiny\n")
    ok = ["--kv-shared-secret-file", str(tier.secret), "--kv-shared-endpoint", "http://127.0.0.1:1"]
    cases = [
        (["--kv-shared", "s3://bucket/p"], "needs --kv-cache-dir"),
        (["--kv-cache-dir", str(tmp_path / "x"), "--kv-shared", "s3://bucket/p"], "--kv-shared-secret-file"),
        (["--kv-cache-dir", str(tmp_path / "x"), "--kv-shared", "http://bucket", *ok], "s3://BUCKET"),
        (["--kv-cache-dir", str(tmp_path / "x"), "--kv-shared", "s3://b/p", *ok], "3 to 63"),
        (["--kv-cache-dir", str(tmp_path / "y"), "--kv-shared", "s3://bucket/p", *ok[2:],
          "--kv-shared-secret-file", str(short)], "at least 16"),
        (["--kv-cache-dir", str(tmp_path / "z"), "--kv-shared", "s3://bucket/p", *ok[:2]], "AWS_ENDPOINT_URL"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    for args, want in cases:
        p = subprocess.run([THAW, "serve", "-m", models["llama"], "--port", "0", *args], capture_output=True,
                           text=True, timeout=120, env={**env, **tier.env})
        assert p.returncode != 0, args
        assert want in p.stderr, (args, p.stderr[-2000:])
    # no credentials
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "--port", "0", "--kv-cache-dir", str(tmp_path / "w"),
                        "--kv-shared", "s3://bucket/p", *ok], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in env.items() if not k.startswith("AWS_")})
    assert p.returncode != 0 and "AWS_ACCESS_KEY_ID" in p.stderr, p.stderr[-2000:]


# ---- three replicas behind HAProxy (deploy/haproxy.sh) -------------------------------------------

def proxied(serve, tier, prefix, tmp_path, n=3):
    from replicas import HAProxy, haproxy_binary
    if not haproxy_binary():
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    reps = [replica(serve, tier, prefix, tmp_path / f"r{i}", "--max-connections-per-client", "0")
            for i in range(n)]
    proxy = HAProxy(tmp_path / "haproxy", [("127.0.0.1", s.port) for s in reps])
    return reps, proxy


def via(proxy, messages, conv_id, n=12):
    r = proxy.post("/v1/chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0,
                                            "prompt_cache_key": conv_id})
    assert r.status_code == 200, r.text
    return r.json()


def served(reps, before):
    after = [metric(s, "thaw_chat_requests_total") if s else 0 for s in reps]
    moved = [i for i, (a, b) in enumerate(zip(after, before)) if a != b]
    assert len(moved) == 1, (before, after)
    return moved[0], after


def test_three_replicas_a_moved_conversation_hits_the_shared_tier(serve, tier, prefix, tmp_path):
    c = conv(7)
    (ref1, ref2), = reference(serve, c)
    reps, proxy = proxied(serve, tier, prefix, tmp_path)
    try:
        before = [0] * 3
        r1 = via(proxy, c, "conv-7")
        home, before = served(reps, before)
        assert reply(r1) == reply(ref1)
        uploaded(tier, prefix)
        # the same conversation under another id lands elsewhere (some id does)
        for i in range(64):
            r2 = via(proxy, turn2(c, r1), f"other-{i}")
            where, before = served(reps, before)
            if where != home:
                break
        else:
            raise AssertionError("every id hashed to the same replica")
        assert r2["cache_source"] == "shared", r2["timings"]
        assert reply(r2) == reply(ref2)
    finally:
        proxy.stop()


def test_three_replicas_a_replica_killed_after_turn_2_costs_nothing(serve, tier, prefix, tmp_path):
    c = conv(8)
    ref = reference(serve, c)[0]
    s = serve("llama", "-np", "1", "-c", "4096", "--cache-ram", "0", "--no-cache-prompt")
    r1 = ask(s, c)
    r2 = ask(s, turn2(c, r1))
    c3 = turn2(turn2(c, r1), r2)
    ref3 = ask(s, c3)
    s.stop()
    assert reply(r1) == reply(ref[0])
    reps, proxy = proxied(serve, tier, prefix, tmp_path)
    try:
        before = [0] * 3
        via(proxy, c, "conv-8")
        home, before = served(reps, before)
        via(proxy, turn2(c, r1), "conv-8")
        assert served(reps, before)[0] == home
        uploaded(tier, prefix, stored_when_idle(reps[home]))  # turn 2's entry among them
        reps[home].kill()
        proxy.wait_down(proxy.names[home])
        r3 = via(proxy, c3, "conv-8")
        t = timings(r3)
        assert t["cache_source"] == "shared", t  # the turn-2 entry, from the store
        assert t["cache_n"] >= r2["usage"]["prompt_tokens"], t
        assert reply(r3) == reply(ref3)
    finally:
        proxy.stop()


def test_after_a_restart_only_new_blocks_are_uploaded(serve, tier, prefix, tmp_path):
    c = conv(11)
    a = replica(serve, tier, prefix, tmp_path / "a")
    r1 = ask(a, c)
    uploaded(tier, prefix)
    n1 = len(tier.blocks(prefix))
    a.stop()
    a = replica(serve, tier, prefix, tmp_path / "a")  # same directory, nothing remembered of the store
    r2 = ask(a, turn2(c, r1))
    uploaded(tier, prefix, 2)
    wait_for(lambda: metric(a, "thaw_kv_shared_upload_queue") == 0, "uploads done")
    new_blocks = len(tier.blocks(prefix)) - n1
    # turn 1's blocks were asked about (HEAD), not sent again
    assert metric(a, "thaw_kv_shared_uploads_existing_total") >= n1
    assert metric(a, "thaw_kv_shared_uploads_total") == new_blocks + 1  # + the entry
    assert r2["cache_source"] == "disk"


def test_a_replica_stopped_right_after_a_reply_hands_the_turn_on(serve, tier, prefix, tmp_path):
    c = conv(12)
    a = replica(serve, tier, prefix, tmp_path / "a")
    r1 = ask(a, c)
    assert a.stop() == 0  # SIGTERM at once: the store and its upload finish first
    assert len(tier.manifests(prefix)) == 1
    b = replica(serve, tier, prefix, tmp_path / "b")
    r2 = ask(b, turn2(c, r1))
    assert r2["cache_source"] == "shared", r2["timings"]


def test_an_entry_naming_a_lost_block_restores_the_blocks_before_it(serve, tier, prefix, tmp_path):
    """A block expired from the store (lifecycle rule, gc --shared) while an
    entry still names it: the blocks before it are fetched (several at a
    time, installed in order), the request restores that prefix."""
    c = conv(13)
    (_, ref2), = reference(serve, c)
    a = replica(serve, tier, prefix, tmp_path / "a")
    r1 = ask(a, c)
    uploaded(tier, prefix)
    blocks = sorted(tier.blocks(prefix))
    victim = blocks[len(blocks) // 2]
    assert tier.store.request("DELETE", f"/{BUCKET}/{victim}")[0] == 204
    b = replica(serve, tier, prefix, tmp_path / "b")
    r2 = ask(b, turn2(c, r1))
    t = timings(r2)
    assert reply(r2) == reply(ref2)
    assert t["cache_source"] in ("blocks", "none"), t  # never "shared": the entry is incomplete
    assert t["cache_n"] % B == 0 and t["cache_n"] < r1["usage"]["prompt_tokens"], t
    assert metric(b, "thaw_kv_shared_blocks_fetched_total") == t["cache_n"] // B
