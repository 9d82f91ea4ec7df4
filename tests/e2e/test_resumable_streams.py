"""Resumable streams (llama-server's /v1/stream): a streamed reply sent
with X-Conversation-Id is kept under that id, goes on when its client
leaves (a page reload), and GET /v1/stream?conv_id=ID&from=N reads it
again from byte N, live to its end; DELETE /v1/stream stops it (a request
still waiting for its model too); POST /v1/streams/lookup tells only the
ids a client names. The reference for the text is the same request
streamed whole on the same server, back to back."""
import json
import socket
import time

import requests

from harness import Server, mkmodel

BODY = {"messages": [{"role": "user", "content": "Count to a thousand, slowly."}], "max_tokens": 120,
        "temperature": 0, "stream": True, "ignore_eos": True}


def text_of(raw):
    out = ""
    for ln in raw.decode().split("\n"):
        if ln.startswith("data: ") and ln[6:] != "[DONE]":
            d = json.loads(ln[6:])
            if d.get("choices"):
                out += d["choices"][0]["delta"].get("content") or ""
    return out


def leave_early(s, conv, body):
    """Sends a streamed request, reads its first bytes and hangs up: what it got."""
    b = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"X-Conversation-Id: " + conv.encode() + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                 % len(b) + b)
    got = sock.recv(200)
    sock.close()
    return got


def stream(s, conv, **q):
    return requests.get(s.url + "/v1/stream", params={"conv_id": conv, **q}, timeout=60)


def lookup(s, *ids):
    r = s.post("/v1/streams/lookup", {"conversation_ids": list(ids)})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_reply_goes_on_after_its_client_left_and_replays(tmp_path):
    model = mkmodel(tmp_path / "llama.gguf", "--arch", "llama", "--seed", "5")
    s = Server(model, "-np", "2", "-c", "2048")
    try:
        ref = s.post("/v1/chat/completions", BODY, stream=True)
        want = text_of(b"".join(ref.iter_content(None)))
        assert len(want) > 100

        got = leave_early(s, "chat-1::m", BODY)
        assert got.startswith(b"HTTP/1.1 200")
        deadline = time.time() + 60
        while not lookup(s, "chat-1")[0]["is_done"]:  # "<id>::<model>" matches its id
            assert time.time() < deadline, "the reply did not go on to its end"
            time.sleep(0.1)
        assert "its reply goes on into its replay" in s.log()
        whole = stream(s, "chat-1::m", **{"from": 0})
        assert whole.status_code == 200 and whole.headers["Content-Type"].startswith("text/event-stream")
        assert text_of(whole.content) == want  # the whole reply, as the reference's
        assert whole.content.rstrip().endswith(b"data: [DONE]")
        assert stream(s, "chat-1::m", **{"from": 50}).content == whole.content[50:]
        [info] = lookup(s, "chat-1::m", "someone-else")
        assert info["total_bytes"] == len(whole.content) and info["completed_at"] >= info["started_at"] > 0
        assert lookup(s, "someone-else", "chat") == []  # only ids the client names, whole ones

        # a live reader follows the reply to its end
        t0 = s.post("/v1/chat/completions", BODY, headers={"X-Conversation-Id": "chat-2"}, stream=True)
        first = next(t0.iter_content(None))
        live = stream(s, "chat-2", **{"from": len(first)})
        assert text_of(first + live.content) == want
        t0.close()

        # the errors
        assert stream(s, "nobody").status_code == 404
        assert stream(s, "").status_code == 400
        assert stream(s, "chat-1::m", **{"from": "x"}).status_code == 400
        assert s.post("/v1/streams/lookup", "not json").status_code == 400
    finally:
        s.kill()


def test_delete_stops_a_reply_and_forgets_it(tmp_path):
    model = mkmodel(tmp_path / "llama.gguf", "--arch", "llama", "--seed", "5")
    s = Server(model, "-np", "1", "-c", "4096")
    try:
        r = s.post("/v1/chat/completions", {**BODY, "max_tokens": 3000}, headers={"X-Conversation-Id": "c"},
                   stream=True)
        it = r.iter_content(None)
        next(it)
        d = requests.delete(s.url + "/v1/stream", params={"conv_id": "c"}, timeout=60)
        assert d.status_code == 204
        rest = b"".join(it)
        assert b"cancelled" in rest[-200:]  # the stream ends there
        assert stream(s, "c").status_code == 404
        assert requests.delete(s.url + "/v1/stream", params={"conv_id": "c"}, timeout=60).status_code == 204
        # a new stream under an id replaces the one before it
        leave_early(s, "c", {**BODY, "max_tokens": 3000})
        leave_early(s, "c", BODY)
        deadline = time.time() + 60
        while not lookup(s, "c")[0]["is_done"]:
            assert time.time() < deadline
            time.sleep(0.1)
        assert len(lookup(s, "c")) == 1
        # the slot is free again: the replaced reply was stopped
        assert s.chat([{"role": "user", "content": "hi"}], max_tokens=2)["choices"]
    finally:
        s.kill()


def test_a_request_waiting_for_its_model_answers_503_to_readers_and_is_cancelled(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    mkmodel(d / "alpha.gguf", "--arch", "llama", "--seed", "11")
    # the test hook holds a routed request 2 s with its model, before its route runs
    s = Server(None, "--models-dir", str(d), env={"THAW_TEST_ROUTE_HOLD_MS": "2000"})
    try:
        out = {}

        def post():
            out["r"] = s.post("/v1/chat/completions", {**BODY, "model": "alpha"},
                              headers={"X-Conversation-Id": "w"}, stream=True)

        import threading
        t = threading.Thread(target=post)
        t.start()
        deadline = time.time() + 30
        while not lookup(s, "w"):
            assert time.time() < deadline
            time.sleep(0.02)
        assert stream(s, "w").status_code == 503  # retry later: its model is not serving it yet
        assert requests.delete(s.url + "/v1/stream", params={"conv_id": "w"}, timeout=60).status_code == 204
        t.join(60)
        r = out["r"]
        assert r.status_code == 400 and "cancelled" in r.text, r.text
        assert stream(s, "w").status_code == 404
    finally:
        s.kill()
