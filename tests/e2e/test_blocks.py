"""The block store end to end (--kv-cache-block, DESIGN §9): prefixes shared
across conversations and restored after a restart, an edited history
restored up to the edit, conversations sharing blocks then diverging
mid-block, a corrupt block, and a change of -np and -c. Outputs are
compared with the resident reference (each conversation served alone from
a slot, no cache tier); greedy, real binary, real files."""
import glob
import os
import re

from harness import chat, drained, reply, text, timings

B = 32  # small blocks: short test conversations span several


def flags(d, *extra):
    return ["--kv-cache-dir", str(d), "--cache-ram", "0", "--kv-cache-min-tokens", "16",
            "--kv-cache-block", str(B), *extra]


def shared_system():
    return {"role": "system", "content": "Shared rules and tools. " + text(250, 3)}


def ask(i):
    return {"role": "user", "content": f"Job {i}: " + text(30, 100 + i)}


def reference(serve, prompts, n=16):
    s = serve("llama", "-np", "1", "-c", "8192", "--cache-ram", "0")
    out = []
    for p in prompts:
        s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "reset"}], "max_tokens": 1})
        out.append(reply(chat(s, p, n)))
    s.stop()
    return out


def metric(s, name):
    m = s.metrics()
    assert name in m, f"{name} is not in /metrics"  # a renamed metric must not read as 0
    return m[name]


def test_shared_prefix_is_written_once_and_serves_new_conversations_after_a_restart(serve, tmp_path):
    convs = [[shared_system(), ask(i)] for i in range(4)]
    ref = reference(serve, convs)
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    assert reply(chat(s, convs[0])) == ref[0]
    s.stop()  # the store of conversation 0 is on disk now
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    for i in (1, 2, 3):
        r = chat(s, convs[i])
        t = timings(r)
        assert reply(r) == ref[i], f"conversation {i}"
        if i == 1:  # a new conversation: the stored prefix's whole blocks
            assert t["cache_source"] == "blocks", t
            assert t["cache_n"] >= B * 8 and t["cache_n"] % B == 0, t
    # the shared blocks were skipped, not written again
    assert metric(s, "thaw_kv_disk_blocks_skipped_total") >= 8
    assert metric(s, "thaw_kv_disk_prefix_hits_total") >= 1


OUTCOMES = ("slot", "ram", "disk", "shared", "blocks")


def lookups(s):
    """(lookups, {outcome: count}, misses) from /metrics; none may be missing."""
    m = s.metrics()
    names = [f"thaw_kv_cache_hits_{o}_total" for o in OUTCOMES] + ["thaw_kv_cache_misses_total",
                                                                    "thaw_kv_cache_lookups_total"]
    for n in names:
        assert n in m, f"{n} is not in /metrics"
    return (m["thaw_kv_cache_lookups_total"], {o: m[f"thaw_kv_cache_hits_{o}_total"] for o in OUTCOMES},
            m["thaw_kv_cache_misses_total"])


def test_every_lookup_counts_once_under_its_outcome(serve, tmp_path):
    # one request of each kind; after each, the outcomes sum to the lookups
    # and exactly one outcome moved. The edited history is the case that
    # used to count twice: a keyed miss (no entry has that history) that a
    # run of stored blocks then served.
    a = [shared_system(), ask(1)]
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    steps = []

    def step(s, messages, want):
        before = lookups(s)
        r = chat(s, messages)
        n, hits, misses = lookups(s)
        assert n == before[0] + 1, (want, n, before)
        assert n == sum(hits.values()) + misses, (want, n, hits, misses)
        moved = [o for o in OUTCOMES if hits[o] != before[1][o]] + (["miss"] if misses != before[2] else [])
        assert moved == [want], (want, moved, r["timings"])
        steps.append(r)
        return r

    # (each blocks case on a fresh server: a slot already holding the
    # shared system prompt serves that much itself, and the lookup is a miss)
    r1 = step(s, a, "miss")  # nothing stored yet
    a2 = a + [{"role": "assistant", "content": reply(r1)}, ask(2)]
    r2 = step(s, a2, "slot")  # the slot still holds turn 1
    s.stop()
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    step(s, [shared_system(), ask(4)] + a2[2:], "blocks")  # an edited history: keyed miss, blocks serve it
    step(s, a2 + [{"role": "assistant", "content": reply(r2)}, ask(5)], "disk")  # turn 3
    s.stop()
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    step(s, [shared_system(), ask(3)], "blocks")  # a new conversation, same system prompt


