"""Hostile clients and bad flags: nothing a client sends or a flag says may
crash the server, hang it, lock others out or cross tenants. Each test is
one finding of the hardening issue (F1-F8), reproduced as the attacker or
the careless operator would, then checked against the fixed behaviour."""
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import requests

from harness import THAW, conversation, kv_flags, reply, turn2, user

CONV = [user("Tell me about rivers and stones.")]


def raw_request(port, body, src="127.0.0.1", path="/v1/chat/completions", headers=""):
    """A connected socket that has sent one whole POST (and not read)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(src, 0))
    data = body.encode() if isinstance(body, str) else body
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def wait_for(pred, seconds=30, step=0.05):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def idle_slots(s):
    return s.metrics()["thaw_slots_busy"] == 0


# ---- F1, F2: sizes from flags and requests ------------------------------------------

def test_huge_n_predict_flag_and_max_tokens_are_clamped_to_the_slot(serve):
    # F1: -n INT_MAX overflowed a reservation (heap corruption, abort)
    s = serve("llama", "-c", "256", "-n", "2147483647")
    r = s.post("/v1/chat/completions", {"messages": CONV, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= 256
    # F2: max_tokens >= 2^30 looped forever in the token-array growth
    for n in (1 << 30, 2147483647 - 5):
        r = s.post("/v1/chat/completions", {"messages": CONV, "temperature": 0, "max_tokens": n}, timeout=120)
        assert r.status_code in (200, 400), r.text
        if r.status_code == 200:
            assert r.json()["choices"][0]["finish_reason"] == "length"
    assert s.chat(CONV, max_tokens=2)["choices"]  # every slot still serves
    assert s.stop() == 0  # and SIGTERM still ends it


# ---- F3: connection floods ---------------------------------------------------------

def test_idle_and_slowloris_floods_do_not_starve_other_clients(serve):
    s = serve("llama", "-np", "1", "--max-connections-per-client", "0")
    held = []
    try:
        # F3: 130 idle connections used to take every connection thread
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", s.port), timeout=10,
                                                 source_address=("127.0.0.2", 0)))
        # and slowloris: half a request line each, never finished
        for _ in range(100):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10, source_address=("127.0.0.3", 0))
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            held.append(c)
        t0 = time.monotonic()
        r = s.get("/health")
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        assert s.chat(CONV, max_tokens=2)["choices"]
    finally:
        for c in held:
            c.close()


def test_per_client_connection_limit_leaves_room_for_others(serve):
    s = serve("llama", "--max-connections-per-client", "8")
    held = []
    try:
        refused = 0
        for _ in range(20):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10, source_address=("127.0.0.4", 0))
            held.append(c)
        # connections beyond the limit are accepted by the kernel, then closed
        for c in held:
            c.settimeout(2)
            try:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if c.recv(100) == b"":
                    refused += 1
            except OSError:
                refused += 1
        assert refused >= 12
        assert s.get("/health").status_code == 200  # another address is unaffected
    finally:
        for c in held:
            c.close()


def test_slow_request_body_is_dropped_after_the_timeout(serve):
    s = serve("llama", "--timeout", "2")
    c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    gone = False
    for _ in range(40):  # one byte every 0.25 s: never idle, but never done
        try:
            c.sendall(b" ")
        except OSError:
            gone = True
            break
        time.sleep(0.25)
    if not gone:
        c.settimeout(5)
        try:
            gone = c.recv(100) == b""
        except OSError:
            gone = True
    assert gone, "a client trickling its body was kept past --timeout"
    assert s.get("/health").status_code == 200


def test_oversized_body_gets_json_413_before_it_is_sent(serve):
    s = serve("llama", "--max-body", "4096")
    c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    head = c.recv(65536).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    body = head.split("\r\n\r\n", 1)[1]
    assert json.loads(body)["error"]["code"] == 413



# ---- a 413 the client can read -----------------------------------------------------
# Most clients send their whole body before they read a byte of the answer. A
# server that answers from Content-Length and closes leaves that body unread,
# and the kernel resets the connection: the client sees ECONNRESET, never the
# 413. thaw reads and discards a refused body (bounded) before it answers.

MAX_BODY = 1 << 20
UPLOAD = 64 << 20  # 64x --max-body, what a client sends before it reads
URL = "/v1/chat/completions"


def assert_json_413(body):
    err = json.loads(body)["error"]
    assert err["code"] == 413 and "--max-body" in err["message"] and err["type"], err


def test_urllib_reads_the_413_of_a_body_it_sent_whole(serve):
    s = serve("llama", "--max-body", str(MAX_BODY))
    req = urllib.request.Request(s.url + URL, data=bytes(UPLOAD), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:  # a reset raises URLError instead
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 413
    assert_json_413(e.value.read())
    assert s.get("/health").status_code == 200


def test_requests_reads_the_413_of_a_body_it_sent_whole(serve):
    s = serve("llama", "--max-body", str(MAX_BODY))
    r = requests.post(s.url + URL, data=bytes(UPLOAD), headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    assert_json_413(r.content)


@pytest.mark.parametrize("expect", ["100-continue", "none"])
def test_curl_reads_the_413_with_and_without_expect(serve, tmp_path, expect):
    # curl asks "Expect: 100-continue" for a big body: the 413 must come
    # instead of the 100, so the body is never sent; without Expect it sends
    # the body and reads the 413 after
    s = serve("llama", "--max-body", str(MAX_BODY))
    f = tmp_path / "body.json"
    f.write_bytes(bytes(UPLOAD))
    out = tmp_path / "out.json"
    args = ["curl", "-sS", "-o", str(out), "-w", "%{http_code} %{size_upload}", "--max-time", "60",
            "-H", "Content-Type: application/json", "--data-binary", f"@{f}", s.url + URL]
    if expect == "none":
        args[1:1] = ["-H", "Expect:"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    code, sent = p.stdout.split()
    assert code == "413"
    assert_json_413(out.read_bytes())
    # without Expect the whole body is read, not cut off (curl, which reads
    # while it sends, used to get the 413 through a broken pipe)
    assert int(sent) == (0 if expect == "100-continue" else UPLOAD)


def test_expect_100_continue_gets_the_413_instead_of_the_100(serve):
    s = serve("llama", "--max-body", str(MAX_BODY))
    c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    c.sendall(f"POST {URL} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              f"Content-Length: {UPLOAD}\r\n\r\n".encode())
    head = c.recv(65536).decode(errors="replace")  # at once: the client waits for it
    assert head.startswith("HTTP/1.1 413"), head


def send_until_closed(c, chunk, pause, seconds):
    """Sends `chunk` every `pause` s, never reading, until the server drops the
    connection (a send fails). Returns the seconds that took, None if longer."""
    t0 = time.monotonic()
    c.settimeout(seconds)  # a server that stops reading but holds on blocks sendall
    while time.monotonic() - t0 < seconds:
        try:
            c.sendall(chunk)
        except socket.timeout:
            return None
        except OSError:
            return time.monotonic() - t0
        time.sleep(pause)
    return None


@pytest.mark.parametrize("how", ["huge-length", "trickled-body", "endless-chunks"])
def test_a_refused_body_cannot_hold_the_connection(serve, how):
    # the discard is bounded: a Content-Length beyond what is worth reading is
    # answered at once, a body still arriving at --timeout is dropped like an
    # accepted one, and a chunked body is read at most a fixed amount past
    # --max-body (the default --timeout of 30 s is far off: the byte bound ends it)
    timeout = ["--timeout", "3"] if how == "trickled-body" else []
    s = serve("llama", "--max-body", str(MAX_BODY), *timeout)
    c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    head = f"POST {URL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if how == "huge-length":
        c.sendall(f"{head}Content-Length: {1 << 40}\r\n\r\n".encode())
        took = send_until_closed(c, bytes(1 << 20), 0, 10)
    elif how == "trickled-body":
        c.sendall(f"{head}Content-Length: {UPLOAD // 2}\r\n\r\n".encode())
        took = send_until_closed(c, b" ", 0.25, 10)  # never idle, never done
    else:
        c.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        took = send_until_closed(c, b"%x\r\n" % (1 << 20) + bytes(1 << 20) + b"\r\n", 0, 10)
    c.close()
    assert took is not None, f"{how}: the server held the connection past 10 s"
    assert s.get("/health").status_code == 200

# ---- F4: admission before work -----------------------------------------------------

def test_many_messages_are_refused_before_template_or_tokenizer(serve):
    s = serve("llama", "-c", "2048")
    msgs = [user("word") for _ in range(100000)]  # 3.4 MB, under --max-body
    r = s.post("/v1/chat/completions", {"messages": msgs}, timeout=60)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"], r.text
    big = [user("stone " * 400000)]  # 2.4 MB of text: cannot fit 2048 tokens
    r = s.post("/v1/chat/completions", {"messages": big}, timeout=60)
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"], r.text
    assert s.chat(CONV, max_tokens=2)["choices"]


# ---- F5: cancellation --------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_client_that_hangs_up_frees_its_slot(serve, stream):
    s = serve("llama", "-np", "1", "-c", "8192")
    c = raw_request(s.port, json.dumps({"messages": CONV, "max_tokens": 100000, "temperature": 0,
                                        "stream": stream}))
    assert wait_for(lambda: s.metrics()["thaw_slots_busy"] == 1, 30)
    c.close()
    assert wait_for(lambda: idle_slots(s), 30), "the slot kept generating for a client that left"
    assert wait_for(lambda: any("client went away" in line for line in s.lines), 5)
    assert s.chat(CONV, max_tokens=2)["choices"]


# ---- F6, F7, F7b: keys and tenants --------------------------------------------------

@pytest.mark.parametrize("value", ["", ",", "k1,", ",k1", "k1,,k2"])
def test_empty_api_key_refuses_to_start(models, value):
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "--port", "0", "--api-key", value],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "empty" in p.stderr, p.stderr


def auth(k):
    return {"Authorization": f"Bearer {k}"}


def chat_as(s, key, messages, max_tokens=8):
    r = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
               headers=auth(key) if key else None)
    assert r.status_code == 200, r.text
    return r.json()


def test_namespaces_follow_the_key_not_its_position(serve, tmp_path):
    conv = conversation(0, 300)
    flags = ["-np", "1", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    s = serve("llama", *flags, "--api-key", "alpha,beta")
    r1 = chat_as(s, "alpha", conv)
    s.stop()
    t2 = turn2(conv, r1, 1)
    # F7: reordered keys used to move tenants into each other's namespace
    s = serve("llama", *flags, "--api-key", "beta,alpha")
    other = chat_as(s, "beta", t2)
    assert other["cache_source"] == "none"  # beta never sees alpha's state
    s.stop()
    s = serve("llama", *flags, "--api-key", "gamma,beta,alpha")
    own = chat_as(s, "alpha", t2)
    assert own["cache_source"] == "disk" and own["timings"]["cache_n"] > 300
    s.stop()
    # removed key: its conversations are gone for whoever takes its place
    s = serve("llama", *flags, "--api-key", "delta")
    assert chat_as(s, "delta", t2)["cache_source"] == "none"
    s.stop()
    s = serve("llama", *flags)  # no keys at all: the anonymous namespace
    assert chat_as(s, None, t2)["cache_source"] == "none"


def test_slot_prefix_is_not_shared_across_tenants(serve):
    # F7b: tenant B used to reuse tenant A's slot prefix (hits and timing leak)
    s = serve("llama", "-np", "1", "--api-key", "alpha,beta")
    conv = conversation(1, 200)
    a1 = chat_as(s, "alpha", conv)
    b = chat_as(s, "beta", conv)
    assert b["timings"]["cache_n"] == 0
    a2 = chat_as(s, "alpha", conv)
    assert a2["timings"]["cache_n"] == 0  # beta's turn took the slot: nothing of alpha left to reuse
    assert reply(a1) == reply(a2)
    a3 = chat_as(s, "alpha", conv)
    assert a3["timings"]["cache_n"] > 0  # within one tenant the prefix is reused as before


def test_wrong_bearer_forms_are_refused(serve):
    s = serve("llama", "--api-key", "secret")
    for h in ({"Authorization": "Bearer "}, {"Authorization": "Bearer secre"}, {"Authorization": "Bearer secrets"},
              {"Authorization": "secret"}, {"Authorization": "Basic secret"}, {}):
        r = s.post("/v1/chat/completions", {"messages": CONV, "max_tokens": 1}, headers=h)
        assert r.status_code == 401, h
    assert chat_as(s, "secret", CONV, 1)["choices"]


# ---- F8: a cache directory in use ----------------------------------------------------

def test_second_server_on_a_cache_dir_in_use_says_so(serve, models, tmp_path):
    serve("llama", *kv_flags(tmp_path))
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "--port", "0", *kv_flags(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "in use" in p.stderr and "queue full" not in p.stderr, p.stderr
