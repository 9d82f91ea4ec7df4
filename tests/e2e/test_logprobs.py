"""Per-token probabilities: chat's logprobs/top_logprobs, /v1/completions'
integer logprobs, /completion's n_probs and post_sampling_probs, streamed
and not, with and without a draft model. Every assertion holds for any
random weights: properties of a distribution (logprobs <= 0, lists sorted,
the greedy pick is the top candidate), and equality with the same request
served another way on the same machine."""
import json
import math

import pytest

from harness import events, user

PROMPT = "Once upon a time there was a little"


def entries_ok(entries, n_top, post=False):
    """The llama-server / OpenAI shape and what any distribution satisfies."""
    key, tkey = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    for e in entries:
        assert set(e) >= {"id", "token", "bytes", key, tkey}, e
        raw = bytes(e["bytes"])
        try:
            assert raw.decode("utf-8") == e["token"]
        except UnicodeDecodeError:
            pass  # a byte-fallback piece: "token" is cut before the bad bytes
        top = [t[key] for t in e[tkey]]
        assert top == sorted(top, reverse=True)
        if post:
            assert 0 < e[key] <= 1 and all(0 < p <= 1 for p in top)
            assert sum(top) <= 1 + 1e-4
            assert len(e[tkey]) <= n_top
        else:
            assert e[key] <= 0 and all(lp <= 0 for lp in top)
            assert sum(math.exp(lp) for lp in top) <= 1 + 1e-4
            assert len(e[tkey]) == n_top
            if n_top:  # the sampled token is never more probable than the best candidate
                assert e[key] <= top[0] + 1e-6


def test_chat_logprobs_plain_and_streamed(serve):
    s = serve("llama")
    msgs = [user("Tell me a story about " + PROMPT)]
    body = {"logprobs": True, "top_logprobs": 5, "max_tokens": 12, "cache_prompt": False}
    r = s.chat(msgs, **body)
    lp = r["choices"][0]["logprobs"]["content"]
    assert len(lp) == r["usage"]["completion_tokens"] or len(lp) == r["usage"]["completion_tokens"] - 1  # EOG has none
    entries_ok(lp, 5)
    for e in lp:  # greedy: the pick is the most probable token before sampling
        assert e["id"] == e["top_logprobs"][0]["id"] and e["logprob"] == e["top_logprobs"][0]["logprob"]
    assert "".join(e["token"] for e in lp) == r["choices"][0]["message"]["content"]

    resp = s.post("/v1/chat/completions", {"messages": msgs, "temperature": 0, "stream": True, **body}, stream=True)
    chunks = [json.loads(d) for d in events(resp) if d != "[DONE]"]
    streamed, text = [], ""
    for c in chunks[1:]:
        for ch in c["choices"]:
            if ch.get("finish_reason") is None:
                assert ch["logprobs"] is not None  # every delta carries its tokens' (maybe none)
                text += ch["delta"].get("content") or ""
            if ch.get("logprobs"):
                streamed += ch["logprobs"]["content"]
    assert text == r["choices"][0]["message"]["content"]
    assert [e["id"] for e in streamed] == [e["id"] for e in lp]  # same entries, same tokens
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in lp]  # same batches: bit-equal


def test_chat_logprobs_without_top_and_defaults(serve):
    s = serve("llama")
    r = s.chat([user(PROMPT)], logprobs=True, top_logprobs=0, max_tokens=4)
    lp = r["choices"][0]["logprobs"]["content"]
    assert lp and all(e["top_logprobs"] == [] for e in lp)
    r = s.chat([user(PROMPT)], logprobs=True, max_tokens=4)
    assert all(len(e["top_logprobs"]) == 20 for e in r["choices"][0]["logprobs"]["content"])  # llama-server's default
    r = s.chat([user(PROMPT)], max_tokens=4)
    assert not r["choices"][0].get("logprobs")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [user("x")], "logprobs": True, "top_logprobs": 21}),
    ("/v1/chat/completions", {"messages": [user("x")], "top_logprobs": 3}),
    ("/v1/chat/completions", {"messages": [user("x")], "logprobs": 3}),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}),
    ("/completion", {"prompt": "x", "n_probs": 101}),
    ("/completion", {"prompt": "x", "n_probs": -1}),
    ("/completion", {"prompt": "x", "n_probs": 2, "post_sampling_probs": "yes"}),
])
def test_bounds_are_400(serve, path, body):
    s = serve("llama")
    r = s.post(path, body)
    assert r.status_code == 400, r.text
    assert "probs" in r.json()["error"]["message"], r.text