def test_edited_history_restores_up_to_the_edit(serve, tmp_path):
    first = [shared_system(), ask(1)]
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    r1 = chat(s, first)
    long = first + [{"role": "assistant", "content": reply(r1)}, ask(2)]
    r2 = chat(s, long)
    s.stop()
    # the user edits the first question: no entry has this history
    edited = [shared_system(), ask(7)] + long[2:]
    ref = reference(serve, [edited])
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    r = chat(s, edited)
    assert reply(r) == ref[0]
    t = timings(r)
    assert t["cache_source"] == "blocks" and t["cache_n"] > 0
    # no further than the edit: the shared system prompt's blocks only
    sys_tokens = s.post("/tokenize", {"content": shared_system()["content"]}).json()["tokens"]
    assert t["cache_n"] <= len(sys_tokens) + 16
    assert r2["timings"]["cache_n"] > 0


def test_conversations_sharing_blocks_then_diverging_mid_block_never_mix(serve, tmp_path):
    # identical for 250 words, then one word apart: the divergence falls
    # inside a block, so they share the blocks before it and nothing after
    base = text(250, 11)
    convs = [[{"role": "system", "content": base + f" {w} " + text(20, 50 + k)}, ask(k)]
             for k, w in enumerate(("river", "stone", "light"))]
    ref = reference(serve, convs)
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    for c in convs:
        chat(s, c)
    s.stop()
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    got = [chat(s, c) for c in reversed(convs)]
    assert [reply(r) for r in reversed(got)] == ref
    for r in got:
        assert r["timings"]["cache_n"] < r["usage"]["prompt_tokens"]


def test_a_corrupt_block_is_a_miss_for_every_manifest_that_uses_it(serve, tmp_path):
    convs = [[shared_system(), ask(i)] for i in range(2)]
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    r1 = [chat(s, c) for c in convs]
    s.stop()
    # the block files: entries of B tokens; damage them all but the manifests
    blocks = []
    for kv in glob.glob(str(tmp_path / "*.kv")):
        with open(kv, "rb") as f:
            if f.read(4) == b"TKB1":
                blocks.append(kv)
    assert len(blocks) >= 8
    blocks.sort(key=os.path.getsize)
    victim = blocks[0]
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    with open(victim, "rb") as f:
        damaged = f.read()
    turn2 = [c + [{"role": "assistant", "content": reply(r)}, ask(9)] for c, r in zip(convs, r1)]
    ref = reference(serve, turn2)
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    got = [chat(s, t) for t in turn2]
    assert [reply(r) for r in got] == ref
    # the damaged block was found, removed and never used (a later store
    # may write it again, good); the server kept serving
    assert s.metrics()["thaw_kv_disk_corrupt_removed_total"] >= 1
    if os.path.exists(victim):
        with open(victim, "rb") as f:
            assert f.read() != damaged
    assert s.get("/health").status_code == 200


def test_a_corrupt_manifest_is_removed_and_its_blocks_still_serve(serve, tmp_path):
    conv = [shared_system(), ask(3)]
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    r1 = chat(s, conv)
    s.stop()
    manifests = []
    for kv in glob.glob(str(tmp_path / "*.kv")):
        with open(kv, "rb") as f:
            if f.read(4) == b"TMF1":
                manifests.append(kv)
    assert len(manifests) == 1
    with open(manifests[0], "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 0xFF]))
    t2 = conv + [{"role": "assistant", "content": reply(r1)}, ask(8)]
    ref = reference(serve, [t2])
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path))
    r = chat(s, t2)
    assert reply(r) == ref[0]
    assert not os.path.exists(manifests[0])
    # the conversation's blocks are intact: a prefix lookup serves them
    assert r["cache_source"] == "blocks" and r["timings"]["cache_n"] >= 8 * B


def test_changing_np_and_c_keeps_hits(serve, tmp_path):
    conv = [shared_system(), ask(4)]
    s = serve("llama", "-np", "2", "-c", "8192", *flags(tmp_path))
    r1 = chat(s, conv)
    s.stop()
    t2 = conv + [{"role": "assistant", "content": reply(r1)}, ask(5)]
    ref = reference(serve, [t2])
    s = serve("llama", "-np", "3", "-c", "6144", *flags(tmp_path))
    r = chat(s, t2)
    assert reply(r) == ref[0]
    assert r["cache_source"] == "disk"
    assert r["timings"]["cache_n"] > 0.8 * r["usage"]["prompt_tokens"]  # all but the new question


