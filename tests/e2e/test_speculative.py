"""Speculative decoding with a draft model (-md): the output is the
target's, the target runs far less often, and the draft's state travels
with the disk cache (.dft)."""
import concurrent.futures as cf
import glob
import os

import pytest

from harness import chat, conversation, kv_flags, mkmodel, reply, turn2, timings

CONV = conversation(3, 120)


@pytest.fixture(scope="module")
def drafts(models, tmp_path_factory):
    d = tmp_path_factory.mktemp("drafts")
    return {
        "small": mkmodel(d / "draft.gguf", "--draft-of", models["llama"], "--layers", "1", "--embd", "32",
                         "--heads", "2", "--seed", "11"),
        "othervocab": mkmodel(d / "other.gguf", "--vocab", "llama-spm", "--layers", "1", "--embd", "32",
                              "--heads", "2"),
    }


@pytest.mark.parametrize("slots", [1, 2])
def test_greedy_output_identical_with_and_without_draft(serve, drafts, slots):
    convs = [conversation(i, 60) for i in range(2)]
    plain = serve("llama", "-np", str(slots))
    want = [reply(chat(plain, c, 40)) for c in convs]
    plain.stop()
    spec = serve("llama", "-np", str(slots), "-md", drafts["small"], "--draft-p-min", "0")
    # compared in the reference's order: with both slots in one batch, ggml's
    # kernels change the logits' last bits (DESIGN §6), and a random-weight
    # model's near-ties then flip greedy picks whatever the draft does
    got = [chat(spec, c, 40) for c in convs]
    assert [reply(r) for r in got] == want
    assert sum(r["timings"]["draft_n"] for r in got) > 0
    with cf.ThreadPoolExecutor(2) as ex:  # concurrent slots with drafts: served, and drafting
        both = list(ex.map(lambda c: chat(spec, c, 40), convs))
    assert all(r["timings"]["draft_n"] > 0 for r in both)
    text, final, _, _ = spec.chat_stream(convs[0], max_tokens=40)
    assert text == want[0]
    assert final["timings"]["draft_n"] > 0


def test_target_as_its_own_draft_accepts_everything(serve, models):
    s = serve("llama", "-np", "1", "-md", models["llama"], "--draft-p-min", "0", "--draft-max", "8")
    r = chat(s, CONV, 64)
    t = timings(r)
    assert t["draft_n"] > 0
    assert t["draft_n_accepted"] >= 0.95 * t["draft_n"]
    m = s.metrics()
    # one target decode for the prompt, then about one per 9 emitted tokens
    assert m["thaw_decode_calls_total"] < t["predicted_n"] / 3
    assert m["thaw_draft_acceptance_rate"] >= 0.95


def test_sampling_with_draft_is_seeded_and_valid(serve, drafts):
    # no prefix reuse: the second request must see the first's logits bit
    # for bit (a reused prefix decodes the last prompt token alone, which
    # moves the logits' last bits, and a random model's near-flat
    # distribution turns that into other draws)
    kw = dict(temperature=0.9, top_k=20, seed=42, max_tokens=24, messages=CONV, cache_prompt=False)
    s = serve("llama", "-md", drafts["small"], "--draft-p-min", "0")
    a = s.post("/v1/chat/completions", kw).json()
    b = s.post("/v1/chat/completions", kw).json()
    assert reply(a) == reply(b)  # the target's sampler, same seed, same draws
    assert a["timings"]["predicted_n"] == 24 or a["choices"][0]["finish_reason"] == "stop"


def test_draft_with_other_vocabulary_is_refused(models, drafts):
    import subprocess
    from harness import THAW
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "-md", drafts["othervocab"], "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "vocabulary" in p.stderr


def test_dft_restored_after_restart_and_corruption_costs_only_the_draft(serve, drafts, tmp_path):
    flags = ["-np", "1", "-md", drafts["small"], "--draft-p-min", "0",
             *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    s = serve("llama", *flags)
    r1 = chat(s, CONV, 24)
    s.stop()
    assert glob.glob(str(tmp_path / "*.dft")), "no .dft stored"
    s = serve("llama", *flags)
    r2 = chat(s, turn2(CONV, r1, 3), 24)
    t = timings(r2)
    assert t["cache_source"] == "disk"
    # both contexts got the reused prefix back
    assert t["draft_restored"] >= t["cache_n"] > 0
    s.stop()

    # a corrupt .dft: the entry still serves the target; only the draft prefills
    plain = serve("llama", "-np", "1")
    want = reply(chat(plain, turn2(CONV, r1, 3), 24))
    plain.stop()
    for f in glob.glob(str(tmp_path / "*")):
        os.unlink(f)
    s = serve("llama", *flags)
    chat(s, CONV, 24)
    s.stop()
    (dft,) = glob.glob(str(tmp_path / "*.dft"))
    with open(dft, "r+b") as f:
        f.seek(64)
        f.write(b"\x00\xff\x00\xff")
    s = serve("llama", *flags)
    r = chat(s, turn2(CONV, r1, 3), 24)
    assert r["cache_source"] == "disk" and r["timings"]["cache_n"] > 0
    assert r["timings"]["draft_restored"] == 0
    assert reply(r) == want
    s.stop()
    # and a missing one likewise
    for f in glob.glob(str(tmp_path / "*.dft")):
        os.unlink(f)
    s = serve("llama", *flags)
    r = chat(s, turn2(CONV, r1, 3), 24)
    assert r["cache_source"] == "disk" and r["timings"]["draft_restored"] == 0
    assert reply(r) == want


def test_entries_without_draft_serve_a_server_with_one_and_back(serve, drafts, tmp_path):
    plain_flags = ["-np", "1", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    spec_flags = plain_flags + ["-md", drafts["small"], "--draft-p-min", "0"]
    s = serve("llama", *plain_flags)
    r1 = chat(s, CONV, 24)
    s.stop()
    s = serve("llama", *spec_flags)
    r2 = chat(s, turn2(CONV, r1, 3), 24)
    assert r2["cache_source"] == "disk"
    s.stop()
    conv3 = turn2(CONV, r1, 3) + [{"role": "assistant", "content": reply(r2)},
                                  {"role": "user", "content": "Once more."}]
    s = serve("llama", *plain_flags)
    assert chat(s, conv3, 8)["cache_source"] == "disk"


def test_hybrid_target_with_a_draft_model(serve, tmp_path):
    """A Qwen3.5-shaped (hybrid) target with an attention draft: every
    rejected draft rolls the target's recurrent state back through the
    checkpoint taken before its verify; the words are the target's own."""
    target = mkmodel(tmp_path / "qwen35.gguf", "--arch", "qwen35", "--seed", "5", "--layers", "4")
    draft = mkmodel(tmp_path / "draft.gguf", "--draft-of", target, "--layers", "1", "--embd", "32", "--heads", "2",
                    "--seed", "12")
    convs = [conversation(i, 60) for i in range(2)]
    plain = serve(target, "-np", "1")
    want = [reply(chat(plain, c, 40)) for c in convs]
    plain.stop()
    spec = serve(target, "-np", "1", "-md", draft, "--draft-p-min", "0")
    got = [chat(spec, c, 40) for c in convs]
    assert [reply(r) for r in got] == want
    drafted = sum(r["timings"]["draft_n"] for r in got)
    accepted = sum(r["timings"]["draft_n_accepted"] for r in got)
    assert drafted > 0 and accepted < drafted, (drafted, accepted)  # rejections rolled back
