"""The block store on MLA models (deepseek2 family: DeepSeek V2/V3, Kimi K2,
GLM-4.7-Flash): libllama keeps a K-only latent cache (no V tensors, no V
parts in the state), so each block carries K rows only (kvlayout.h, flag 4)
and the tap cuts them straight from the cache (kvtap.h). On a small
generated deepseek2 model (mkmodel --arch deepseek2: latent 64 + 32 rope
dims, 1 dense layer, MoE): blocks, not whole states; a shared prefix
restored after a restart; the next turn from its manifest; an edited
history restored up to the edit; conversations diverging mid-block; q8_0
and -fa off round trips; the capture path of --no-kv-tap. Outputs are
compared with the reference: each conversation served alone by a fresh
server with no cache tier.

Every server here runs with -ub B (ubatches of one block). libllama's CPU
kernels for deepseek2's graph (the absorbed per-head matmuls of MLA) round
differently with the ubatch's size: at -ub 512 a conversation restored at
320 tokens with its last 25 prefilled drifted from the same 345 tokens
prefilled at once after 8 greedy tokens (two other conversations did
not) — and so did a server with no cache tier at all, given the first
320 tokens and then the 345: the restore was exact, the reference was
not. At -ub 32 all matched. With ubatches of B, a restored prefix's KV bytes
are the reference's and the rest is computed in the same ubatch as
there, so outputs must be equal, not merely close (DESIGN §6)."""
import glob
import os
import struct

import pytest

from harness import ask, chat, mkmodel, reply, shared_system, text, timings

B = 32


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla_models")
    return mkmodel(d / "deepseek2.gguf", "--arch", "deepseek2", "--layers", "3", "--seed", "8")


UB = ["-ub", str(B)]


def flags(d, *extra):
    return ["--kv-cache-dir", str(d), "--cache-ram", "0", "--kv-cache-min-tokens", "16",
            "--kv-cache-block", str(B), *UB, *extra]


def reference(serve, m, prompts, *extra, n=16):
    # a fresh server per prompt: the whole prompt prefilled at once, as the
    # served conversation's own prefill is
    out = []
    for p in prompts:
        s = serve(m, "-np", "1", "-c", "8192", "--cache-ram", "0", *UB, *extra)
        out.append(reply(chat(s, p, n)))
        s.stop()
    return out


def blocks(d):
    """[(size, flags)] of the TKB1 block files under d."""
    out = []
    for kv in glob.glob(str(d / "*.kv")):
        with open(kv, "rb") as f:
            head = f.read(8)
        if head[:4] == b"TKB1":
            out.append((os.path.getsize(kv), struct.unpack_from("<H", head, 6)[0]))
    return out


def check_blocks(s, d):
    log = s.log()
    assert "whole states" not in log, log
    bl = blocks(d)
    assert bl, "no block stored"
    assert all(f & 4 for _, f in bl), bl  # K rows only: the MLA latent
    return bl


def test_shared_prefix_restored_after_a_restart_equals_the_reference(serve, mla_model, tmp_path):
    convs = [[shared_system(), ask(i)] for i in range(3)]
    ref = reference(serve, mla_model, convs)
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(tmp_path))
    assert "stores cut their new blocks straight from the KV cache" in s.log()
    assert reply(chat(s, convs[0])) == ref[0]
    s.stop()
    check_blocks(s, tmp_path)
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(tmp_path))
    for i in (1, 2):
        r = chat(s, convs[i])
        assert reply(r) == ref[i], f"conversation {i}"
        if i == 1:  # a new conversation: the stored prefix's blocks
            t = timings(r)
            assert t["cache_source"] == "blocks", t
            assert t["cache_n"] >= B * 7 and t["cache_n"] % B == 0, t
    assert s.metrics()["thaw_kv_disk_prefix_hits_total"] >= 1
    s.stop()
    check_blocks(s, tmp_path)


def test_next_turn_restores_from_the_manifest_after_a_restart(serve, mla_model, tmp_path):
    conv = [shared_system(), ask(4)]
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path))
    r1 = chat(s, conv)
    s.stop()
    t2 = conv + [{"role": "assistant", "content": reply(r1)}, ask(5)]
    ref = reference(serve, mla_model, [conv, t2])
    assert reply(r1) == ref[0]
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(tmp_path))
    r = chat(s, t2)
    assert reply(r) == ref[1]
    assert r["cache_source"] == "disk", r["timings"]
    assert r["timings"]["cache_n"] > 0.8 * r["usage"]["prompt_tokens"]
    check_blocks(s, tmp_path)


