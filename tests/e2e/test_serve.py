"""thaw serve end to end: the real binary, a generated model, real HTTP."""
import concurrent.futures as cf
import signal
import threading
import time

import pytest

from harness import assistant, placement, system, user

CONV = [system("You are a terse assistant."), user("Tell me about the sea and the sky.")]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_is_deterministic_across_runs_and_streaming(serve, arch):
    s1 = serve(arch, "-np", "1", "-c", "1024")
    a = s1.chat(CONV, max_tokens=24)
    assert s1.stop() == 0
    s2 = serve(arch, "-np", "1", "-c", "1024")
    b = s2.chat(CONV, max_tokens=24)
    text, final, usage, chunks = s2.chat_stream(CONV, max_tokens=24)
    content = a["choices"][0]["message"]["content"]
    assert content, "the model produced no text"
    assert b["choices"][0]["message"]["content"] == content
    assert text == content
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert final["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
    assert usage is None  # not asked for
    assert s2.stop() == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_response_shape(serve, arch):
    s = serve(arch)
    r = s.chat(CONV, max_tokens=8)
    assert r["object"] == "chat.completion"
    assert r["id"].startswith("chatcmpl-")
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    t = r["timings"]
    for k in ("cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
              "predicted_per_second", "restore_ms"):
        assert k in t, k
    # numbers only, as llama-server's (a client may decode them so); what
    # served the cache is beside them
    assert all(isinstance(v, (int, float)) for v in t.values()), t
    assert r["cache_source"] == "none"
    u = r["usage"]
    assert u["prompt_tokens"] == t["prompt_n"] + t["cache_n"]
    assert u["completion_tokens"] == t["predicted_n"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
    if r["choices"][0]["finish_reason"] == "length":
        assert t["predicted_n"] == 8


def test_stream_usage_chunk(serve):
    s = serve("llama")
    text, final, usage, chunks = s.chat_stream(CONV, max_tokens=6, stream_options={"include_usage": True})
    assert usage is not None and usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == final["timings"]["predicted_n"]
    assert "timings" in final


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_concurrent_equals_sequential(serve, arch):
    convs = [[system(f"Persona number {i}."), user(f"Question {i}: what is {i} plus {i}?")] for i in range(4)]
    s = serve(arch, "-np", "2", "-c", "2048", "--no-cache-prompt")
    sequential = [s.chat(c, max_tokens=20)["choices"][0]["message"]["content"] for c in convs]
    with cf.ThreadPoolExecutor(4) as ex:
        concurrent = list(ex.map(lambda c: s.chat(c, max_tokens=20)["choices"][0]["message"]["content"], convs))
    assert concurrent == sequential
    m = s.metrics()
    # four concurrent requests over two slots shared llama_decode calls
    assert m["thaw_chat_requests_total"] == 8


def test_a_prompt_beside_a_stream_goes_one_micro_batch_a_step(serve):
    """A long prompt admitted while another request streams is decoded one
    micro-batch (-ub) a step, each step carrying the stream's next token:
    the stream keeps flowing through the prefill instead of waiting for
    the whole batch (-b) at once."""
    s = serve("llama", "-np", "2", "-c", "4096", "-b", "1024", "-ub", "128")
    stamps, going = [], threading.Event()

    def stream():
        body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "temperature": 0, "stream": True}
        with s.post("/completion", body, stream=True) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    stamps.append(time.perf_counter())
                    if len(stamps) == 5:
                        going.set()

    th = threading.Thread(target=stream)
    th.start()
    assert going.wait(120)
    prompt = " ".join(f"word{i % 50} river" for i in range(300))
    t0 = time.perf_counter()
    r = s.post("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": False})
    t1 = time.perf_counter()
    th.join(120)
    assert r.status_code == 200, r.text
    n = r.json()["timings"]["prompt_n"]
    assert 800 <= n <= 1024  # one batch would take it whole
    assert stamps[-1] > t1, "the stream ended before the prompt was in"
    during = sum(t0 < t < t1 for t in stamps)
    # ceil(n / 128) steps, each with a token of the stream (one batch: 1 or 2)
    assert during >= n // 128 - 2, (during, n)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_repeated_prompt_reuses_slot_prefix(serve, arch):
    s = serve(arch, "-np", "1")
    first = s.chat(CONV, max_tokens=8)
    second = s.chat(CONV, max_tokens=8)
    assert first["timings"]["cache_n"] == 0
    assert second["timings"]["cache_n"] > 0
    assert second["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    assert second["cache_source"] == "slot"
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_follow_up_turn_reuses_conversation(serve):
    s = serve("llama", "-np", "1")
    r1 = s.chat(CONV, max_tokens=12)
    turn2 = CONV + [assistant(r1["choices"][0]["message"]["content"]), user("And the mountains?")]
    r2 = s.chat(turn2, max_tokens=8)
    assert r2["timings"]["cache_n"] >= r1["usage"]["prompt_tokens"]


def test_no_cache_prompt_prefills_everything(serve):
    s = serve("llama", "-np", "1", "--no-cache-prompt")
    s.chat(CONV, max_tokens=4)
    r = s.chat(CONV, max_tokens=4)
    assert r["timings"]["cache_n"] == 0
    r = s.chat(CONV, max_tokens=4, cache_prompt=True)
    assert r["timings"]["cache_n"] > 0  # the request's own cache_prompt wins


def test_stop_strings_and_array_content(serve):
    s = serve("llama")
    full = s.chat(CONV, max_tokens=24)["choices"][0]["message"]["content"]
    assert len(full) > 6
    cut = full[3:6]
    r = s.chat(CONV, max_tokens=24, stop=[cut])
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == full[:full.index(cut)]
    parts = [system("You are a terse assistant."),
             {"role": "user", "content": [{"type": "text", "text": "Tell me about the sea "},
                                          {"type": "text", "text": "and the sky."}]}]
    # text parts reach the template as parts (llama.cpp's chat library joins
    # them as the template does, as llama-server passes them): the reply is
    # that prompt's, completed raw by the same server
    prompt = s.post("/apply-template", {"messages": parts}).json()["prompt"]
    assert "Tell me about the sea " in prompt and "and the sky." in prompt
    raw = s.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0}).json()["content"]
    assert s.chat(parts, max_tokens=8)["choices"][0]["message"]["content"] == raw
    text, final, _, _ = s.chat_stream(CONV, max_tokens=24, stop=cut)
    assert text == full[:full.index(cut)]


