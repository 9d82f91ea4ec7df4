"""POST /v1/completions (OpenAI's legacy API, through the official `openai`
SDK and plain HTTP) and POST /completion (llama-server's): a raw prompt as
text or token ids, streamed and not, through the chat path's slots and
cache tiers. Outputs are compared with a reference served on the same
machine (greedy), never with fixed text or timings."""
import json
import os
import shutil
import subprocess

import pytest

from harness import REPO, drained, events, text, timings

NODE_MODULES = os.path.join(REPO, ".deps", "npm", "node_modules")
B = 16


def cmpl(s, prompt, n=12, path="/v1/completions", **kw):
    r = s.post(path, {"prompt": prompt, "max_tokens" if path == "/v1/completions" else "n_predict": n,
                      "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def tokens_of(s, prompt):
    r = s.post("/tokenize", {"content": prompt, "add_special": True})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_openai_sdk_completions(serve):
    if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_MODULES, "openai")):
        pytest.fail("node and the openai SDK are installed by scripts/setup.sh; run it first")
    s = serve("llama", "--api-key", "sekrit", "--alias", "thaw-tiny")
    prompt = "Once upon a time " + text(20, 1)
    toks = tokens_of_auth(s, prompt)
    script = os.path.join(os.path.dirname(__file__), "completions_client.mjs")
    link = os.path.join(os.path.dirname(__file__), "node_modules")
    if not os.path.exists(link):
        os.symlink(NODE_MODULES, link)
    p = subprocess.run(["node", script, s.url + "/v1", "sekrit", prompt, json.dumps(toks)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    c = out["text"]
    assert c["object"] == "text_completion" and c["id"].startswith("cmpl-") and c["text"]
    assert c["finish_reason"] in ("stop", "length")
    assert c["usage"]["prompt_tokens"] == len(toks) and c["usage"]["completion_tokens"] >= 1
    assert out["tokens"]["text"] == c["text"]  # the same prompt as ids: the same greedy reply
    assert out["stream"]["text"] == c["text"] and out["stream"]["finish_reason"] == c["finish_reason"]
    assert out["stream"]["chunks"] >= 2
    assert out["error"]["status"] == 400 and "one per request" in out["error"]["message"]


def tokens_of_auth(s, prompt):
    r = s.post("/tokenize", {"content": prompt, "add_special": True}, headers={"Authorization": "Bearer sekrit"})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_completion_plain_http_both_shapes(serve):
    s = serve("llama")
    prompt = "The sea and the sky " + text(15, 2)
    a = cmpl(s, prompt)
    b = cmpl(s, prompt, path="/completion")
    assert a["choices"][0]["text"] == b["content"]  # one engine behind both shapes
    assert b["stop"] is True and b["tokens_predicted"] == a["usage"]["completion_tokens"]
    assert b["tokens_evaluated"] == a["usage"]["prompt_tokens"]
    assert b["stop_type"] == ("limit" if a["choices"][0]["finish_reason"] == "length" else "eos")
    # the second request found the first one's prompt in the slot
    assert b["cache_source"] == "slot" and b["tokens_cached"] >= len(tokens_of(s, prompt)) - 1
    assert cmpl(s, tokens_of(s, prompt))["choices"][0]["text"] == a["choices"][0]["text"]
    assert cmpl(s, [prompt])["choices"][0]["text"] == a["choices"][0]["text"]

    # streamed: pieces join to the same text; /completion has no [DONE]
    r = s.post("/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0, "stream": True}, stream=True)
    ev = events(r)
    assert ev and "[DONE]" not in ev
    pieces = [json.loads(e) for e in ev]
    assert all(p["stop"] is False for p in pieces[:-1]) and pieces[-1]["stop"] is True
    assert "".join(p["content"] for p in pieces) == b["content"]
    r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True},
               stream=True)
    ev = events(r)
    assert ev[-1] == "[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == a["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]

    # errors name the field ([1, "x"] is llama-server's mixed prompt: served)
    for body, word in (({"max_tokens": 2}, "prompt"), ({"prompt": ""}, "empty"), ({"prompt": [1, 2.5]}, "prompt"),
                       ({"prompt": [10 ** 9]}, "token id"), ({"prompt": "x", "echo": True}, "echo"),
                       ({"prompt": "x", "grammar": "root ::= nowhere"}, "grammar"),
                       ({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}, "not both")):
        r = s.post("/v1/completions", body)
        assert r.status_code == 400 and word in r.json()["error"]["message"], (body, r.text)


