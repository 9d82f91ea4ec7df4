"""Agents on real templates: Jinja chat templates from the fetched llama.cpp
source rendered with tools, forced tool calls parsed (plain, streamed, and
through the official openai SDK), reasoning split out, response_format
schemas enforced, and the KV cache exact with all of it. Generated models
(random weights, real tokenizer), so outputs are checked for shape and
equality, never for sense."""
import json
import os
import shutil
import subprocess

import pytest

from harness import REPO, mkmodel, user, timings

TEMPLATES = os.path.join(REPO, ".deps", "llama.cpp", "models", "templates")
NODE_MODULES = os.path.join(REPO, ".deps", "npm", "node_modules")

# (name, mkmodel arguments): six families' own templates
FAMILIES = {
    "qwen3": ["--arch", "qwen3"],
    "llama3.1": ["--arch", "llama", "--chat-template-file", "meta-llama-Llama-3.1-8B-Instruct.jinja"],
    "mistral-small-3.2": ["--arch", "llama", "--chat-template-file", "Mistral-Small-3.2-24B-Instruct-2506.jinja"],
    "deepseek-r1": ["--arch", "llama", "--chat-template-file", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"],
    "hermes3": ["--arch", "llama", "--chat-template-file", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"],
    "gpt-oss": ["--arch", "llama", "--chat-template-file", "openai-gpt-oss-120b.jinja"],
    "gemma4": ["--arch", "gemma4"],
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["tz"]}}}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    out = {}
    for name, args in FAMILIES.items():
        args = [os.path.join(TEMPLATES, a) if a.endswith(".jinja") else a for a in args]
        out[name] = mkmodel(d / f"{name}.gguf", *args, "--seed", "5")
    return out


def forced(messages, **kw):
    return {"messages": messages, "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0,
            "max_tokens": 400, "cache_prompt": False, **kw}


def check_call(msg, finish):
    assert finish == "tool_calls", msg
    assert msg.get("content") in (None, "")
    calls = msg["tool_calls"]
    assert len(calls) >= 1
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        args = json.loads(c["function"]["arguments"])
        if c["function"]["name"] == "get_weather":
            assert args["city"] in ("Paris", "London")
        else:
            assert c["function"]["name"] == "get_time" and args["tz"] in ("UTC", "CET")
    return calls


def stream_message(s, body):
    """The streamed reply assembled by OpenAI's delta rules."""
    r = s.post("/v1/chat/completions", {**body, "stream": True}, stream=True)
    assert r.status_code == 200, r.text
    content, reasoning, calls, finish = "", "", [], None
    for line in r.iter_lines(decode_unicode=True):
        if not line or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for ch in chunk.get("choices", []):
            d = ch["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls", []):
                if tc["index"] == len(calls):
                    assert tc["id"].startswith("call_") and tc["type"] == "function" and tc["function"]["name"]
                    calls.append({"id": tc["id"], "type": "function",
                                  "function": {"name": tc["function"]["name"], "arguments": ""}})
                else:
                    assert "id" not in tc and "name" not in tc["function"]  # once only
                calls[tc["index"]]["function"]["arguments"] += tc["function"].get("arguments", "")
            finish = ch["finish_reason"] or finish
    msg = {"content": content or None, "tool_calls": calls}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg, finish


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forced_tool_calls_parse_plain_and_streamed(serve, family_models, family):
    s = serve(family_models[family], "-np", "1", "-c", "4096")
    body = forced([user("What is the weather in Paris, and the time in UTC?")])
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    plain = r.json()["choices"][0]
    calls = check_call(plain["message"], plain["finish_reason"])
    streamed, finish = stream_message(s, body)
    assert check_call(streamed, finish) and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                             for c in streamed["tool_calls"]] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    # a named function: only that one
    r = s.post("/v1/chat/completions", forced([user("Time?")], tool_choice={"type": "function",
                                                                             "function": {"name": "get_time"}}))
    named = check_call(r.json()["choices"][0]["message"], r.json()["choices"][0]["finish_reason"])
    assert {c["function"]["name"] for c in named} == {"get_time"}


def sdk_script():
    """openai_agent.mjs, with the SDK where node finds it."""
    if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_MODULES, "openai")):
        pytest.fail("node and the openai SDK are installed by scripts/setup.sh; run it first")
    link = os.path.join(os.path.dirname(__file__), "node_modules")
    if not os.path.exists(link):
        os.symlink(NODE_MODULES, link)
    return os.path.join(os.path.dirname(__file__), "openai_agent.mjs")


