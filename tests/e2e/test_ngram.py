"""Speculative decoding with n-gram drafts (--spec-type ngram-*): drafts
copied from the slot's own conversation, verified by the target, so the
output is the target's alone; drafts come from the whole conversation,
restored history included; each request drafts only from its own slot's
tokens.

A random-weight model rarely repeats itself, so these tests steer it: a
logit bias on three words keeps its greedy reply inside a tiny alphabet,
where it falls into runs that recur, and short n-grams (-size-n 3) find
them. The drafts are then right often and wrong often: both the accepted
and the rolled-back paths run."""
import subprocess

import pytest

from harness import THAW, WORDS, chat, conversation, idle, kv_flags, reply, timings

KINDS = {
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"],
    "ngram-map-k": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "2",
                      "--spec-ngram-map-k4v-size-m", "4"],
    "ngram-mod": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "3", "--spec-ngram-mod-n-min", "2",
                  "--spec-ngram-mod-n-max", "16"],
}


def bias(s, n_words=3):
    ids = [s.post("/tokenize", {"content": " " + w, "add_special": False}).json()["tokens"][0] for w in WORDS[:n_words]]
    return {str(t): 30 for t in ids}


def ask(s, msgs, n, b, stream=False):
    body = {"messages": msgs, "max_tokens": n, "temperature": 0, "logit_bias": b}
    if not stream:
        r = s.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        j = r.json()
        return reply(j), j["timings"]
    text, final, _, _ = s.chat_stream(msgs, max_tokens=n, temperature=0, logit_bias=b)
    return text, final["timings"]


def run_all(s, convs, n):
    b = bias(s)
    out, drafted, accepted = [], 0, 0
    for c in convs:
        for stream in (False, True):
            text, t = ask(s, c, n, b, stream)
            out.append(text)
            drafted += t["draft_n"]
            accepted += t["draft_n_accepted"]
    return out, drafted, accepted


@pytest.mark.parametrize("arch,kind", [("llama", k) for k in KINDS] + [("gemma3", "ngram-simple")])
def test_greedy_output_identical_with_and_without_ngram_drafts(serve, arch, kind):
    convs = [conversation(i, 40) for i in range(3)]
    plain = serve(arch, "-np", "1")
    want, d0, _ = run_all(plain, convs, 96)
    plain.stop()
    assert d0 == 0
    spec = serve(arch, "-np", "1", *KINDS[kind])
    got, drafted, accepted = run_all(spec, convs, 96)
    assert got == want
    # the drafts were tried, and both verdicts happened: kept and rolled back
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)
    assert f"n-gram drafts from each slot's conversation: {kind}" in spec.log()


def test_seeded_sampling_is_the_same_with_and_without_ngram_drafts(serve):
    # at temperature > 0 the verify path samples every emitted token at its
    # own row with the request's sampler, in order: the same seed draws the
    # same tokens as without drafts (the bias keeps the distribution far
    # from flat, so the logits' last bits, which a batch moves, decide no
    # draw), while drafts are tried, and some rejected
    body = dict(temperature=0.8, top_k=3, seed=42, max_tokens=80, cache_prompt=False)
    convs = [conversation(i, 40) for i in range(2)]
    plain = serve("llama", "-np", "1")
    b = bias(plain)
    want = [reply(plain.post("/v1/chat/completions", {**body, "messages": c, "logit_bias": b}).json()) for c in convs]
    plain.stop()
    spec = serve("llama", "-np", "1", *KINDS["ngram-simple"])
    got = [spec.post("/v1/chat/completions", {**body, "messages": c, "logit_bias": b}).json() for c in convs]
    assert [reply(r) for r in got] == want
    drafted = sum(r["timings"]["draft_n"] for r in got)
    accepted = sum(r["timings"]["draft_n_accepted"] for r in got)
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)


