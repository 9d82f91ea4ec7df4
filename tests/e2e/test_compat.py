"""llama-server parity on the fields llama.cpp's own server tests check
(tests/compat/run-upstream runs those): system_fingerprint, assistant
prefill and continue_final_message, add_generation_prompt, __verbose,
stop_type "word", tools and schemas in the client's key order, id_slot,
return_progress and CORS. Generated models (random weights, a real
tokenizer and template), so outputs are compared with a reference served
by the same server, never with fixed text."""
import json
import os
import re

import pytest

from harness import REPO, mkmodel, system, user

TEMPLATES = os.path.join(REPO, ".deps", "llama.cpp", "models", "templates")
LLAMA31 = os.path.join(TEMPLATES, "meta-llama-Llama-3.1-8B-Instruct.jinja")
ASSISTANT_OPEN = "<|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.fixture(scope="module")
def compat_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("compat")
    return {
        "llama3.1": mkmodel(d / "llama31.gguf", "--arch", "llama", "--chat-template-file", LLAMA31, "--seed", "3"),
        "qwen3": mkmodel(d / "qwen3.gguf", "--arch", "qwen3", "--seed", "3"),
    }


def events(resp):
    out = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line[6:] != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


BOOK = [system("Book"), user("What is the best book")]


def test_system_fingerprint_is_llama_servers_build(serve):
    s = serve("llama")
    fp = s.chat(BOOK, max_tokens=2)["system_fingerprint"]
    assert re.fullmatch(r"b\d+-\S+", fp), fp
    r = s.post("/v1/chat/completions", {"messages": BOOK, "max_tokens": 2, "stream": True,
                                        "stream_options": {"include_usage": True}}, stream=True)
    chunks = events(r)
    assert chunks and all(c["system_fingerprint"] == fp for c in chunks)
    r = s.post("/v1/completions", {"prompt": "Once upon", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["system_fingerprint"] == fp


def test_assistant_prefill_is_continued(serve, compat_models):
    s = serve(compat_models["llama3.1"])
    prefill = BOOK + [{"role": "assistant", "content": "Whill"}]
    r = s.post("/apply-template", {"messages": prefill})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt.endswith("What is the best book<|eot_id|>" + ASSISTANT_OPEN + "Whill"), prompt
    # the explicit vLLM/transformers spelling renders the same prompt
    r = s.post("/apply-template", {"messages": prefill, "add_generation_prompt": False,
                                   "continue_final_message": True})
    assert r.status_code == 200 and r.json()["prompt"] == prompt
    # the chat reply goes on from the prefill: the same greedy text as the
    # rendered prompt completed raw by the same server; the message comes
    # back whole, prefill included (llama.cpp's chat library parses it back
    # in, as llama-server answers)
    chat = s.chat(prefill, max_tokens=8)["choices"][0]["message"]["content"]
    raw = s.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0})
    assert raw.status_code == 200, raw.text
    assert chat == "Whill" + raw.json()["content"]
    # a prefill in text parts reaches the template as parts (the library
    # joins them as the template wants, as llama-server passes them)
    parts = BOOK + [{"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]}]
    r = s.post("/apply-template", {"messages": parts})
    assert r.status_code == 200 and r.json()["prompt"].endswith(ASSISTANT_OPEN + "Wh\n\nill"), r.text
    # without the prefill the generation prompt closes nothing: another prompt
    plain = s.post("/apply-template", {"messages": BOOK}).json()["prompt"]
    assert plain.endswith(ASSISTANT_OPEN) and plain + "Whill" == prompt


@pytest.mark.parametrize("body", [
    {"messages": BOOK + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
    {"messages": [user("Hi"), {"role": "assistant", "content": "Hello"}], "add_generation_prompt": True,
     "continue_final_message": True},
    {"messages": [user("Hi"), {"role": "assistant", "content": "Hello"}], "add_generation_prompt": True},
    {"messages": BOOK, "continue_final_message": True},
], ids=["two-trailing-assistants", "both-true", "prefill-with-generation-prompt", "nothing-to-continue"])
def test_continuation_conflicts_are_400(serve, body):
    s = serve("llama")
    for path in ("/v1/chat/completions", "/apply-template"):
        r = s.post(path, {**body, "max_tokens": 2})
        assert r.status_code == 400, (path, r.text)


def test_apply_template_honours_add_generation_prompt(serve, compat_models):
    s = serve(compat_models["llama3.1"])
    on = s.post("/apply-template", {"messages": BOOK}).json()["prompt"]
    off = s.post("/apply-template", {"messages": BOOK, "add_generation_prompt": False}).json()["prompt"]
    assert on.endswith(ASSISTANT_OPEN)
    assert not off.endswith(ASSISTANT_OPEN) and on == off + ASSISTANT_OPEN


def test_verbose_shows_the_prompt(serve, compat_models):
    s = serve(compat_models["llama3.1"])
    prompt = s.post("/apply-template", {"messages": BOOK}).json()["prompt"]
    r = s.post("/v1/chat/completions", {"messages": BOOK, "max_tokens": 2, "verbose": True})
    v = r.json()["__verbose"]
    # each prompt token's text: the template's rendering as the model read it
    assert v["prompt"].endswith(prompt.split("<|start_header_id|>", 1)[1]), (v["prompt"], prompt)
    assert "What is the best book" in v["prompt"] and v["tokens_evaluated"] == r.json()["usage"]["prompt_tokens"]
    assert v["content"] == r.json()["choices"][0]["message"]["content"]
    assert "__verbose" not in s.chat(BOOK, max_tokens=2)
    # -v: on unless the request says no
    s2 = serve(compat_models["llama3.1"], "-v")
    assert "Book" in s2.chat(BOOK, max_tokens=2)["__verbose"]["prompt"]
    assert "__verbose" not in s2.chat(BOOK, max_tokens=2, verbose=False)


def test_completion_stop_type_word(serve):
    s = serve("llama")
    prompt = "The sea and the sky and the"
    free = s.post("/completion", {"prompt": prompt, "n_predict": 16, "temperature": 0}).json()
    assert free["stop_type"] in ("limit", "eos") and free["stopping_word"] == ""
    text = free["content"]
    word = text[len(text) // 2:len(text) // 2 + 3]
    assert word.strip(), text
    r = s.post("/completion", {"prompt": prompt, "n_predict": 16, "temperature": 0, "stop": [word]}).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == word, r
    assert text.startswith(r["content"]) and word not in r["content"]


def test_tools_and_schema_keep_the_clients_key_order(serve, compat_models):
    s = serve(compat_models["qwen3"])
    tool = {"type": "function", "function": {
        "name": "pick", "description": "Pick one",
        "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "string"}},
                       "required": ["zeta", "alpha"]}}}
    prompt = s.post("/apply-template", {"messages": [user("hi")], "tools": [tool]}).json()["prompt"]
    # Qwen3 prints each tool as JSON: as the client wrote it, not sorted
    assert prompt.index('"zeta"') < prompt.index('"alpha"'), prompt
    assert prompt.index('"name"') < prompt.index('"description"') < prompt.index('"parameters"')
    # a schema's property order is the reply's
    schema = {"type": "object", "properties": {"zz": {"enum": [1]}, "aa": {"enum": [2]}}, "required": ["zz", "aa"]}
    r = s.post("/v1/chat/completions", {"messages": [user("json")], "max_tokens": 60, "temperature": 0,
                                        "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "x", "schema": schema}}})
    out = r.json()["choices"][0]["message"]["content"]
    assert list(json.loads(out).keys()) == ["zz", "aa"], out


def preflight(s, origin, path="/v1/completions", headers="Authorization"):
    import requests
    return requests.options(s.url + path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                    "Access-Control-Request-Headers": headers}, timeout=30)


def test_cors_preflight(serve):
    # no --cors-origin: a preflight is answered (200, as llama-server), but
    # allows no origin, so the browser refuses the call; thaw does not open
    # the API to every web page by default as llama-server does (see README)
    s = serve("llama", "--api-key", "k")
    r = preflight(s, "http://localhost:8080")
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    assert preflight(s, "http://x", path="/no/such/route").status_code == 200  # before the key and the route
    # `localhost`: this machine's origins on any port, nothing that only looks like one
    s = serve("llama", "--cors-origin", "localhost,http://app.example")
    for origin in ("http://localhost", "http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080",
                   "https://localhost:8443", "http://app.example"):
        r = preflight(s, origin, headers="Authorization, x-stainless-os, anthropic-version")
        assert r.status_code == 200 and r.headers.get("Access-Control-Allow-Origin") == origin, (origin, r.headers)
        # the SDKs' own headers are allowed as asked (a fixed list would refuse them)
        assert r.headers["Access-Control-Allow-Headers"] == "Authorization, x-stainless-os, anthropic-version"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
    for origin in ("http://localhost.evil.com", "http://notlocalhost", "http://127.0.0.1.evil.com",
                   "http://localhost:80x", "http://evil.com"):
        r = preflight(s, origin)
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers, origin
    # the real request carries the origin back
    import requests
    r = requests.post(s.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 1},
                      headers={"Origin": "http://localhost:5173"}, timeout=60)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"


def test_slots_answer_when_a_slot_holds_bytes_no_character_makes(serve):
    # a prompt of token ids may be a lone byte token: /slots detokenizes
    # what each slot holds, which was then no valid UTF-8 and a 500
    s = serve("llama", "-np", "1", "-c", "1024")
    r = s.post("/completion", {"prompt": [229], "n_predict": 1})
    assert r.status_code == 200, r.text
    r = s.get("/slots")
    assert r.status_code == 200, r.text
    assert r.json()[0]["id"] == 0


def test_id_slot_runs_on_the_named_slot(serve):
    s = serve("llama", "-np", "2", "-c", "1024")
    a, b = "alpha " * 6 + "one", "beta " * 6 + "two"

    def slot_text():
        return {x["id"]: x["prompt"] or "" for x in s.get("/slots").json()}  # null: nothing held yet

    r = s.post("/completion", {"prompt": a, "n_predict": 2, "id_slot": 1})
    assert r.status_code == 200, r.text
    held = slot_text()
    assert a in held[1] and a not in held[0], held
    # the same prompt again, sent to slot 0: it runs there, although slot 1
    # holds it and would be chosen (its prefix)
    r = s.post("/completion", {"prompt": a, "n_predict": 2, "id_slot": 0})
    assert r.status_code == 200 and r.json()["tokens_cached"] == 0, r.text
    held = slot_text()
    assert a in held[0] and a in held[1]
    r = s.post("/v1/chat/completions", {"messages": [user(b)], "max_tokens": 2, "id_slot": 1})
    assert r.status_code == 200
    held = slot_text()
    assert b in held[1] and b not in held[0]
    r = s.post("/completion", {"prompt": a, "n_predict": 2, "id_slot": 2})
    assert r.status_code == 400 and "id_slot" in r.json()["error"]["message"]


def test_props_models_and_paths(serve, models):
    s = serve("llama", "--alias", "tiny-2,fim,code", "--tags", "chat,small", "-np", "2", "-c", "1024", "-s", "42",
              "--temp", "0.5")
    p = s.get("/props").json()
    assert p["model_path"] == models["llama"] and p["build_info"].startswith("b")
    g = p["default_generation_settings"]
    assert g["n_ctx"] == 512 and g["params"]["seed"] == 42 and abs(g["params"]["temperature"] - 0.5) < 1e-6
    d = s.get("/v1/models").json()["data"][0]
    assert set(d["aliases"]) == {"tiny-2", "fim", "code"} and d["id"] == "code" and d["tags"] == ["chat", "small"]
    # llama-server's paths: /completions is its own shape (only /v1/completions is OpenAI's)
    r = s.post("/completions", {"prompt": "Once", "n_predict": 2}).json()
    assert "content" in r and "choices" not in r
    r = s.post("/v1/chat/completions/input_tokens", {"messages": BOOK})
    assert r.status_code == 200
    n = r.json()["input_tokens"]
    assert n == s.chat(BOOK, max_tokens=1)["usage"]["prompt_tokens"]


def test_logit_bias_changes_the_reply(serve):
    s = serve("llama")

    def gen(**kw):
        r = s.post("/completion", {"prompt": "What is the best book", "n_predict": 6, "temperature": 0, **kw})
        assert r.status_code == 200, r.text
        return r.json()["content"]

    free = gen()
    first = s.post("/tokenize", {"content": free, "add_special": False}).json()["tokens"][0]
    piece = s.post("/tokenize", {"content": free, "add_special": False, "with_pieces": True}).json()["tokens"][0]
    for bias in ([[first, False]], [[first, -100]], {str(first): -100}):
        out = gen(logit_bias=bias)
        assert out != free and not out.startswith(piece["piece"] if isinstance(piece["piece"], str) else "\0"), bias
    # a text entry biases its tokens: banning the free reply's text changes it
    assert gen(logit_bias=[[free, False]]) != free
    # the chat API takes OpenAI's shape too
    a = s.chat(BOOK, max_tokens=4)["choices"][0]["message"]["content"]
    t = s.post("/tokenize", {"content": a, "add_special": False}).json()["tokens"][0]
    assert s.chat(BOOK, max_tokens=4, logit_bias={str(t): -100})["choices"][0]["message"]["content"] != a
    assert s.post("/completion", {"prompt": "x", "logit_bias": [["a", "b"]]}).status_code == 400
    assert s.post("/completion", {"prompt": "x", "logit_bias": [[10 ** 9, 1]]}).status_code == 400


def test_completion_response_fields(serve):
    s = serve("llama")
    prompt = "I believe the meaning of life is"
    full = s.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0}).json()
    assert full["generation_settings"]["n_predict"] == 8 and full["prompt"].endswith(prompt)
    r = s.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                               "response_fields": ["content", "generation_settings/n_predict", "prompt",
                                                   "timings/predicted_n", "no/such"]}).json()
    assert set(r) == {"content", "generation_settings/n_predict", "prompt", "timings/predicted_n"}, r
    assert r["content"] == full["content"] and r["generation_settings/n_predict"] == 8
    assert r["timings/predicted_n"] == full["tokens_predicted"]
    assert r["prompt"].endswith(prompt) and len(r["prompt"]) > len(prompt)  # BOS rendered, as llama-server