def test_whole_states_with_block_0(serve, tmp_path):
    conv = [shared_system(), ask(4)]
    s = serve("llama", "-np", "1", "-c", "8192", "--kv-cache-dir", str(tmp_path), "--cache-ram", "0",
              "--kv-cache-block", "0")
    chat(s, conv)
    s.stop()
    for kv in glob.glob(str(tmp_path / "*.kv")):
        with open(kv, "rb") as f:
            assert f.read(4) == b"TKV1"


def test_tenants_never_share_blocks(serve, tmp_path):
    conv = [shared_system(), ask(6)]
    body = {"messages": conv, "max_tokens": 8, "temperature": 0}
    keys = ["--api-key", "alpha,beta"]

    def as_tenant(s, key):
        r = s.post("/v1/chat/completions", body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return timings(r.json())

    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path), *keys)
    as_tenant(s, "alpha")
    s.stop()
    s = serve("llama", "-np", "1", "-c", "8192", *flags(tmp_path), *keys)
    # the same prompt from the other tenant: alpha's blocks are not beta's
    t = as_tenant(s, "beta")
    assert t["cache_n"] == 0 and t["cache_source"] == "none", t
    # and alpha's own blocks still serve alpha
    t = as_tenant(s, "alpha")
    assert t["cache_n"] > 0, t


def test_branch_point_is_remembered_per_tenant(serve, tmp_path):
    # Every request of a session presents the same leading messages: their
    # branch point (two renderings of them) is remembered, per tenant, and
    # gives what rendering them again would
    keys = ["--api-key", "alpha,beta"]
    s = serve("llama", "-np", "1", "-c", "8192", "-v", *flags(tmp_path), *keys)
    seen = []

    def send(key, conv):
        r = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 2, "temperature": 0},
                   headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        lines = re.findall(r"prompt tokens \((\d+) of the leading system messages(, remembered)?\)", s.log())
        assert len(lines) == len(seen) + 1, s.log()
        seen.append(lines[-1])
        return int(lines[-1][0]), bool(lines[-1][1])

    first = send("alpha", [shared_system(), ask(1)])
    assert first[0] > 200 and not first[1], first
    assert send("alpha", [shared_system(), ask(2)]) == (first[0], True)
    # another tenant renders its own: one's timing tells nothing of another's
    assert send("beta", [shared_system(), ask(3)]) == (first[0], False)
    assert send("beta", [shared_system(), ask(4)]) == (first[0], True)
    # other leading messages are not the remembered ones
    other = {"role": "system", "content": "Other rules. " + text(100, 9)}
    n, remembered = send("alpha", [other, ask(5)])
    assert not remembered and 0 < n < first[0], (n, first)


def test_budget_evicts_old_conversations_and_keeps_the_shared_prefix(serve, tmp_path):
    # --kv-cache-max counts blocks too, and LRU picks conversations, never
    # blocks: over budget, the oldest conversation goes with the blocks only
    # it used, while the long prefix every conversation shares (its blocks
    # are the oldest files) stays. Five conversations of ~2.2k tokens, ~1.5k
    # of them shared (~0.25 KiB of state per token on the tiny model): the
    # prefix and about three conversations' own parts fit in 1 MiB.
    system = {"role": "system", "content": "Shared rules and tools. " + text(1300, 3)}
    convs = [[system, {"role": "user", "content": f"Job {i}: " + text(550, 200 + i)}] for i in range(5)]
    f = ["-np", "1", "-c", "8192", *flags(tmp_path, "--kv-cache-max", "1")]
    s = serve("llama", *f)
    r1 = [chat(s, c, 4) for c in convs]
    drained(s)
    m = s.metrics()
    s.stop()
    m = {k: v for k, v in m.items() if k.startswith("thaw_kv_disk_")}
    assert m["thaw_kv_disk_evictions_lru_total"] >= 1, m
    assert m["thaw_kv_disk_blocks_collected_total"] >= 1, m  # the evicted conversations' own blocks
    assert m["thaw_kv_disk_bytes"] <= 1 << 20, m
    turn2 = [c + [{"role": "assistant", "content": reply(r)}, ask(9)] for c, r in zip(convs, r1)]
    s = serve("llama", *f)
    # the oldest conversation's manifest is gone, but the shared prefix's
    # blocks are not (newer conversations name them): a prefix lookup serves
    # them. Asked first, while the slot holds nothing of the prefix.
    oldest = timings(chat(s, turn2[0], 4))
    assert oldest["cache_source"] == "blocks", oldest
    assert oldest["cache_n"] >= 1200 // B * B, oldest
    # the newest conversation is restored whole from its manifest
    r = chat(s, turn2[4], 4)
    newest = timings(r)
    assert newest["cache_source"] == "disk", newest
    assert newest["cache_n"] > 0.8 * r["usage"]["prompt_tokens"], newest  # all but the new question
    assert s.metrics()["thaw_kv_disk_bytes"] <= 1 << 20