def test_openai_sdk_gets_the_same_call_streamed_and_not(serve, family_models):
    script = sdk_script()
    for family in FAMILIES:
        s = serve(family_models[family], "-np", "1", "-c", "4096")
        body = forced([user("Weather in London?")], model="m")
        p = subprocess.run(["node", script, s.url + "/v1", json.dumps(body)], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        plain = check_call(out["plain"]["message"], out["plain"]["finish_reason"])
        streamed = check_call(out["stream"], out["stream"]["finish_reason"])
        assert [(c["id"][:5], c["function"]["name"], c["function"]["arguments"]) for c in streamed] == \
            [(c["id"][:5], c["function"]["name"], c["function"]["arguments"]) for c in plain]
        s.kill()


def test_content_with_a_brace_streams_once(serve, family_models):
    # Llama 3.x's parser reads a "{" in what was content so far as the
    # start of a tool call and parses the partial text as an empty message
    # until the reply ends: a stream that diffed against that sent the
    # whole content a second time at the end (every API's stream: the
    # codecs share the step, codec.c; Anthropic's body takes no grammar)
    s = serve(family_models["llama3.1"], "-np", "1")
    grammar = 'root ::= "Use it like f(x) { return 1; } and " [a-z ]+'
    body = {"messages": [user("Show me.")], "tools": [WEATHER, TIME], "grammar": grammar, "temperature": 0,
            "max_tokens": 32}
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]["message"]["content"]
    assert whole.startswith("Use it like f(x) { return 1; } and "), whole
    streamed, _ = stream_message(s, body)
    assert streamed["content"] == whole


def test_reasoning_is_split_from_content(serve, family_models):
    # DeepSeek R1's generation prompt opens <think>: all a random model says
    # is reasoning until it closes the tag
    s = serve(family_models["deepseek-r1"], "-np", "1")
    r = s.post("/v1/chat/completions", {"messages": [user("Think first.")], "max_tokens": 24, "temperature": 0,
                                        "cache_prompt": False})
    msg = r.json()["choices"][0]["message"]
    assert msg.get("reasoning_content"), msg
    assert "<think>" not in (msg.get("content") or "")
    streamed, _ = stream_message(s, {"messages": [user("Think first.")], "max_tokens": 24, "temperature": 0,
                                     "cache_prompt": False})
    assert streamed.get("reasoning_content") == msg["reasoning_content"]
    # --reasoning-format none keeps it in the content
    s.kill()
    s = serve(family_models["deepseek-r1"], "-np", "1", "--reasoning-format", "none")
    r = s.post("/v1/chat/completions", {"messages": [user("Think first.")], "max_tokens": 24, "temperature": 0})
    assert not r.json()["choices"][0]["message"].get("reasoning_content")


@pytest.mark.parametrize("family", ["qwen3", "llama3.1"])
def test_json_schema_reply_validates(serve, family_models, family):
    schema = {"type": "object", "properties": {"mood": {"type": "string", "enum": ["calm", "stormy"]},
                                               "wind": {"type": "boolean"}},
              "required": ["mood", "wind"], "additionalProperties": False}
    s = serve(family_models[family], "-np", "1")
    r = s.post("/v1/chat/completions", {"messages": [user("Describe the sea as JSON.")], "max_tokens": 80,
                                        "temperature": 0, "response_format": {
                                            "type": "json_schema", "json_schema": {"name": "sea", "schema": schema}}})
    assert r.status_code == 200, r.text
    obj = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(obj) == {"mood", "wind"} and obj["mood"] in ("calm", "stormy") and isinstance(obj["wind"], bool)


def test_tools_need_jinja(serve, family_models):
    s = serve(family_models["llama3.1"], "--no-jinja", "--chat-template", "llama3")
    r = s.post("/v1/chat/completions", forced([user("hi")]))
    assert r.status_code == 400 and "--no-jinja" in r.json()["error"]["message"]
    assert s.chat([user("hi")], max_tokens=2)["choices"]