def test_sampling_with_seed_is_reproducible(serve):
    s = serve("llama")
    kw = dict(temperature=1.0, top_k=40, top_p=0.9, min_p=0.01, seed=1234, max_tokens=16)
    a = s.chat(CONV, **kw)["choices"][0]["message"]["content"]
    b = s.chat(CONV, **kw)["choices"][0]["message"]["content"]
    assert a == b


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b"[]", 400, "JSON object"),
    (b"{}", 400, "'messages' is required"),
    (b'{"messages": "hi"}', 400, "'messages' must be an array"),
    (b'{"messages": []}', 400, "must not be empty"),
    (b'{"messages": [{"role": "user"}]}', 400, "messages[0].content"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400, "content[0].image_url.url"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}', 400, "'max_tokens'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 9}', 400, "'temperature'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "'stream'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', 400, "stop[0]"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_k": 1.5}', 400, "'top_k'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 9}', 400, "'n'"),
    (b'{"messages": [{"role": "user", "content": "\\u0000x"}], "x": 1, "x": 2}', 400, "not valid JSON"),
]


@pytest.mark.parametrize("body,status,needle", BAD)
def test_bad_requests_get_clear_errors(serve, body, status, needle):
    s = serve("llama", "--max-body", "65536")
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"]
    assert err["code"] == status and err["type"] == "invalid_request_error"
    assert s.chat(CONV, max_tokens=2)["choices"]  # still serving


def test_routes_methods_size_and_context_errors(serve):
    s = serve("llama", "-c", "256", "--max-body", "4096")
    assert s.get("/nope").status_code == 404
    assert s.get("/nope").json()["error"]["code"] == 404
    r = s.get("/v1/chat/completions")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert s.post("/v1/models", b"{}").status_code == 405
    r = s.post("/v1/chat/completions", b"{" + b" " * 10000 + b"}")
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
    long = [user("word " * 600)]
    r = s.post("/v1/chat/completions", {"messages": long})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    models = s.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "llama.gguf"
    assert s.get("/health").json() == {"status": "ok"}
    assert s.chat(CONV, max_tokens=2)["choices"]


def test_api_keys(serve):
    s = serve("llama", "--api-key", "k1,k2", "--alias", "tiny")
    assert s.get("/health").status_code == 200  # public
    r = s.post("/v1/chat/completions", {"messages": CONV})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert s.post("/v1/chat/completions", {"messages": CONV},
                  headers={"Authorization": "Bearer k3"}).status_code == 401
    assert s.get("/metrics").status_code == 401
    for k in ("k1", "k2"):
        r = s.post("/v1/chat/completions", {"messages": CONV, "max_tokens": 2},
                   headers={"Authorization": f"Bearer {k}"})
        assert r.status_code == 200 and r.json()["model"] == "tiny"