def test_completion_n_probs_plain_and_streamed(serve):
    s = serve("llama")
    body = {"prompt": PROMPT, "n_probs": 10, "temperature": 0, "n_predict": 8, "cache_prompt": False}
    r = s.post("/completion", body)
    assert r.status_code == 200, r.text
    cp = r.json()["completion_probabilities"]
    assert len(cp) == r.json()["tokens_predicted"] or len(cp) == r.json()["tokens_predicted"] - 1
    entries_ok(cp, 10)
    assert all(e["id"] == e["top_logprobs"][0]["id"] for e in cp)
    assert r.json()["generation_settings"]["n_probs"] == 10

    resp = s.post("/completion", {**body, "stream": True}, stream=True)
    streamed, text = [], ""
    for d in events(resp):
        c = json.loads(d)
        if not c["stop"]:  # llama-server's: one piece per token, with that token's entry
            assert len(c["completion_probabilities"]) == 1
            e = c["completion_probabilities"][0]
            try:
                assert bytes(e["bytes"]).decode("utf-8") == c["content"]
            except UnicodeDecodeError:
                pass
            streamed.append(e)
            text += c["content"]
    assert text == r.json()["content"]
    assert streamed == cp


def test_completion_post_sampling_probs(serve):
    s = serve("llama")
    body = {"prompt": PROMPT, "n_probs": 10, "n_predict": 8, "post_sampling_probs": True}
    r = s.post("/completion", {**body, "temperature": 1.0, "top_k": 5, "seed": 7})
    assert r.status_code == 200, r.text
    cp = r.json()["completion_probabilities"]
    entries_ok(cp, 5, post=True)  # top_k 5 leaves at most 5 candidates
    for e in cp:
        assert e["id"] in [t["id"] for t in e["top_probs"]]  # the pick is one the chain left
        assert sum(t["prob"] for t in e["top_probs"]) == pytest.approx(1.0, abs=1e-4)  # all of them, normalised
    # greedy after the chain: the pick alone, certain
    r = s.post("/completion", {**body, "temperature": 0})
    for e in r.json()["completion_probabilities"]:
        assert e["prob"] == 1.0 and [t["id"] for t in e["top_probs"]] == [e["id"]]


def test_v1_completions_logprobs_legacy_and_llama_shape(serve):
    s = serve("llama")
    body = {"prompt": PROMPT, "logprobs": 3, "temperature": 0, "max_tokens": 8, "cache_prompt": False}
    r = s.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    lp = ch["logprobs"]
    entries_ok(lp["content"], 3)
    n = len(lp["content"])
    assert n >= 1 and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == ch["text"]
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert all(len(t) <= 3 for t in lp["top_logprobs"])
    resp = s.post("/v1/completions", {**body, "stream": True}, stream=True)
    streamed = []
    for d in events(resp):
        if d != "[DONE]" and json.loads(d)["choices"][0]["logprobs"]:
            streamed += json.loads(d)["choices"][0]["logprobs"]["tokens"]
    assert streamed == lp["tokens"]


def test_logprobs_with_a_draft_are_the_targets(serve, models):
    """Draft-accepted tokens get their probabilities from the target's row
    of the verify batch: the same tokens and (up to the batch shape's last
    bits) the same numbers as without a draft."""
    body = {"prompt": PROMPT, "n_probs": 5, "temperature": 0, "n_predict": 16, "cache_prompt": False}
    plain = serve("llama", "-np", "1").post("/completion", body).json()
    spec = serve("llama", "-np", "1", "-md", models["llama"], "--draft-p-min", "0", "--draft-max", "8")
    r = spec.post("/completion", body).json()
    assert r["timings"]["draft_n_accepted"] > 0
    a, b = plain["completion_probabilities"], r["completion_probabilities"]
    assert [e["id"] for e in a] == [e["id"] for e in b]
    for x, y in zip(a, b):
        assert y["logprob"] == pytest.approx(x["logprob"], abs=1e-2)
        assert [t["id"] for t in y["top_logprobs"][:2]] == [t["id"] for t in x["top_logprobs"][:2]]