def test_ram_tier_holds_each_shared_block_once_and_serves_without_the_disk(serve, tmp_path):
    # --cache-ram on: entries are manifests and the RAM tier holds every block
    # once, however many conversations name it (not a whole state each)
    convs = [[shared_system(), ask(i)] for i in range(6)]
    ref = reference(serve, convs)
    s = serve("llama", "-np", "1", "-c", "8192", "--kv-cache-dir", str(tmp_path), "--cache-ram", "64",
              "--kv-cache-min-tokens", "16", "--kv-cache-block", str(B))
    r1 = []
    for i, c in enumerate(convs):
        r = chat(s, c)
        assert reply(r) == ref[i], f"conversation {i}"
        r1.append(r)
    drained(s)
    ram = metric(s, "thaw_kv_cache_ram_bytes")
    # KV bytes per token, from the blocks the disk tier wrote (B tokens each)
    per_token = metric(s, "thaw_kv_disk_store_bytes_total") / (B * metric(s, "thaw_kv_disk_blocks_written_total"))
    stored = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in r1)
    # a whole state each would be every conversation's tokens; blocks: the
    # shared prefix once, each one's own blocks and its tail (< B tokens)
    assert ram < 0.5 * stored * per_token, (ram, stored * per_token)
    # the blocks' files gone: turn 2 still comes from the RAM tier, whole
    for f in glob.glob(str(tmp_path / "*.kv")):
        with open(f, "rb") as fh:
            if fh.read(4) == b"TKB1":
                os.remove(f)
    for i in (5, 2):
        msgs = convs[i] + [{"role": "assistant", "content": reply(r1[i])}, ask(50 + i)]
        t = timings(chat(s, msgs))
        assert t["cache_source"] in ("slot", "ram"), t
        assert t["cache_n"] >= r1[i]["usage"]["prompt_tokens"], t
    s.stop()


def test_stores_cut_their_blocks_from_the_kv_cache_and_restore_the_same(serve, tmp_path):
    """kvtap.h: a store takes the blocks a turn added straight from the KV
    cache instead of capturing the whole conversation. Three conversations
    take turns on one slot (every turn restores from disk, then stores), and
    a restart: every store is cut from the cache (each checked against a
    capture, THAW_TEST_KVTAP_VERIFY), and the replies equal those of a
    server that captures whole states (--no-kv-tap)."""
    def run(d, *extra):
        convs = [[shared_system(), ask(i)] for i in range(3)]
        out, sources = [], []
        s = serve("llama", "-np", "1", "-c", "4096", *flags(d), *extra)
        for turn in range(4):
            if turn == 3:  # after a restart
                s.stop()
                s = serve("llama", "-np", "1", "-c", "4096", *flags(d), *extra)
            for i, c in enumerate(convs):
                r = chat(s, c)
                out.append(reply(r))
                sources.append(r["cache_source"])
                c += [{"role": "assistant", "content": reply(r)},
                      {"role": "user", "content": f"Turn {turn}: " + text(20, 200 + 10 * i + turn)}]
        return out, sources, drained(s)

    cut, cut_sources, m = run(tmp_path / "tap")
    assert m["thaw_kv_cache_stores_cut_total"] >= 3  # the turns after the restart
    assert m["thaw_kv_cache_stores_captured_total"] == 0
    whole, whole_sources, m0 = run(tmp_path / "capture", "--no-kv-tap")
    assert m0["thaw_kv_cache_stores_cut_total"] == 0 and m0["thaw_kv_cache_stores_total"] >= 3
    assert cut == whole
    # from the second turn on, each conversation came back from the disk
    assert cut_sources[3:] == ["disk"] * 9 and whole_sources[3:] == ["disk"] * 9, (cut_sources, whole_sources)