def test_generation_settings_list_the_logit_biases(serve):
    """/completion's generation_settings.logit_bias, as llama-server's:
    the request's biases, and with ignore_eos every end-of-generation token
    banned (bias null: -inf); none without."""
    s = serve("llama")
    body = {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0}
    assert s.post("/completion", {**body, "ignore_eos": False}).json()["generation_settings"]["logit_bias"] == []
    lb = s.post("/completion", {**body, "ignore_eos": True}).json()["generation_settings"]["logit_bias"]
    assert lb and all(e["bias"] is None for e in lb), lb
    lb = s.post("/completion", {**body, "logit_bias": [[5, -2.5]]}).json()["generation_settings"]["logit_bias"]
    assert lb == [{"bias": -2.5, "token": 5}], lb


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/completion"])
def test_return_progress_reports_every_prefill_batch(serve, path):
    """llama-server's prompt_progress: one report when the slot has chosen
    what to reuse (cache == processed), then one per prefill batch,
    processed growing to total; a second turn reports its reuse."""
    s = serve("llama", "-b", "64", "-ub", "64", "-np", "1", "-c", "1024")
    body = {"max_tokens": 4, "temperature": 0, "stream": True, "return_progress": True}
    if path == "/v1/chat/completions":
        body["messages"] = [user("This is a test " * 40)]
    else:
        body["prompt"] = "This is a test " * 40

    def reports():
        out = [c["prompt_progress"] for c in events(s.post(path, body, stream=True)) if "prompt_progress" in c]
        assert out, "no prompt_progress"
        first, last = out[0], out[-1]
        assert first["cache"] == first["processed"] and last["processed"] == last["total"]
        assert all(p["total"] == first["total"] and p["cache"] == first["cache"] for p in out)
        assert all(b["processed"] > a["processed"] for a, b in zip(out, out[1:]))
        assert all(b["time_ms"] >= a["time_ms"] for a, b in zip(out, out[1:]))
        assert len(out) == 1 + -(-(first["total"] - first["cache"]) // 64)  # 64-token batches
        return out

    cold = reports()
    assert cold[0]["cache"] == 0 and cold[0]["total"] > 128  # three batches at least
    warm = reports()
    assert warm[0]["cache"] > 0 and len(warm) == 2
    # with timings_per_token each report has timings too (llama-server's):
    # numbers only, zero before the first batch, never going back
    timed = [c for c in events(s.post(path, {**body, "timings_per_token": True}, stream=True)) if "prompt_progress" in c]
    tms = [c["timings"] for c in timed]
    assert all(isinstance(v, (int, float)) and v >= 0 for t in tms for v in t.values()), tms
    assert tms[0]["prompt_n"] == 0 and tms[0]["prompt_ms"] == 0 and tms[0]["predicted_n"] == 0
    assert all(b["prompt_ms"] >= a["prompt_ms"] and b["prompt_n"] > a["prompt_n"] for a, b in zip(tms, tms[1:]))
    assert tms[-1]["prompt_n"] + tms[-1]["cache_n"] == timed[-1]["prompt_progress"]["total"]
    assert all(c["cache_source"] == "slot" for c in timed), timed  # beside the timings, the same prompt again
    # without return_progress (or not streamed) nothing changes
    body["return_progress"] = False
    assert not [c for c in events(s.post(path, body, stream=True)) if "prompt_progress" in c]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_n_choices(serve, path):
    """'n': one generation per choice, each a task of its own on the slots
    (forced onto one slot: they queue, the scheduler does not lock up);
    greedy choices are the same reply, sampled ones each their own."""
    s = serve("llama", "-np", "2", "-c", "1024")
    body = {"max_tokens": 8, "n": 3, "temperature": 0, "id_slot": 0}
    if path == "/v1/chat/completions":
        body["messages"] = BOOK
        content = lambda c: c["message"]["content"]  # noqa: E731
    else:
        body["prompt"] = "What is the best book"
        content = lambda c: c["text"]  # noqa: E731
    one = s.post(path, {**body, "n": 1}).json()
    for _ in range(2):
        r = s.post(path, body)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"]
        assert [c["index"] for c in ch] == [0, 1, 2]
        assert all(content(c) == content(one["choices"][0]) for c in ch)
        assert r.json()["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    r = s.post(path, {**body, "n": 4, "temperature": 1.0, "id_slot": -1, "max_tokens": 16, "logprobs": True}
               if path == "/v1/chat/completions" else {**body, "n": 4, "temperature": 1.0, "id_slot": -1,
                                                        "max_tokens": 16, "logprobs": 1})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"]
    assert len(ch) == 4 and all(c["logprobs"] for c in ch)
    assert len({content(c) for c in ch}) > 1  # each choice sampled with its own random seed
    for bad in ({**body, "n": 2, "stream": True}, {**body, "n": 0}, {**body, "n": 9}):
        assert s.post(path, bad).status_code == 400


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def test_vertex_ai_predict_serves_each_instance_on_its_route(serve):
    # AIP_MODE=PREDICTION (Google Cloud's custom containers): the port and
    # routes come from the environment; each instance is its route's body
    port = free_port()
    s = serve("llama", "-np", "2", env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
                                       "AIP_PREDICT_ROUTE": "v1/predict", "AIP_HEALTH_ROUTE": "/healthz"})
    assert s.port == port
    assert s.get("/healthz").json() == {"status": "ok"}
    msgs = [user("Say hello")]
    ref = s.chat(msgs, max_tokens=8)["choices"][0]["message"]["content"]
    r = s.post("/v1/predict", {"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 8, "temperature": 0, "messages": msgs, "stream": True},
        {"@requestFormat": "/tokenize", "content": "hello"},
        {"@requestFormat": "completion", "prompt": "Once upon", "n_predict": 4},
        {"@requestFormat": "noSuchRoute"},
        {"max_tokens": 8},
        "text",
    ]})
    assert r.status_code == 200, r.text
    p = r.json()["predictions"]
    assert len(p) == 6
    assert p[0]["object"] == "chat.completion"  # stream forced off: one JSON answer
    assert p[0]["choices"][0]["message"]["content"] == ref
    assert p[1]["tokens"] == s.post("/tokenize", {"content": "hello"}).json()["tokens"]
    assert "content" in p[2] and p[2]["tokens_predicted"] == 4
    assert "noSuchRoute" in p[3]["error"]["message"]
    assert "@requestFormat" in p[4]["error"]["message"]
    assert p[5]["error"]["message"] == "each instance must be a JSON object"
    # the envelope's own errors are the request's
    assert s.post("/v1/predict", {"instances": {}}).status_code == 400
    assert s.post("/v1/predict", {"instances": [{}] * 129}).status_code == 400
    assert s.post("/v1/predict", "not json").status_code == 400


