"""llama-server's server options on thaw: TLS (--ssl-key-file /
--ssl-cert-file, a self-signed certificate made here by openssl), GET
/slots (--slots / --no-slots) reflecting a conversation restored from
disk, --api-prefix, --sse-ping-interval, and the request defaults
--grammar, --grammar-file, -j / --json-schema. Each asserts what the option
changes, for any weights (a grammar's output is checked against the
grammar, never against fixed text)."""
import http.client
import json
import subprocess
import time

import pytest
import requests

from harness import Server, chat, reply, text


def cert(tmp_path):
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return str(key), str(crt)


def test_tls_serves_https_and_refuses_plain_http(serve, tmp_path):
    key, crt = cert(tmp_path)
    s = serve("llama", "--ssl-key-file", key, "--ssl-cert-file", crt)
    assert s.url.startswith("https://")
    assert requests.get(s.url + "/health", verify=crt, timeout=30).json() == {"status": "ok"}
    r = requests.post(s.url + "/v1/chat/completions", verify=crt, timeout=120,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    # plain HTTP on the same port gets no HTTP answer
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{s.port}/health", timeout=30)
    # and a certificate the client does not trust is refused by the client
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(s.url + "/health", timeout=30)


def test_tls_needs_both_files(models, tmp_path):
    key, _ = cert(tmp_path)
    with pytest.raises(RuntimeError, match="both --ssl-key-file and --ssl-cert-file"):
        Server(models["llama"], "--ssl-key-file", key)
    with pytest.raises(RuntimeError, match="cannot read --ssl-cert-file"):
        Server(models["llama"], "--ssl-key-file", key, "--ssl-cert-file", str(tmp_path / "none.pem"))


def drained_as(s, headers, timeout=60):
    """drained() for a server with API keys (/metrics needs one)."""
    deadline = time.time() + timeout
    while True:
        m = {}
        for line in s.get("/metrics", headers=headers).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.split(" ")
                m[k] = float(v)
        if m["thaw_slots_busy"] == 0 and m["thaw_kv_disk_queue_bytes"] == 0:
            return m
        assert time.time() < deadline, "the disk writer did not drain"
        time.sleep(0.05)


def test_slots_reflect_a_restored_conversation(serve, tmp_path):
    flags = ["-np", "1", "-c", "4096", "--kv-cache-dir", str(tmp_path), "--cache-ram", "0",
             "--kv-cache-min-tokens", "1", "--api-key", "alice,bob"]
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    first = "Remember the lighthouse keeper " + text(40, 7)
    conv = [{"role": "user", "content": first}]
    s = serve("llama", *flags)
    r1 = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0}, headers=alice).json()
    drained_as(s, alice)
    s.stop()
    s = serve("llama", *flags)
    slots = s.get("/slots", headers=alice).json()
    assert len(slots) == 1 and slots[0]["id"] == 0 and slots[0]["prompt"] == ""  # a fresh process holds nothing
    conv += [{"role": "assistant", "content": reply(r1)}, {"role": "user", "content": "And the boat?"}]
    r2 = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0}, headers=alice).json()
    assert r2["cache_source"] == "disk", r2["timings"]
    drained_as(s, alice)
    sl = s.get("/slots", headers=alice).json()[0]
    assert sl["is_processing"] is False and sl["n_ctx"] == 4096
    assert sl["thaw"]["cache_source"] == "disk" and sl["thaw"]["stored_to"] == "disk"
    assert sl["n_prompt_tokens"] == r2["usage"]["prompt_tokens"]
    assert sl["n_prompt_tokens_cache"] == r2["timings"]["cache_n"] > 0
    assert "lighthouse keeper" in sl["prompt"] and "And the boat?" in sl["prompt"]
    # another tenant sees the slot, not the conversation
    other = s.get("/slots", headers=bob).json()[0]
    assert other["prompt"] == "" and other["thaw"]["n_tokens"] == 0
    assert s.get("/slots").status_code == 401


def test_no_slots_answers_501(serve):
    s = serve("llama", "--no-slots")
    r = s.get("/slots")
    assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]


def test_api_prefix_serves_every_route_under_it_only(serve):
    s = serve("llama", "--api-prefix", "/llm")
    assert s.get("/llm/health").json() == {"status": "ok"}
    assert s.get("/llm/v1/models").status_code == 200
    r = s.post("/llm/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200
    assert s.post("/llm/completion", {"prompt": "hi", "n_predict": 2}).status_code == 200
    for path in ("/health", "/v1/models", "/llmx/health"):
        assert s.get(path).status_code == 404, path


def test_api_prefix_must_be_a_path(models):
    with pytest.raises(RuntimeError, match="--api-prefix must start with '/'"):
        Server(models["llama"], "--api-prefix", "llm/")


def test_sse_ping_keeps_a_waiting_stream_alive(serve):
    """One slot busy with an endless reply: a second stream waits in the
    queue, silent; with --sse-ping-interval 1 it gets SSE comments until
    the first client hangs up, then its reply."""
    s = serve("llama", "-np", "1", "--ignore-eos", "--sse-ping-interval", "1")
    # held open with its own connection (requests.post closes its session's)
    blocker = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    blocker.request("POST", "/completion", json.dumps({"prompt": "hi", "n_predict": 100000, "stream": True}))
    br = blocker.getresponse()
    assert br.readline().startswith(b"data: ")  # it is generating
    waiting = s.post("/v1/completions", {"prompt": "ho", "max_tokens": 3, "stream": True}, stream=True)
    lines = waiting.iter_lines(decode_unicode=True)
    first = next(line for line in lines if line)
    assert first == ":", first  # a comment before any event: the request is still queued
    blocker.close()
    rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[0][6:])["object"] == "text_completion"


