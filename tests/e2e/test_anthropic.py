"""The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens):
the official `@anthropic-ai/sdk` against thaw, the raw event stream, errors
in Anthropic's shape, and the cache across turns. Generated models (random
weights, real tokenizers and templates), so replies are compared with each
other (streamed vs plain, greedy), never with recorded text."""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from agent_clis import AGENTS, CLAUDE, claude
from agent_clis import claude_from_cache as from_cache
from harness import REPO, drained, mkmodel, text

TEMPLATES = os.path.join(REPO, ".deps", "llama.cpp", "models", "templates")
HERE = os.path.dirname(__file__)

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return mkmodel(tmp_path_factory.mktemp("anthropic") / "qwen3.gguf", "--arch", "qwen3", "--seed", "7")


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    """A template whose generation prompt opens <think>: every reply is reasoning first."""
    return mkmodel(tmp_path_factory.mktemp("anthropic") / "r1.gguf", "--arch", "llama", "--seed", "8",
                   "--chat-template-file",
                   os.path.join(TEMPLATES, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))


def events(r):
    """An SSE response as [(event, data)], checking that each event: line names its data's type."""
    out, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if not line:
            continue
        if line.startswith("event: "):
            name = line[7:]
            continue
        assert line.startswith("data: "), line
        data = json.loads(line[6:])
        assert name == data["type"], (name, data)
        out.append((name, data))
        name = None
    return out


def assemble(evs):
    """The message a stream describes, by Anthropic's rules."""
    assert evs[0][0] == "message_start" and evs[-1][0] == "message_stop"
    msg = evs[0][1]["message"]
    blocks, open_ = [], None
    for name, d in evs[1:-1]:
        if name == "content_block_start":
            assert open_ is None and d["index"] == len(blocks)
            blocks.append(dict(d["content_block"]))
            open_ = d["index"]
            if blocks[-1]["type"] == "tool_use":
                blocks[-1]["partial"] = ""
        elif name == "content_block_delta":
            assert d["index"] == open_
            b, dl = blocks[open_], d["delta"]
            if dl["type"] == "text_delta":
                b["text"] += dl["text"]
            elif dl["type"] == "thinking_delta":
                b["thinking"] += dl["thinking"]
            elif dl["type"] == "signature_delta":
                b["signature"] = dl["signature"]
            else:
                assert dl["type"] == "input_json_delta"
                b["partial"] += dl["partial_json"]
        elif name == "content_block_stop":
            assert d["index"] == open_
            open_ = None
        elif name == "message_delta":
            assert open_ is None
            msg["stop_reason"] = d["delta"]["stop_reason"]
            msg["stop_sequence"] = d["delta"]["stop_sequence"]
            msg["usage"] = {**msg["usage"], **d["usage"]}
        else:
            assert name == "ping", name
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b.pop("partial") or "{}")
    msg["content"] = blocks
    return msg


def prompt_total(u):
    """The prompt's tokens, as Anthropic splits them: new, stored, reused."""
    return u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]


def no_ids(blocks):
    """Content blocks without their ids (each reply names its own tool calls)."""
    return [{k: v for k, v in b.items() if k != "id"} for b in blocks]


def post(s, body, path="/v1/messages", **kw):
    return s.post(path, body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01", **kw.pop("headers", {})},
                  **kw)