def test_edited_history_restores_up_to_the_edit(serve, mla_model, tmp_path):
    first = [shared_system(), ask(1)]
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path))
    r1 = chat(s, first)
    long = first + [{"role": "assistant", "content": reply(r1)}, ask(2)]
    chat(s, long)
    s.stop()
    edited = [shared_system(), ask(7)] + long[2:]
    ref = reference(serve, mla_model, [edited])
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path))
    r = chat(s, edited)
    assert reply(r) == ref[0]
    t = timings(r)
    assert t["cache_source"] == "blocks" and t["cache_n"] > 0, t
    sys_tokens = s.post("/tokenize", {"content": shared_system()["content"]}).json()["tokens"]
    assert t["cache_n"] <= len(sys_tokens) + 16  # no further than the edit


def test_conversations_diverging_mid_block_never_mix(serve, mla_model, tmp_path):
    base = text(250, 11)
    convs = [[{"role": "system", "content": base + f" {w} " + text(20, 50 + k)}, ask(k)]
             for k, w in enumerate(("river", "stone", "light"))]
    ref = reference(serve, mla_model, convs)
    assert len(set(ref)) == 3, ref  # the replies tell the conversations apart
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path))
    for c in convs:
        chat(s, c)
    s.stop()
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(tmp_path))
    got = [chat(s, c) for c in reversed(convs)]
    assert [reply(r) for r in reversed(got)] == ref
    for r in got:
        assert 0 < r["timings"]["cache_n"] < r["usage"]["prompt_tokens"], r["timings"]


# MLA wants -ctk = -ctv (V is a view of K); the latent row is 96 values:
# three q8_0 blocks (34 bytes each per 32 values)
KV_CASES = [("q8_0", []), ("f16", ["-fa", "off"])]


@pytest.mark.parametrize("ctype,extra", KV_CASES, ids=["q8_0", "fa-off"])
def test_kv_types_and_fa_off_round_trip(serve, mla_model, tmp_path, ctype, extra):
    kv = ["-ctk", ctype, "-ctv", ctype, *extra]
    convs = [[shared_system(), ask(i)] for i in range(2)]
    ref = reference(serve, mla_model, convs, *kv)
    d = tmp_path / "kv"
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(d), *kv)
    assert reply(chat(s, convs[0])) == ref[0]
    s.stop()
    stored = sum(n for n, _ in check_blocks(s, d))
    s = serve(mla_model, "-np", "2", "-c", "8192", *flags(d), *kv)
    r = chat(s, convs[1])
    assert reply(r) == ref[1]
    assert r["cache_source"] == "blocks" and r["timings"]["cache_n"] >= 7 * B, r["timings"]
    s.stop()
    if ctype == "q8_0":
        # the same conversation in f16: 102 bytes a latent row instead of 192
        d16 = tmp_path / "f16"
        s = serve(mla_model, "-np", "2", "-c", "8192", *flags(d16))
        chat(s, convs[0])
        s.stop()
        f16 = sum(n for n, _ in check_blocks(s, d16))
        assert stored <= 0.6 * f16, (stored, f16)


def test_without_the_tap_blocks_come_from_a_capture_and_stay_exact(serve, mla_model, tmp_path):
    """--no-kv-tap: the path a GPU build takes (the KV cache in device
    memory): each store cuts its K-only blocks from a whole capture."""
    conv = [shared_system(), ask(6)]
    other = [shared_system(), ask(8)]
    ref = reference(serve, mla_model, [conv, other])
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path, "--no-kv-tap"))
    assert "stores cut their new blocks straight from the KV cache" not in s.log()
    assert reply(chat(s, conv)) == ref[0]
    s.stop()
    check_blocks(s, tmp_path)
    s = serve(mla_model, "-np", "1", "-c", "8192", *flags(tmp_path, "--no-kv-tap"))
    r = chat(s, other)
    assert reply(r) == ref[1]
    assert r["cache_source"] == "blocks" and r["timings"]["cache_n"] >= 7 * B, r["timings"]