def test_vertex_ai_predict_is_off_without_aip_mode(serve):
    s = serve("llama")
    assert s.post("/predict", {"instances": []}).status_code == 404


def test_a_prompt_over_the_context_is_refused_in_llama_servers_words(serve):
    # llama.cpp's test_ctx_shift looks for this phrase in the 400's message
    s = serve("llama", "-c", "512", "-np", "2")
    for path, body in (("/completion", {"prompt": "What is the best book " * 60, "n_predict": 4}),
                       ("/v1/chat/completions", {"messages": [user("What is the best book " * 60)]})):
        r = s.post(path, body)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "exceeds the available context size (256 tokens)" in msg, msg


def test_completion_takes_llama_servers_json_prompt(serve):
    # /completion's prompt as {"prompt_string": ...} (llama-server's JSON
    # prompt, whose multimodal_data needs a projector thaw has not loaded)
    s = serve("llama")
    body = {"n_predict": 4, "temperature": 0}
    ref = s.post("/completion", {**body, "prompt": "Once upon a time"})
    r = s.post("/completion", {**body, "prompt": {"prompt_string": "Once upon a time"}})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == ref.json()["content"]
    assert r.json()["tokens_evaluated"] == ref.json()["tokens_evaluated"]
    r = s.post("/completion", {**body, "prompt": {"prompt_string": "a <__media__>", "multimodal_data": ["iVBO"]}})
    assert r.status_code == 400 and "multimodal_data" in r.json()["error"]["message"]
    assert s.post("/completion", {**body, "prompt": {"text": "x"}}).status_code == 400