def test_completion_grammar_and_schema_constrain(serve):
    s = serve("llama")
    r = cmpl(s, "Answer: ", n=8, path="/completion", grammar='root ::= "yes" | "no"')
    assert r["content"] in ("yes", "no")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = cmpl(s, "JSON: ", n=64, path="/completion", json_schema=schema)
    if r["stop_type"] == "eos":  # a complete object (random weights may run out of tokens first)
        assert isinstance(json.loads(r["content"])["n"], int)
    else:
        assert r["content"].lstrip().startswith("{")
    # chat takes the same fields (they were silently ignored before)
    c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                        "temperature": 0, "grammar": 'root ::= "yes" | "no"'}).json()
    assert c["choices"][0]["message"]["content"] in ("yes", "no")


def test_greedy_grammar_picks_what_the_grammar_first_chain_picks(serve):
    # a greedy pick asks the grammar about its best candidates first
    # (engine/grammar_check.h); a request for post-sampling probabilities
    # keeps the grammar-first chain (the probabilities are over every allowed
    # token): both give the same tokens, on a random model whose best
    # candidate the grammar seldom allows
    s = serve("llama")
    prompt = "Once upon a time " + text(20, 1)
    toks = tokens_of(s, " the river and the stone")[1:]  # no BOS
    forced = "root ::= " + " ".join(f"<[{t}]>" for t in toks)
    cases = [{"grammar": "root ::= [a-z ]{4,60}"},
             {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
             {"grammar": forced},
             {"grammar": forced, "logit_bias": [[t, 30] for t in toks]}]
    for kw in cases:
        fast = cmpl(s, prompt, n=40, path="/completion", cache_prompt=False, **kw)
        ref = cmpl(s, prompt, n=40, path="/completion", cache_prompt=False, n_probs=2, post_sampling_probs=True, **kw)
        assert fast["content"] == ref["content"], kw
        assert fast["tokens_predicted"] == ref["tokens_predicted"] >= 4, kw


def test_sampled_grammar_draws_only_what_it_allows_and_repeats_with_its_seed(serve):
    # a sampled pick checks the token drawn against the grammar and redraws
    # with the grammar first when it refuses (engine/grammar_check.h)
    s = serve("llama")
    prompt = "Once upon a time " + text(20, 1)
    for kw in ({"grammar": "root ::= [a-z ]{4,60}"},
               {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}):
        runs = [cmpl(s, prompt, n=48, path="/completion", cache_prompt=False, temperature=0.9, seed=7, **kw)
                for _ in range(2)]
        assert runs[0]["content"] == runs[1]["content"], kw
        other = cmpl(s, prompt, n=48, path="/completion", cache_prompt=False, temperature=0.9, seed=8, **kw)
        c = runs[0]["content"]
        if "grammar" in kw:
            assert c and set(c) <= set("abcdefghijklmnopqrstuvwxyz "), c
        elif runs[0]["stop_type"] == "eos":
            assert isinstance(json.loads(c)["n"], int)
        else:
            assert c.lstrip().startswith("{"), c
        assert other["tokens_predicted"] >= 4


def test_raw_prompt_prefix_comes_from_the_block_store_after_a_restart(serve, tmp_path):
    base = "Shared preamble. " + text(200, 5)
    second = base + " And then the question " + text(20, 6)
    ref = serve("llama", "-np", "1", "-c", "4096", "--cache-ram", "0")
    want = [cmpl(ref, p, cache_prompt=False)["choices"][0]["text"] for p in (base, second)]
    ref.stop()
    flags = ["-np", "1", "-c", "4096", "--kv-cache-dir", str(tmp_path), "--cache-ram", "0",
             "--kv-cache-min-tokens", "1", "--kv-cache-block", str(B)]
    s = serve("llama", *flags)
    assert cmpl(s, base)["choices"][0]["text"] == want[0]
    drained(s)
    s.stop()
    s = serve("llama", *flags)
    r = cmpl(s, second)
    t = timings(r)
    assert t["cache_source"] == "blocks" and t["cache_n"] >= B and t["cache_n"] % B == 0, t
    assert r["choices"][0]["text"] == want[1]
    # llama-server's shape reports the same reuse
    s.stop()
    s = serve("llama", *flags)
    r = cmpl(s, second, path="/completion")
    assert r["cache_source"] in ("blocks", "disk") and r["tokens_cached"] >= B
    assert r["content"] == want[1]