def test_template_endpoints(serve, family_models):
    s = serve(family_models["qwen3"], "--cors-origin", "http://app.example")
    r = s.post("/apply-template", {"messages": [user("hello")], "tools": [WEATHER]})
    assert r.status_code == 200 and "get_weather" in r.json()["prompt"] and "hello" in r.json()["prompt"]
    toks = s.post("/tokenize", {"content": "hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(t["piece"] for t in toks) == "hello world"
    ids = s.post("/tokenize", {"content": "hello world"}).json()["tokens"]
    assert s.post("/detokenize", {"tokens": ids}).json()["content"] == "hello world"
    assert s.post("/detokenize", {"tokens": [10 ** 9]}).status_code == 400
    props = s.get("/props").json()
    assert props["total_slots"] == 1 and "im_start" in props["chat_template"]
    import requests
    pre = requests.options(s.url + "/v1/chat/completions", headers={"Origin": "http://app.example",
                                                                     "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    other = requests.get(s.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_cors_wildcard_with_keys_refused(family_models):
    from harness import THAW
    p = subprocess.run([THAW, "serve", "-m", family_models["qwen3"], "--port", "0", "--api-key", "k",
                        "--cors-origin", "*"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--cors-origin" in p.stderr


# ---- the cache, exact with tools ---------------------------------------------------

SCHEMAS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "A tool of the agent's kit. " + "It does careful work. " * 12,
    "parameters": {"type": "object", "properties": {
        "target": {"type": "string", "enum": ["alpha", "beta", "gamma"]},
        "depth": {"type": "string", "enum": ["shallow", "deep"]}}, "required": ["target"]}}}
    for i in range(24)]


def agent_step(s, msgs, tools, sdk=False, **kw):
    """One step of an agent: its tools, a required call. With sdk, sent by
    the official openai SDK, whose parsed message is what gets echoed."""
    body = {"messages": msgs, "tools": tools, "tool_choice": "required", "temperature": 0, "max_tokens": 400, **kw}
    if sdk:
        p = subprocess.run(["node", sdk_script(), s.url + "/v1", json.dumps({**body, "model": "m"}), "once"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def extend(msgs, r, step):
    m = r["choices"][0]["message"]
    msgs = msgs + [m]
    for c in m["tool_calls"]:
        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": f"result {step}: all {c['function']['name']} done"})
    return msgs


def test_agent_loop_is_served_from_cache_across_a_restart(serve, family_models, tmp_path):
    flags = ["-np", "2", "-c", "16384", "--kv-cache-dir", str(tmp_path), "--cache-ram", "0",
             "--kv-cache-min-tokens", "16"]
    s = serve(family_models["qwen3"], *flags)
    a = [{"role": "system", "content": "You are agent A."}, user("Do the job with the tools.")]
    b = [{"role": "system", "content": "You are agent B."}, user("Do the other job.")]
    ra_prev = None
    for step in range(8):
        if step == 4:
            s.stop()
            s = serve(family_models["qwen3"], *flags)
        ra = agent_step(s, a, SCHEMAS, sdk=True)
        rb = agent_step(s, b, SCHEMAS[:12])  # interleaved, other tools
        if step > 0:
            t = timings(ra)
            # all but the new tool results and their template glue
            new = sum(len(m["content"]) for m in a[-len(ra_prev["choices"][0]["message"]["tool_calls"]):])
            assert t["cache_n"] > 0 and t["prompt_n"] <= new + 48, (step, t)
            if step == 4:
                assert t["cache_source"] == "disk"
        ra_prev = ra
        a = extend(a, ra, step)
        b = extend(b, rb, step)


def test_same_messages_other_tools_never_share_state(serve, family_models, tmp_path):
    msgs = [{"role": "system", "content": "Shared system prompt. " * 20}, user("Go.")]
    flags = ["-np", "1", "-c", "8192", "--cache-ram", "0"]
    # the exact reference: each agent alone, back to back, no cache tier
    ref = serve(family_models["qwen3"], *flags)
    r1 = agent_step(ref, msgs, SCHEMAS[:3])
    want1 = agent_step(ref, extend(msgs, r1, 0), SCHEMAS[:3])
    ref.kill()
    ref = serve(family_models["qwen3"], *flags)
    r2 = agent_step(ref, msgs, SCHEMAS[3:6])
    want2 = agent_step(ref, extend(msgs, r2, 0), SCHEMAS[3:6])
    ref.kill()
    s = serve(family_models["qwen3"], *flags, "--kv-cache-dir", str(tmp_path), "--kv-cache-min-tokens", "16")
    g1 = agent_step(s, msgs, SCHEMAS[:3])
    g2 = agent_step(s, msgs, SCHEMAS[3:6])
    s.stop()
    s = serve(family_models["qwen3"], *flags, "--kv-cache-dir", str(tmp_path), "--kv-cache-min-tokens", "16")
    # agent 1's turn 2 with agent 2's tools: another key
    cross = agent_step(s, extend(msgs, g1, 0), SCHEMAS[3:6])
    # no state keyed for the other tool list; blocks are shared only where
    # the tokens are identical (here: agent 2's own turn up to its reply),
    # so the reply equals the reference that prefilled everything
    assert cross["cache_source"] in ("none", "blocks")
    s.stop()
    ref = serve(family_models["qwen3"], *flags)
    want_cross = agent_step(ref, extend(msgs, g1, 0), SCHEMAS[3:6])
    ref.kill()
    s = serve(family_models["qwen3"], *flags, "--kv-cache-dir", str(tmp_path), "--kv-cache-min-tokens", "16")
    got1 = agent_step(s, extend(msgs, g1, 0), SCHEMAS[:3])
    assert got1["cache_source"] == "disk"
    got2 = agent_step(s, extend(msgs, g2, 0), SCHEMAS[3:6])
    assert got2["cache_source"] == "disk"
    strip = lambda r: [(c["function"]["name"], c["function"]["arguments"]) for c in r["choices"][0]["message"]["tool_calls"]]
    assert strip(g1) == strip(r1) and strip(g2) == strip(r2)
    assert strip(got1) == strip(want1) and strip(got2) == strip(want2)
    assert strip(cross) == strip(want_cross)
    # other chat_template_kwargs: another key too
    k = agent_step(s, extend(msgs, g1, 0), SCHEMAS[:3], chat_template_kwargs={"enable_thinking": False})
    assert k["cache_source"] != "disk"