def sse(resp):
    """(event or None, data) of each SSE event."""
    out, ev = [], None
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("data: ") and line[6:] != "[DONE]":
            out.append((ev, json.loads(line[6:])))
            ev = None
    return out


def test_timings_per_token_on_every_streamed_api(serve):
    # llama-server's timings_per_token: each streamed piece carries the
    # timings so far (what its web UI shows as tokens per second)
    s = serve("llama")
    base = {"temperature": 0, "stream": True}
    chat = sse(s.post("/v1/chat/completions", {**base, "messages": BOOK, "max_tokens": 8,
                                               "timings_per_token": True}, stream=True))
    pieces = [d for _, d in chat if d.get("choices") and d["choices"][0]["delta"].get("content")]
    assert pieces and all("timings" in d for d in pieces), chat
    ns = [d["timings"]["predicted_n"] for d in pieces]
    assert ns == sorted(ns) and 1 <= ns[0] and ns[-1] <= 8, ns
    assert all(d["timings"]["prompt_n"] > 0 and d["timings"]["prompt_per_second"] > 0 for d in pieces)
    plain = sse(s.post("/v1/chat/completions", {**base, "messages": BOOK, "max_tokens": 8}, stream=True))
    assert not any("timings" in d for _, d in plain if d.get("choices") and d["choices"][0]["delta"].get("content"))
    for path, body in (("/completion", {"prompt": "Once upon", "n_predict": 6}),
                       ("/v1/completions", {"prompt": "Once upon", "max_tokens": 6})):
        ev = sse(s.post(path, {**base, **body, "timings_per_token": True}, stream=True))
        assert ev and all("timings" in d for _, d in ev), (path, ev)


