"""The OpenAI Responses API (POST /v1/responses): the official `openai` SDK's
Responses client against thaw, the raw event stream, items echoed back as
input, errors, and the cache across turns. Generated models, so replies are
compared with each other (streamed vs plain, greedy), never with recorded
text."""
import json
import os
import re
import shutil
import subprocess

import pytest

from agent_clis import CODEX, codex
from harness import REPO, mkmodel

NODE_MODULES = os.path.join(REPO, ".deps", "npm", "node_modules")
HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return mkmodel(tmp_path_factory.mktemp("responses") / "qwen3.gguf", "--arch", "qwen3", "--seed", "7")


def events(r):
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
        out.append(data)
        name = None
    return out


def shape(r):
    """A response's output without what each response names for itself (ids) or
    the SDK adds (parsed)."""
    return [(i["type"], i.get("name"), i.get("arguments"), [c.get("text") for c in i.get("content") or []])
            for i in r["output"]]


def test_stream_events_and_plain_agree(serve, qwen3):
    s = serve(qwen3)
    body = {"model": "m", "max_output_tokens": 24, "temperature": 0, "instructions": "Be brief.",
            "input": [{"role": "user", "content": "Tell me about the sea."}]}
    p = s.post("/v1/responses", body)
    assert p.status_code == 200, p.text
    p = p.json()
    assert p["object"] == "response" and p["id"].startswith("resp_")
    assert p["output"][0]["type"] == "message" and p["output"][0]["id"].startswith("msg_")
    evs = events(s.post("/responses", {**body, "stream": True}, stream=True))
    types = [e["type"] for e in evs]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    final = evs[-1]["response"]
    assert final["output"] == done and final["output"][0]["content"][0]["text"] == text
    # each response names its own items
    assert [{**i, "id": None} for i in final["output"]] == [{**i, "id": None} for i in p["output"]]
    u = final["usage"]
    assert u["input_tokens"] == p["usage"]["input_tokens"]
    # the same prompt again: all but the one token decoded for logits came from the slot
    assert u["input_tokens_details"]["cached_tokens"] == u["input_tokens"] - 1


def test_function_call_round_trip_from_cache(serve, qwen3, tmp_path):
    if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_MODULES, "openai")):
        pytest.fail("node and the openai SDK are installed by scripts/setup.sh; run it first")
    s = serve(qwen3, "--api-key", "sekrit")
    shutil.copy(os.path.join(HERE, "responses_client.mjs"), tmp_path / "client.mjs")
    os.symlink(NODE_MODULES, tmp_path / "node_modules")
    p = subprocess.run(["node", str(tmp_path / "client.mjs"), s.url + "/v1", "sekrit"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["plain"]["output_text"] and shape(out["plain_stream"]) == shape(out["plain"])
    assert out["plain_events"][0] == "response.created" and out["plain_events"][-1] == "response.completed"
    calls = [i for i in out["tool"]["output"] if i["type"] == "function_call"]
    assert calls and all(c["name"] == "get_weather" and json.loads(c["arguments"])["city"] in ("Paris", "London")
                         for c in calls), out["tool"]
    assert shape(out["tool_stream"]) == shape(out["tool"])
    assert shape(out["tool_result_stream"]) == shape(out["tool_result"])
    u = out["tool_result"]["usage"]
    assert u["input_tokens_details"]["cached_tokens"] > 0.5 * u["input_tokens"], u
    for e in out["errors"]:
        assert e and e["status"] == 400, e
    assert "store" in out["errors"][1]["message"] and "previous_response_id" in out["errors"][2]["message"]
    assert out["after"]["output_text"] == out["plain"]["output_text"]


def test_codex_continues_from_cache_across_a_restart(serve, tmp_path_factory):
    if not os.path.isfile(CODEX):
        pytest.fail("@openai/codex is installed by scripts/setup.sh; run it first")
    d = tmp_path_factory.mktemp("codex")
    model = mkmodel(d / "qwen3.gguf", "--arch", "qwen3", "--seed", "12", "--ctx-train", "65536")
    home, cwd, cache = d / "home", d / "project", d / "kv"
    home.mkdir()
    cwd.mkdir()
    args = ("-np", "1", "-c", "65536", "-n", "24", "--api-key", "k", "--kv-cache-dir", str(cache))
    s = serve(model, *args)
    u1 = codex(home, cwd, s.url, "Say hello.")
    assert u1["input_tokens"] > 2000, u1  # Codex's instructions and tools were rendered
    u2 = codex(home, cwd, s.url, "resume", "--last", "And goodbye.")
    assert s.stop() == 0
    s = serve(model, *args)
    u3 = codex(home, cwd, s.url, "resume", "--last", "Once more.")
    assert re.search(r"restored \S+ from (disk|blocks)", s.log()), s.log()
    shares = []
    for u in (u1, u2, u3):
        shares.append(u.get("cached_input_tokens", 0) / u["input_tokens"])
    # Codex's usage totals are per thread: turn k's own share is the difference
    print(f"codex: input tokens {u1['input_tokens']}, {u2['input_tokens']}, {u3['input_tokens']}; "
          f"cached {u1.get('cached_input_tokens')}, {u2.get('cached_input_tokens')}, {u3.get('cached_input_tokens')}")
    for a, b in ((u1, u2), (u2, u3)):
        n = b["input_tokens"] - a["input_tokens"]
        c = b.get("cached_input_tokens", 0) - a.get("cached_input_tokens", 0)
        if n <= 0:  # a resumed thread's totals start over
            n, c = b["input_tokens"], b.get("cached_input_tokens", 0)
        assert c >= 0.9 * n, (a, b)