def test_queue_full_gets_503(serve):
    s = serve("llama", "-np", "1", "--max-queue", "1")
    body = {"messages": CONV, "max_tokens": 200, "temperature": 0}
    with cf.ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(s.post, "/v1/chat/completions", body) for _ in range(6)]
        codes = sorted(f.result().status_code for f in futs)
    assert 503 in codes and 200 in codes
    busy = [f.result() for f in futs if f.result().status_code == 503][0]
    assert "busy" in busy.json()["error"]["message"]
    assert s.chat(CONV, max_tokens=2)["choices"]


def test_metrics(serve):
    s = serve("llama", "-np", "2", "--metrics")
    s.chat(CONV, max_tokens=5)
    # after replying, a slot stays busy while it stores the conversation
    # (FIXUP + capture): wait, boundedly, for it to come free
    import time
    for _ in range(100):
        m = s.metrics()
        if m["thaw_slots_busy"] == 0:
            break
        time.sleep(0.05)
    assert m["thaw_predicted_tokens_total"] >= 1
    assert m["thaw_prompt_tokens_total"] >= 1
    assert m["thaw_slots_total"] == 2
    assert m["thaw_slots_busy"] == 0
    assert m["thaw_queue_depth"] == 0
    assert m["thaw_requests_total"] >= 1
    assert m["thaw_requests_errors_total"] == 0  # a chat waiting for the engine is not an error
    assert m["thaw_decode_calls_total"] >= 1


def test_sigterm_mid_stream_shuts_down_cleanly(serve):
    s = serve("llama", "-np", "1")
    r = s.post("/v1/chat/completions", {"messages": CONV, "stream": True, "max_tokens": 100000}, stream=True)
    it = r.iter_lines()
    next(it)  # role chunk arrived: generation is under way
    assert s.stop(signal.SIGTERM) == 0
    rest = b"\n".join(line for line in it)
    assert b"shutting down" in rest or b"[DONE]" in rest
    assert "shutting down" in s.log()


def test_client_disconnect_frees_the_slot(serve):
    s = serve("llama", "-np", "1")
    r = s.post("/v1/chat/completions", {"messages": CONV, "stream": True, "max_tokens": 100000}, stream=True)
    next(r.iter_lines())
    r.close()
    # the only slot must come free for the next request
    assert s.chat(CONV, max_tokens=2)["choices"]


def test_bad_flags_exit_with_a_message(models):
    import subprocess
    from harness import THAW
    for args, needle in [(["-np", "0"], "-np"), (["--port", "x"], "--port"), (["--bogus"], "unknown flag"), ([], "no model")]:
        p = subprocess.run([THAW, "serve", *( ["-m", models["llama"]] if args else []), *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and needle in p.stderr, p.stderr
    p = subprocess.run([THAW, "serve", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--kv-cache-dir" in p.stdout and "--slot-prompt-similarity" in p.stdout
    p = subprocess.run([THAW, "serve", "-m", "/nonexistent.gguf"], capture_output=True, text=True)
    assert p.returncode != 0 and "nonexistent" in p.stderr


def test_props_and_the_log_say_where_the_model_sits(serve):
    """GET /props' placement and the start-up log: every layer, the output,
    the KV cache and the compute buffers in host memory (-dev none: so on a
    machine with a GPU too; on a device: tests/e2e/test_vulkan.py)."""
    s = serve("llama", "-np", "2", "-c", "1024", "-dev", "none")
    pl = placement(s)
    host = pl["places"]["host"]
    assert pl["n_layer"] == 2 and host["layers"] == "0-1" and host["n_layers"] == 2 and host["output"], pl
    assert pl["kv_cache"] == "host" and pl["split_layers"] == "" and host["host"], pl
    # 1024 cells x 2 layers x (K + V) x 2 KV heads x 16 wide x 2 bytes (f16)
    assert host["kv_bytes"] == 1024 * 2 * 2 * 2 * 16 * 2, pl
    assert host["weights_bytes"] > 16_000_000 and host["compute_bytes"] > 0, pl
    for name, p in pl["places"].items():  # a device, if ggml offers one: nothing on it
        assert name == "host" or (p["n_layers"] == 0 and p["kv_bytes"] == 0 and p["weights_bytes"] == 0), pl
    assert "placement: host: layers 0-1 of 2, output; weights " in s.log()
    assert "KV cache 256.0 KiB" in s.log()