def test_responses_stream_reports_progress_and_timings(serve):
    # llama-server's telemetry on the Responses stream: prompt_progress on
    # response.in_progress, timings on each delta and on response.completed
    s = serve("llama", "-b", "32", "-ub", "32")
    ev = sse(s.post("/v1/responses", {"input": "This is a test " * 10, "max_output_tokens": 8, "temperature": 0,
                                      "stream": True, "timings_per_token": True, "return_progress": True},
                    stream=True))
    prog = [d for _, d in ev if "prompt_progress" in d]
    assert len(prog) >= 2, ev  # the slot's choice, then each batch of 32
    assert all(d["type"] == "response.in_progress" and d["response"]["status"] == "in_progress" for d in prog)
    p = prog[-1]["prompt_progress"]
    assert p["total"] > 32 and p["processed"] == p["total"] and p["processed"] >= p["cache"]
    deltas = [d for e, d in ev if e == "response.output_text.delta"]
    assert deltas and all("prompt_per_second" in d["timings"] for d in deltas)
    done = [d for e, d in ev if e == "response.completed"]
    assert done and done[0]["timings"]["predicted_n"] == done[0]["response"]["usage"]["output_tokens"]
    seq = [d["sequence_number"] for _, d in ev]
    assert seq == list(range(len(seq)))