def test_messages_stream_and_plain_agree(serve, qwen3):
    s = serve(qwen3, "--api-key", "k")
    body = {"model": "m", "max_tokens": 24, "temperature": 0, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    plain = post(s, body)
    assert plain.status_code == 200, plain.text
    p = plain.json()
    assert p["type"] == "message" and p["role"] == "assistant" and p["id"].startswith("msg_")
    assert p["stop_reason"] in ("end_turn", "max_tokens")
    r = post(s, {**body, "stream": True}, path="/v1/messages?beta=true", stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    evs = events(r)
    names = [n for n, _ in evs]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    m = assemble(evs)
    assert m["content"] == p["content"] and m["stop_reason"] == p["stop_reason"]
    assert m["usage"]["output_tokens"] == p["usage"]["output_tokens"]
    # the same prompt again: the slot holds it (one token is always decoded)
    n_in = prompt_total(p["usage"])
    assert prompt_total(m["usage"]) == n_in
    assert m["usage"]["cache_read_input_tokens"] == n_in - 1
    # count_tokens counts the prompt the request renders to
    c = post(s, {k: v for k, v in body.items() if k in ("model", "system", "messages")},
             path="/v1/messages/count_tokens")
    assert c.status_code == 200 and c.json() == {"input_tokens": n_in}


def test_stop_sequence_is_named(serve, qwen3):
    s = serve(qwen3)
    body = {"model": "m", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    p = post(s, body).json()
    text = "".join(b["text"] for b in p["content"] if b["type"] == "text")
    assert len(text) >= 8 and p["stop_sequence"] is None, p
    # a piece of what greedy decoding writes: the same reply ends where it first occurs
    stop = text[len(text) // 2:len(text) // 2 + 3]
    want = text[:text.find(stop)]
    body = {**body, "stop_sequences": ["never-in-a-reply-\u2603", stop]}
    for r in (post(s, body).json(), assemble(events(post(s, {**body, "stream": True}, stream=True)))):
        assert r["stop_reason"] == "stop_sequence" and r["stop_sequence"] == stop, r
        assert "".join(b["text"] for b in r["content"] if b["type"] == "text") == want, (r, want)
    # a reply cut by max_tokens names none
    r = assemble(events(post(s, {**body, "stop_sequences": ["never-in-a-reply-\u2603"], "max_tokens": 3,
                                 "stream": True}, stream=True)))
    assert r["stop_reason"] == "max_tokens" and r["stop_sequence"] is None, r


def test_http_errors_in_anthropic_shape(serve, qwen3):
    """What no codec sees (a body over --max-body, a path no route has, a
    bad key) is still answered in Anthropic's shape under /v1/messages."""
    s = serve(qwen3, "--api-key", "k", "--max-body", "4096")
    big = {"max_tokens": 2, "messages": [{"role": "user", "content": "x" * 8192}]}
    for path in ("/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"):
        r = post(s, big, path=path)
        assert r.status_code == 413, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large", r.text
        assert "--max-body" in r.json()["error"]["message"]
    r = post(s, {}, path="/v1/messages/batches")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    r = post(s, {"messages": [{"role": "user", "content": "x"}]}, path="/v1/messages/count_tokens",
             headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json() == {"type": "error", "error": {
        "type": "authentication_error", "message": r.json()["error"]["message"]}}, r.text
    # the OpenAI paths keep OpenAI's shape
    r = s.post("/v1/chat/completions", big, headers={"Authorization": "Bearer k"})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413, r.text
    r = s.post("/v1/messagesx", {}, headers={"Authorization": "Bearer k"})
    assert r.status_code == 404 and "type" not in r.json(), r.text


def test_forced_tool_call_and_result_round_trip_from_cache(serve, qwen3):
    s = serve(qwen3)
    call = {"model": "m", "max_tokens": 200, "temperature": 0, "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    p = post(s, call).json()
    assert p["stop_reason"] == "tool_use", p
    uses = [b for b in p["content"] if b["type"] == "tool_use"]
    assert uses and all(u["name"] == "get_weather" and u["input"]["city"] in ("Paris", "London") for u in uses)
    m = assemble(events(post(s, {**call, "stream": True}, stream=True)))
    assert no_ids(m["content"]) == no_ids(p["content"])
    turn2 = {**call, "tool_choice": {"type": "auto"}, "max_tokens": 8, "messages": [
        *call["messages"], {"role": "assistant", "content": p["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"],
                                      "content": [{"type": "text", "text": "Sunny"}]} for u in uses]}]}
    r = post(s, turn2)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    # the conversation's first turn is what the slot holds, reply included
    assert u["cache_read_input_tokens"] > 0 and u["input_tokens"] < u["cache_read_input_tokens"]


@pytest.mark.parametrize("cache", [True, False])
def test_usage_splits_the_prompt_into_new_stored_and_reused(serve, qwen3, tmp_path, cache):
    """cache_creation_input_tokens: the prompt tokens a turn newly stores
    (thaw stores every turn whose prompt reaches --kv-cache-min-tokens:
    then input_tokens is 0);
    cache_read_input_tokens: those it reused; with no cache tier on, the
    new tokens are input_tokens and nothing is created. Streamed, the
    final message_delta carries the same split."""
    tiers = ["--kv-cache-dir", str(tmp_path)] if cache else ["--cache-ram", "0"]
    s = serve(qwen3, "-np", "1", "--kv-cache-min-tokens", "16", *tiers)
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "system": "Be brief. " * 8,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    u1 = post(s, body).json()["usage"]
    n1 = prompt_total(u1)
    if cache:
        assert u1["cache_creation_input_tokens"] == n1 - u1["cache_read_input_tokens"] > 0, u1
        assert u1["input_tokens"] == 0, u1
    else:
        assert u1["cache_creation_input_tokens"] == 0 and u1["input_tokens"] > 0, u1
    p = post(s, body).json()
    turn2 = {**body, "messages": [*body["messages"], {"role": "assistant", "content": p["content"]},
                                  {"role": "user", "content": "And the mountains?"}]}
    evs = events(post(s, {**turn2, "stream": True}, stream=True))
    u2 = assemble(evs)["usage"]
    # message_start already carries the split the final message_delta does
    start = evs[0][1]["message"]["usage"]
    assert {k: start[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")} == \
        {k: u2[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}, (start, u2)
    assert u2["cache_read_input_tokens"] >= n1 - 1, (u1, u2)  # the slot held turn 1
    new = prompt_total(u2) - u2["cache_read_input_tokens"]
    assert (u2["cache_creation_input_tokens"], u2["input_tokens"]) == ((new, 0) if cache else (0, new)), u2
    # a prompt shorter than --kv-cache-min-tokens is not stored; nor
    # counted as created, streamed or not
    s.stop()
    short = {**body, "system": "", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    s2 = serve(qwen3, "-np", "1", "--kv-cache-min-tokens", "4000", *tiers)
    u3 = post(s2, short).json()["usage"]
    assert u3["cache_creation_input_tokens"] == 0 and u3["input_tokens"] > 0, u3
    evs = events(post(s2, {**short, "stream": True}, stream=True))
    assert evs[0][1]["message"]["usage"]["cache_creation_input_tokens"] == 0


def idle(s, timeout=60):
    """Waits until no slot is busy (a turn's RAM store is made before its slot is free)."""
    deadline = time.time() + timeout
    while s.metrics()["thaw_slots_busy"] != 0:
        assert time.time() < deadline, "slots still busy"
        time.sleep(0.05)


def marked(t, ttl="1h"):
    """A system prompt as one text block carrying a cache_control mark (None: no mark)."""
    b = {"type": "text", "text": t}
    if ttl:
        b["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return [b]


@pytest.mark.parametrize("tier", ["disk", "ram"])
def test_cache_control_keeps_what_it_marks_when_the_budget_evicts_the_rest(serve, tmp_path, tier):
    """A cache_control mark is a retention hint: what it covers stays in the
    cache tiers at least its ttl, the last thing the budget evicts. Disk:
    conversation A's system prompt is marked; five other conversations
    push A out of a 1 MiB --kv-cache-max (~4k tokens of the tiny model):
    a new conversation on A's system prompt still finds its blocks (a
    prefix lookup). RAM tier alone (1 MiB, whole states): A's last message
    is marked, and A's turn 2 still comes from RAM. Each against the same
    run without the mark, where the budget took A."""
    def run(mark):
        d = tmp_path / f"{tier}-{mark}"
        tiers = (["--kv-cache-dir", str(d), "--cache-ram", "0", "--kv-cache-block", "32", "--kv-cache-max", "1"]
                 if tier == "disk" else ["--cache-ram", "1"])
        s = serve("llama", "-np", "1", "-c", "8192", "--kv-cache-min-tokens", "16", *tiers)
        sys_a = "Kept rules. " + text(1300, 3)
        ask = [{"role": "user", "content": "Job A: " + text(150, 7)}]
        if tier == "ram" and mark:  # the mark on the last message: the whole conversation
            ask = [{"role": "user", "content": marked(ask[0]["content"])}]
        body = {"model": "m", "max_tokens": 4, "temperature": 0,
                "system": marked(sys_a, "1h" if mark and tier == "disk" else None), "messages": ask}
        a = post(s, body).json()
        for i in range(5):
            post(s, {**body, "system": f"Other rules {i}. " + text(1300, 10 + i),
                     "messages": [{"role": "user", "content": f"Job {i}: " + text(150, 20 + i)}]}).raise_for_status()
        if tier == "disk":
            drained(s)
        else:
            idle(s)
        if tier == "disk":
            again = {**body, "messages": [{"role": "user", "content": "Job B: " + text(150, 8)}]}
        else:
            again = {**body, "messages": [*ask, {"role": "assistant", "content": a["content"]},
                                          {"role": "user", "content": "And then?"}]}
        u = post(s, again).json()["usage"]
        m = s.metrics()
        s.stop()
        return u, m

    kept, m = run(True)
    if tier == "disk":
        assert m["thaw_kv_disk_retention_hints_total"] >= 1, m
        assert m["thaw_kv_disk_evictions_lru_total"] >= 1, m
        assert m["thaw_kv_disk_bytes"] <= 1 << 20, m
    assert kept["cache_read_input_tokens"] >= 1200, kept  # the system prompt's blocks / turn 1 whole
    lost, _ = run(False)
    assert lost["cache_read_input_tokens"] < 100, lost


def test_thinking_blocks_stream_and_echo(serve, r1):
    s = serve(r1)
    body = {"model": "m", "max_tokens": 24, "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "Think about the sea."}]}
    p = post(s, body).json()
    th = [b for b in p["content"] if b["type"] == "thinking"]
    assert th and th[0]["thinking"] and th[0]["signature"].startswith("thaw-"), p
    evs = events(post(s, {**body, "stream": True}, stream=True))
    assert any(d["delta"]["type"] == "thinking_delta" for n, d in evs if n == "content_block_delta")
    assert any(d["delta"]["type"] == "signature_delta" for n, d in evs if n == "content_block_delta")
    assert assemble(evs)["content"] == p["content"]
    # the thinking block echoed verbatim, signature and all, renders and hits
    turn2 = {**body, "messages": [*body["messages"], {"role": "assistant", "content": p["content"]},
                                  {"role": "user", "content": "More."}]}
    r = post(s, turn2)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["cache_read_input_tokens"] > 0


def test_system_blocks_billing_header_and_system_messages(serve, qwen3):
    s = serve(qwen3)

    def count(system, extra=()):
        body = {"model": "m", "system": system,
                "messages": [{"role": "user", "content": "hi"}, *extra]}
        r = post(s, body, path="/v1/messages/count_tokens")
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    plain = [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Be brief."}]
    base = count(plain)
    # Claude Code's per-conversation block is left out: two conversations share their prefix
    for cch in ("00000", "a5145"):
        hdr = {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch={cch};"}
        assert count([hdr, *plain]) == base
    assert "left out of the prompt" in s.log()
    # cache_control marks render nothing
    assert count([{**b, "cache_control": {"type": "ephemeral"}} for b in plain]) == base
    # a system message between turns renders (it adds tokens) and is accepted
    more = [{"role": "assistant", "content": "ok"}, {"role": "system", "content": "Now be formal."},
            {"role": "user", "content": "hello"}]
    assert count(plain, more) > base


@pytest.mark.parametrize("body,needle", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "content[0].source"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "x"}]}]}, "name"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "input_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
      "tool_choice": {"type": "tool", "name": "other"}}, "other"),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}}, "thinking"),
    ({"messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "xml"}}}, "format"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": "x"}], "system": 5}, "system"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral",
                                                                                                "ttl": "2d"}}]}]},
     "messages[0].content[0].cache_control.ttl"),
    ({"messages": [{"role": "user", "content": "x"}], "system": [{"type": "text", "text": "x",
                                                                   "cache_control": {"type": "forever"}}]},
     "system[0].cache_control"),
    ("{not json", "JSON"),
])
def test_bad_fields_get_anthropic_400s(serve, qwen3, body, needle):
    s = serve(qwen3)
    r = post(s, body)
    assert r.status_code == 400, r.text
    e = r.json()
    assert e["type"] == "error" and e["error"]["type"] == "invalid_request_error", e
    assert needle in e["error"]["message"], e
    # and the server keeps serving
    ok = post(s, {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert ok.status_code == 200, ok.text


def test_auth_and_too_long(serve, qwen3):
    s = serve(qwen3, "--api-key", "k", "-c", "256")
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    r = post(s, body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = s.post("/v1/messages", body, headers={"Authorization": "Bearer k"})
    assert r.status_code == 200, r.text
    r = post(s, {**body, "messages": [{"role": "user", "content": "sea and sky " * 120}]})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    m = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", msg)
    assert m and int(m.group(1)) > int(m.group(2)), msg


def test_anthropic_sdk(serve, qwen3, tmp_path):
    if not shutil.which("node") or not os.path.isdir(os.path.join(AGENTS, "@anthropic-ai", "sdk")):
        pytest.fail("node and @anthropic-ai/sdk are installed by scripts/setup.sh; run it first")
    s = serve(qwen3, "--api-key", "sekrit")
    # ESM resolves bare imports from the script's folder upwards
    shutil.copy(os.path.join(HERE, "anthropic_client.mjs"), tmp_path / "client.mjs")
    os.symlink(AGENTS, tmp_path / "node_modules")
    p = subprocess.run(["node", str(tmp_path / "client.mjs"), s.url, "sekrit"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["plain"]["type"] == "message" and out["plain"]["content"]
    assert out["plain_stream"]["content"] == out["plain"]["content"]
    assert out["plain_events"][0] == "message_start" and out["plain_events"][-1] == "message_stop"
    for k in ("tool", "any"):
        assert out[k]["stop_reason"] == "tool_use", out[k]
        uses = [b for b in out[k]["content"] if b["type"] == "tool_use"]
        assert uses and all(u["input"].get("city") in ("Paris", "London") or u["input"].get("tz") in ("UTC", "CET")
                            for u in uses), out[k]
    assert no_ids(out["tool_stream"]["content"]) == no_ids(out["tool"]["content"])
    assert out["tool_result"]["content"] == out["tool_result_stream"]["content"]
    u = out["tool_result"]["usage"]
    assert u["cache_read_input_tokens"] > 0
    assert out["count"]["input_tokens"] == prompt_total(u)
    for e in out["errors"]:
        assert e and e["status"] == 400 and e["type"] == "error" and e["error_type"] == "invalid_request_error", e
    assert out["auth"] == {"status": 401, "error_type": "authentication_error"}
    assert out["after"]["content"] == out["plain"]["content"]


def test_claude_code_continues_from_cache_across_a_restart(serve, tmp_path_factory):
    if not os.access(CLAUDE, os.X_OK):
        pytest.fail("@anthropic-ai/claude-code is installed by scripts/setup.sh; run it first")
    d = tmp_path_factory.mktemp("claude")
    # small enough for 2 cores, a context for Claude Code's ~20k-token prompt
    model = mkmodel(d / "qwen3.gguf", "--arch", "qwen3", "--seed", "11", "--ctx-train", "65536")
    home, cwd, cache = d / "home", d / "project", d / "kv"
    home.mkdir()
    cwd.mkdir()
    args = ("-np", "1", "-c", "65536", "--api-key", "k", "--kv-cache-dir", str(cache))
    s = serve(model, *args)
    t1 = claude(home, cwd, s.url, "Say hello.")
    assert t1["type"] == "result", t1
    share1, n1 = from_cache(t1)
    # Claude Code's system prompt and tools were rendered: its first request's prompt
    first = int(re.search(r"done \(\w+\): prompt (\d+) \(0 cached", s.log()).group(1))
    assert first > 5000, s.log()
    t2 = claude(home, cwd, s.url, "--continue", "And goodbye.")
    share2, n2 = from_cache(t2)
    assert n2 > n1 and share2 >= 0.9, (json.dumps(t1["usage"]), json.dumps(t2["usage"]))
    assert s.stop() == 0
    s = serve(model, *args)
    t3 = claude(home, cwd, s.url, "--continue", "Once more.")
    share3, n3 = from_cache(t3)
    assert n3 > n2 and share3 >= 0.9, (t2["usage"], t3["usage"])
    # after the restart the state came from disk under the exact key turn 2
    # stored (not by a prefix of its blocks), all of it reused: each turn's
    # requests render the history Claude Code sends back later (its
    # max-tokens recovery prompts, which it records nowhere, left out)
    m = re.search(r"restored \S+ from (\w+) in [\d.]+ ms: (\d+) of (\d+) prompt tokens reused", s.log())
    assert m and m.group(1) == "disk", s.log()
    # what is not reused is the new user message and its glue
    assert int(m.group(2)) > 0.99 * int(m.group(3)), m.group(0)
    # another conversation (its own first message, so its own billing header)
    # shares the system prompt and tools through the block store
    assert s.stop() == 0
    s = serve(model, *args)
    claude(home, cwd, s.url, "Something else entirely.")
    m = re.search(r"slot \d+: (\d+) prompt tokens from \d+ stored blocks \(prefix lookup\)", s.log())
    assert m and int(m.group(1)) > 0.8 * first, (first, s.log())
    # usage sums the turn's requests (Claude Code continues a reply cut at
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS a few times)
    print(f"claude code: prompt tokens per turn {n1}, {n2}, {n3}; from cache {share1:.3f}, {share2:.3f}, "
          f"{share3:.3f}; a new conversation reused {m.group(1)} tokens from the block store")