def test_grammar_and_json_schema_defaults(serve, tmp_path):
    yes_no = 'root ::= "yes" | "no"'
    s = serve("llama", "--grammar", yes_no)
    msgs = [{"role": "user", "content": "Is it? " + text(10, 8)}]
    assert reply(chat(s, msgs, 8)) in ("yes", "no")
    assert s.post("/completion", {"prompt": "Is it?", "n_predict": 8}).json()["content"] in ("yes", "no")
    # a request's own constraint wins over the default
    r = s.post("/completion", {"prompt": "Is it?", "n_predict": 8, "grammar": 'root ::= "maybe"'}).json()
    assert r["content"] == "maybe"
    s.stop()
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "up" | "down"\n')
    s = serve("llama", "--grammar-file", str(g))
    assert reply(chat(s, msgs, 8)) in ("up", "down")
    s.stop()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    s = serve("llama", "-j", json.dumps(schema))
    r = s.post("/completion", {"prompt": "Data:", "n_predict": 64}).json()
    assert r["content"].lstrip().startswith("{")
    if r["stop_type"] == "eos":
        assert isinstance(json.loads(r["content"])["n"], int)
    c = reply(chat(s, msgs, 64))
    assert c.lstrip().startswith("{")


def test_response_format_under_no_jinja_is_a_grammar(serve):
    s = serve("llama", "--no-jinja")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "data"}], "max_tokens": 64,
                                        "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].lstrip().startswith("{")
    # tools still need the Jinja renderer
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "data"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert r.status_code == 400 and "Jinja" in r.json()["error"]["message"]


def test_v1_models_has_llama_servers_fields(serve):
    s = serve("llama", "--alias", "tiny")
    m = s.get("/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "tiny"
    d = m["data"][0]
    assert d["object"] == "model" and d["owned_by"] and "aliases" in d
    for k in ("n_vocab", "n_ctx_train", "n_embd", "n_params", "size", "n_ctx"):
        assert k in d["meta"], k
    assert m["models"][0]["name"] == "tiny" and m["models"][0]["model"] == "tiny"


def test_tokenize_pieces_are_each_tokens_bytes(serve):
    """/tokenize with_pieces, as llama-server: every token's piece, a
    leading space kept, and a piece that is not UTF-8 (part of a character)
    as its bytes; the pieces put together are the text."""
    s = serve("llama")
    content = "This is a test string with unicode 媽 and emoji 🤗"
    toks = s.post("/tokenize", {"content": content, "with_pieces": True}).json()["tokens"]
    assert len(toks) == len(s.post("/tokenize", {"content": content}).json()["tokens"])
    raw = b"".join(bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode() for t in toks)
    assert raw == content.encode()
    assert any(isinstance(t["piece"], list) for t in toks)  # the emoji's bytes span tokens
    assert any(isinstance(t["piece"], str) and t["piece"].startswith(" ") for t in toks)


def test_a_prompt_over_the_context_says_by_how_much(serve):
    """llama-server's exceed_context_size_error, with n_prompt_tokens and a
    slot's n_ctx, on chat and on raw completions."""
    s = serve("llama", "-c", "512", "-np", "2")
    msgs = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}] * 40
    for path, body in (("/v1/chat/completions", {"messages": msgs}),
                       ("/v1/completions", {"prompt": "What is the best book " * 60})):
        e = s.post(path, body).json()["error"]
        assert e["type"] == "exceed_context_size_error" and e["code"] == 400, e
        assert e["n_ctx"] == 256 and e["n_prompt_tokens"] > 256


def test_with_keys_an_unknown_path_is_401_not_404(serve):
    s = serve("llama", "--api-key", "k1")
    assert s.get("/nope").status_code == 401
    assert s.get("/nope", headers={"Authorization": "Bearer k1"}).status_code == 404
    assert s.get("/health").status_code == 200


def test_reasoning_off_and_on_reach_the_template(serve, tmp_path):
    from harness import mkmodel
    q = mkmodel(tmp_path / "qwen3.gguf", "--arch", "qwen3", "--seed", "3")
    prompts = {}
    for mode in ("on", "off"):
        s = serve(q, "--reasoning", mode)
        prompts[mode] = s.post("/apply-template", {"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
        s.stop()
    # Qwen3's template closes an empty think block when thinking is off
    assert "<think>\n\n</think>" in prompts["off"] and "<think>\n\n</think>" not in prompts["on"]