def test_completion_serves_several_prompts_and_mixed_ones(serve):
    # llama-server's /completion: an array of prompts (text, ids, JSON
    # prompts) is answered with an array of replies in their order; an
    # array of ids and text is one prompt, each text tokenized in place
    s = serve("llama", "-np", "2")
    text = "I believe the meaning of life is"
    ids = s.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    body = {"n_predict": 4, "temperature": 0}
    one = s.post("/completion", {**body, "prompt": ids}).json()
    r = s.post("/completion", {**body, "prompt": [ids, text, {"prompt_string": text}]})
    assert r.status_code == 200, r.text
    many = r.json()
    assert isinstance(many, list) and len(many) == 3
    assert all(m["content"] == one["content"] and m["tokens_evaluated"] == len(ids) for m in many), many
    r = s.post("/completion", {**body, "prompt": [ids[0], *ids[1:3], text]})
    assert r.status_code == 200, r.text
    plain = s.post("/tokenize", {"content": text, "add_special": False}).json()["tokens"]
    assert r.json()["tokens_evaluated"] == 3 + len(plain)
    r = s.post("/completion", {**body, "prompt": [text, text], "stream": True})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]
    assert s.post("/completion", {**body, "prompt": [text] * 9}).status_code == 400
    # OpenAI's legacy API still takes one prompt per request
    r = s.post("/v1/completions", {"prompt": [text, text], "max_tokens": 2})
    assert r.status_code == 400 and "prompts" in r.json()["error"]["message"]


def test_completion_says_truncated_when_its_slot_filled(serve):
    # llama-server's "truncated": the reply stopped because the slot's
    # context was full, not at n_predict (finish_reason is length either way)
    s = serve("llama", "-c", "512", "-np", "2", "-n", "-1")
    r = s.post("/completion", {"prompt": "Hi how are you", "n_predict": -1, "ignore_eos": True}).json()
    assert r["truncated"] is True and r["stop_type"] == "limit", r
    assert r["tokens_evaluated"] + r["tokens_predicted"] == 256
    r = s.post("/completion", {"prompt": "Hi how are you", "n_predict": 8, "ignore_eos": True}).json()
    assert r["truncated"] is False and r["tokens_predicted"] == 8