def test_drafts_accepted_on_a_reply_that_repeats_the_prompt(serve):
    # the reference: the model's own greedy reply, then the same question
    # again with that reply in the history: the second reply's runs are
    # in the prompt from its first token on
    s = serve("llama", "-np", "1", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4")
    b = bias(s)
    conv = conversation(5, 40)
    r1, _ = ask(s, conv, 120, b)
    conv2 = conv + [{"role": "assistant", "content": r1}, {"role": "user", "content": conv[-1]["content"]}]
    r2, t = ask(s, conv2, 120, b)
    assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0
    m = s.metrics()
    assert m["thaw_draft_tokens_total"] >= t["draft_n"] and m["thaw_draft_accepted_total"] >= t["draft_n_accepted"]
    # /slots shows the last request's acceptance, and that the slot drafts
    # (published when the slot leaves GEN, which may be just after the
    # client has its reply)
    idle(s)
    (slot,) = s.get("/slots").json()
    assert slot["speculative"] is True
    assert slot["thaw"]["draft_n"] == t["draft_n"] and slot["thaw"]["draft_n_accepted"] == t["draft_n_accepted"]
    assert 0 < slot["thaw"]["draft_acceptance_rate"] <= 1
    assert "drafts: %d of %d accepted" % (t["draft_n_accepted"], t["draft_n"]) in s.log()
    s.stop()
    plain = serve("llama", "-np", "1")
    assert ask(plain, conv, 120, b)[0] == r1 and ask(plain, conv2, 120, b)[0] == r2


def forced(s, text):
    """A grammar whose only sentence is text's tokens, token by token: a
    reply that copies what the conversation holds, whatever the model."""
    toks = s.post("/tokenize", {"content": text, "add_special": False}).json()["tokens"]
    return "root ::= " + " ".join(f"<[{t}]>" for t in toks), len(toks)


def test_restored_conversation_drafts_from_its_history(serve, tmp_path):
    # turn 1 quotes a passage U (every word once: no n-gram of U recurs in
    # U itself); turn 2, after a restart, restores turn 1 from disk and
    # its reply is U again (forced by a grammar). Its drafts can only come
    # from the restored history.
    passage = " " + " ".join(WORDS)
    conv = [{"role": "system", "content": "You repeat what you are given."},
            {"role": "user", "content": "Repeat this:" + passage}]
    flags = ["-np", "1", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
             *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    s = serve("llama", *flags)
    r1 = reply(chat(s, conv, 8))
    s.stop()
    conv2 = conv + [{"role": "assistant", "content": r1}, {"role": "user", "content": "Once more."}]
    s = serve("llama", *flags)
    g, n = forced(s, passage)
    r = s.post("/v1/chat/completions", {"messages": conv2, "max_tokens": n + 4, "temperature": 0, "grammar": g}).json()
    t = timings(r)
    assert reply(r) == passage.strip() or reply(r) == passage
    assert t["cache_source"] == "disk" and t["cache_n"] > 0
    assert t["draft_n"] > 0 and t["draft_n_accepted"] >= n // 2, t
    s.stop()
    # the control: the same reply without the passage in the history
    s = serve("llama", "-np", "1", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3")
    r = s.post("/v1/chat/completions", {"messages": [conv[0], {"role": "user", "content": "Once more."}],
                                        "max_tokens": n + 4, "temperature": 0, "grammar": g}).json()
    assert r["timings"]["draft_n"] == 0, r["timings"]


def test_each_slot_drafts_from_its_own_conversation_only(serve):
    # the same two conversations served one after the other on one slot,
    # and each alone on a fresh server: every request's drafts are the
    # same, so none drafted from what another left in the slot (no
    # shared index: no timing channel between requests)
    convs = [conversation(i, 40) for i in range(2)]
    flags = ["-np", "1", "--spec-type", "ngram-simple,ngram-map-k", "--spec-ngram-simple-size-n", "3",
             "--spec-ngram-map-k-size-n", "3", "--no-cache-prompt"]
    s = serve("llama", *flags)
    b = bias(s)
    both = [ask(s, c, 64, b)[1] for c in convs]
    s.stop()
    for c, t in zip(convs, both):
        s = serve("llama", *flags)
        alone = ask(s, c, 64, b)[1]
        s.stop()
        assert (alone["draft_n"], alone["draft_n_accepted"]) == (t["draft_n"], t["draft_n_accepted"])


def test_spec_type_flags():
    def run(*args):
        p = subprocess.run([THAW, "serve", *args], capture_output=True, text=True, timeout=60)
        return p.returncode, [l for l in p.stderr.splitlines() if not l.startswith("load_backend:")]
    for kind in ("ngram-cache", "draft-mtp", "draft-eagle3"):
        rc, err = run("--spec-type", kind)
        assert rc == 2 and len(err) == 1 and err[0].startswith(f"thaw: --spec-type: {kind} is not implemented"), err
    rc, err = run("--spec-type", "ngram-simple,bogus")
    assert rc == 2 and "--spec-type" in err[0]
    rc, err = run("--spec-type", "draft-simple", "-m", "x.gguf")
    assert rc == 2 and "needs a draft model" in err[-1]
    rc, err = run("--spec-type", "ngram-simple,ngram-mod", "--spec-ngram-mod-n-match", "16")
    assert rc == 2 and err[-1].startswith("thaw: no model given")


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    from harness import mkmodel
    d = tmp_path_factory.mktemp("hybrids")
    return {"lfm2": mkmodel(d / "lfm2.gguf", "--arch", "lfm2", "--seed", "3", "--layers", "4"),
            "qwen35": mkmodel(d / "qwen35.gguf", "--arch", "qwen35", "--seed", "4", "--layers", "4")}


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_hybrid_target_speculates_and_its_greedy_output_is_the_same(serve, hybrids, arch):
    """A hybrid's recurrent state cannot drop a rejected draft: each verify
    keeps a checkpoint of it, and a rejection rolls back to it and decodes
    the accepted tokens again. The words are the same as without drafts,
    both verdicts happen, on two slots at once (every slot's rows are
    sampled before a rollback decodes again)."""
    import threading
    convs = [conversation(i, 40) for i in range(2)]

    def both(s):
        b = bias(s)
        out = [None, None]

        def one(i):
            out[i] = ask(s, convs[i], 96, b, stream=i == 1)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        return out

    plain = serve(hybrids[arch], "-np", "2")
    want = [text for text, _ in both(plain)]
    plain.stop()
    spec = serve(hybrids[arch], "-np", "2", *KINDS["ngram-simple"])
    got = both(spec)
    assert [text for text, _ in got] == want
    drafted = sum(t["draft_n"] for _, t in got)
    accepted = sum(t["draft_n_accepted"] for _, t in got)
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)
    m = spec.metrics()
    assert m["thaw_draft_tokens_total"] == drafted
    # a turn after it continues from the slot (its state as n_tokens says) with the same words
    b = bias(spec)
    conv2 = convs[0] + [{"role": "assistant", "content": got[0][0]}, {"role": "user", "content": "again"}]
    r2, t2 = ask(spec, conv2, 48, b)
    assert t2["cache_n"] > 0, t2
    spec.stop()
    plain = serve(hybrids[arch], "-np", "2")
    assert ask(plain, convs[0], 96, bias(plain))[0] == got[0][0]
    assert ask(plain, conv2, 48, bias(plain))[0] == r2
