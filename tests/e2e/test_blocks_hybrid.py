"""The block store on hybrid models (lfm2: short convolutions; qwen35: gated
delta-net; DESIGN §12, src/cache/snapshots.h): attention layers in blocks, the
recurrent state as snapshots at the end of every turn and of the leading
system messages. After a restart a new conversation resumes at the shared
system prompt's snapshot, an edited history at the last turn's end, and two
conversations that diverge past a snapshot each get their own output; a
kill -9 while blocks, snapshots and manifests are written leaves a store
that verifies and serves only exact outputs.

Exact, as DESIGN §6 asks: each output equals a resident slot's (no cache
tier) that reached the same position the same way. A resident slot also
stops its prefill at the end of the system messages (a snapshot position:
the engine checkpoints there), so a conversation restored at that snapshot
and one served from scratch decode the same batches."""
import glob
import os
import re
import signal
import subprocess
import time

import pytest

from harness import THAW, Server, chat, mkmodel, reply, text, timings

B = 32  # small blocks: the test conversations span several


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrids")
    return {
        "lfm2": mkmodel(d / "lfm2.gguf", "--arch", "lfm2", "--layers", "4", "--seed", "7"),
        "qwen35": mkmodel(d / "qwen35.gguf", "--arch", "qwen35", "--layers", "4", "--seed", "8"),
        # heads of 32: q8_0's blocks of 32 values must divide a head
        "lfm2-h32": mkmodel(d / "lfm2-h32.gguf", "--arch", "lfm2", "--layers", "4", "--embd", "256", "--heads", "8", "--seed", "9"),
        "qwen35-h32": mkmodel(d / "qwen35-h32.gguf", "--arch", "qwen35", "--layers", "4", "--embd", "256", "--heads", "8",
                              "--seed", "10"),
    }


def flags(d, *extra):
    return ["-np", "1", "--kv-cache-dir", str(d), "--cache-ram", "0", "--kv-cache-min-tokens", "16",
            "--kv-cache-block", str(B), *extra]


def out(r):
    """All the model said: Qwen3.5's template opens a <think> block, so
    qwen35's gibberish is reasoning."""
    m = r["choices"][0]["message"]
    return (m.get("reasoning_content") or "") + "|" + (m.get("content") or "")


def system():
    return {"role": "system", "content": "Shared rules and tools. " + text(200, 3)}


def ask(i):
    return {"role": "user", "content": f"Job {i}: " + text(25, 100 + i)}


def reset(s):
    # another conversation takes the slot: the next one cannot resume there
    chat(s, [{"role": "user", "content": "reset"}], 1)


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_shared_system_prompt_restored_for_new_conversations_after_a_restart(serve, hybrids, tmp_path, arch):
    model = hybrids[arch]
    convs = [[system(), ask(i)] for i in range(3)]
    s = serve(model, "-np", "1", "--cache-ram", "0")
    ref = []
    for c in convs:
        reset(s)
        ref.append(out(chat(s, c)))
    s.stop()
    assert len(set(ref)) == 3  # the conversations differ: a mix-up would show

    s = serve(model, *flags(tmp_path))
    assert out(chat(s, convs[0])) == ref[0]
    assert s.stop() == 0
    assert "kv-cache: whole states" not in s.log()  # the layout self-test passed: blocks
    # blocks, snapshots and one manifest; no .ckpt copy of the checkpoints
    assert not glob.glob(str(tmp_path / "*.ckpt")), os.listdir(tmp_path)

    s = serve(model, *flags(tmp_path))
    for i in (1, 2):
        r = chat(s, convs[i])
        t = timings(r)
        assert out(r) == ref[i], f"conversation {i}"
        # resumed at the end of the system messages: mostly from cache,
        # and not at a block boundary (a snapshot, not a run of blocks)
        assert t["cache_source"] == "blocks", (t, s.log())
        assert t["cache_n"] >= 0.75 * r["usage"]["prompt_tokens"], t
        assert t["cache_n"] < r["usage"]["prompt_tokens"]
    assert "and a snapshot (prefix lookup)" in s.log()
    s.stop()


def block_size(d):
    """The bytes of one block file (every block holds B tokens' rows, so
    all have one size): the replies differ with the KV type, so the two
    conversations need not store as many blocks."""
    sizes = set()
    for kv in glob.glob(str(d / "*.kv")):
        with open(kv, "rb") as f:
            if f.read(4) == b"TKB1":
                sizes.add(os.path.getsize(kv))
    assert len(sizes) == 1, sizes
    return sizes.pop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_q8_0_kv_round_trip(serve, hybrids, tmp_path, arch):
    """-ctk q8_0 -ctv q8_0: the attention blocks hold quantized rows (and
    the snapshots' partial blocks), the recurrent state stays libllama's
    f32. A new conversation restored at the shared system prompt's snapshot
    after a restart gets what a resident slot with the same KV type gives;
    the blocks take about half the bytes of f16's."""
    model = hybrids[arch + "-h32"]
    kv = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]
    convs = [[system(), ask(95 + i)] for i in range(2)]
    s = serve(model, "-np", "1", "--cache-ram", "0", *kv)
    ref = []
    for c in convs:
        reset(s)
        ref.append(out(chat(s, c)))
    s.stop()

    d = tmp_path / "q8"
    s = serve(model, *flags(d, *kv))
    assert out(chat(s, convs[0])) == ref[0]
    assert s.stop() == 0
    assert "kv-cache: whole states" not in s.log()
    s = serve(model, *flags(d, *kv))
    r = chat(s, convs[1])
    assert out(r) == ref[1], s.log()
    t = timings(r)
    assert t["cache_source"] == "blocks" and t["cache_n"] >= 0.75 * r["usage"]["prompt_tokens"], t
    s.stop()
    # the same conversation in f16: q8_0 rows are 34 bytes per 32 values
    d16 = tmp_path / "f16"
    s = serve(model, *flags(d16, "-fa", "on"))
    chat(s, convs[0])
    s.stop()
    assert block_size(d) <= 0.6 * block_size(d16), (block_size(d), block_size(d16))


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_without_the_tap_blocks_come_from_a_capture_and_stay_exact(serve, hybrids, tmp_path, arch):
    """--no-kv-tap, the path a GPU build takes when the KV cache is in
    device memory (kvtap.c turns itself off): the attention blocks are cut
    from a whole capture. After a restart turn 2 resumes past turn 1's
    prompt and a new conversation at the system prompt's snapshot, each
    equal to the resident reference."""
    model = hybrids[arch]
    conv = [system(), ask(97)]
    asks = [ask(98)]
    ref = resident(serve, model, conv, asks)
    s = serve(model, "-np", "1", "--cache-ram", "0")
    reset(s)
    other = [system(), ask(99)]
    ref_other = out(chat(s, other))
    s.stop()

    s = serve(model, *flags(tmp_path, "--no-kv-tap"))
    r1 = chat(s, conv)
    assert out(r1) == out(ref[0])
    assert s.stop() == 0
    assert "kv-cache: whole states" not in s.log()
    s = serve(model, *flags(tmp_path, "--no-kv-tap"))
    r = chat(s, turns(conv, [r1], asks))
    assert out(r) == out(ref[1]), s.log()
    # through the manifest, or a prefix lookup where the key differs
    # (qwen35's reasoning is not in the history the key is made of)
    assert r["cache_source"] in ("disk", "blocks"), r["timings"]
    assert r["timings"]["cache_n"] > r1["usage"]["prompt_tokens"], r["timings"]
    reset(s)
    r = chat(s, other)
    assert out(r) == ref_other
    assert r["cache_source"] == "blocks", r["timings"]
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_edited_history_and_divergence_past_a_snapshot(serve, hybrids, tmp_path, arch):
    """Turn 1 is stored; after a restart the last user message is edited
    twice (two conversations sharing turn 1, diverging past its snapshot).
    Each resumes at the end of turn 1 and gets what a resident slot gives
    when it is served that conversation back to back."""
    model = hybrids[arch]
    conv = [system(), ask(0)]
    edits = [{"role": "user", "content": f"Edit {k}: " + text(20, 300 + k)} for k in range(2)]

    def history(r1, k):
        return conv + [{"role": "assistant", "content": reply(r1)}, edits[k]]

    ref = []
    for k in range(2):
        s = serve(model, "-np", "1", "--cache-ram", "0")
        r1 = chat(s, conv)
        ref.append((out(r1), out(chat(s, history(r1, k)))))
        s.stop()
    assert ref[0][0] == ref[1][0] and ref[0][1] != ref[1][1]

    s = serve(model, *flags(tmp_path))
    r1 = chat(s, conv)
    assert out(r1) == ref[0][0]
    n1 = r1["usage"]["prompt_tokens"]
    assert s.stop() == 0

    s = serve(model, *flags(tmp_path))
    for k in range(2):
        r = chat(s, history(r1, k))
        t = timings(r)
        assert out(r) == ref[k][1], f"edit {k}"
        # resumed at turn 1's end, deeper than turn 1's prompt: the reply
        # came from cache too. The first edit finds turn 1's manifest (its
        # key is the history up to the reply); the second finds the slot
        # holding turn 1's end as a checkpoint (the manifest's snapshots
        # come back as the slot's checkpoints), or the snapshot on disk
        assert t["cache_source"] in (("disk", "blocks") if k == 0 else ("slot", "blocks")), (t, s.log())
        assert t["cache_n"] > n1, (t, n1)
    s.stop()


def snapshots_on_disk(d):
    n = 0
    for kv in glob.glob(str(d / "*.kv")):
        with open(kv, "rb") as f:
            n += f.read(4) == b"TSN1"
    return n


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_kill_9_while_writing_snapshots(serve, hybrids, tmp_path, arch):
    """Each turn 1 is killed (SIGKILL) at a different moment of its store:
    every fsync is slowed, so the writer is somewhere in its blocks, its
    snapshots (the branch point's, the turn end's) or the manifest. Then
    the store verifies, the startup sweep leaves no temporary file, and
    each turn 2 equals its reference: the resident slot served turn 1 then
    turn 2 when turn 1's end was restored (cache_n past turn 1's prompt),
    else the conversation served from scratch (resumed at the branch
    point's snapshot, or nothing: the same batches, module docstring)."""
    model = hybrids[arch]
    convs = [[system(), ask(20 + i)] for i in range(3)]
    srv_flags = flags(tmp_path)
    r1, n1 = {}, {}
    # a store is about a dozen slowed fsyncs: killed before it starts, at
    # points through it, and once after it (so that some of it lands)
    for k, delay in enumerate([0.0, 0.1, 0.2, 0.3, 0.45, 0.6, None]):
        s = Server(model, *srv_flags, env={"THAW_TEST_DISK_FSYNC_DELAY_MS": "30"})
        try:
            i = k % 3
            r = chat(s, convs[i])
            r1.setdefault(i, r)
            n1[i] = r["usage"]["prompt_tokens"]
            if delay is not None:
                time.sleep(delay)  # the writer is storing now: a different moment each time
            for _ in range(600 if delay is None else 0):  # the last: once a snapshot is committed
                if snapshots_on_disk(tmp_path):
                    break
                time.sleep(0.05)
        finally:
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
    assert "kv-cache: whole states" not in s.log()
    assert snapshots_on_disk(tmp_path) >= 1, os.listdir(tmp_path)  # some writes landed
    p = subprocess.run([THAW, "cache", "verify", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr

    def history(i):
        return convs[i] + [{"role": "assistant", "content": reply(r1[i])}, ask(40 + i)]

    resident, scratch = {}, {}
    for i in range(3):
        s = serve(model, "-np", "1", "--cache-ram", "0")
        assert out(chat(s, convs[i])) == out(r1[i])
        resident[i] = out(chat(s, history(i)))
        s.stop()
        s = serve(model, "-np", "1", "--cache-ram", "0")
        scratch[i] = out(chat(s, history(i)))
        s.stop()

    s = serve(model, *srv_flags)
    assert not glob.glob(str(tmp_path / "*.tmp*")), "startup sweep left temporary files"
    for i in range(3):
        reset(s)
        r = chat(s, history(i))
        t = timings(r)
        want = resident[i] if t["cache_n"] > n1[i] else scratch[i]
        assert out(r) == want, (i, t, s.log())
    assert s.get("/health").status_code == 200
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_budget_evicts_conversations_with_their_own_snapshots_and_keeps_the_branch_point(serve, hybrids, tmp_path,
                                                                                          arch):
    """--kv-cache-max over a hybrid's store: LRU evicts the oldest
    conversations with the blocks and turn-end snapshots only they name;
    the shared system prompt's blocks and its snapshot stay (newer
    conversations name them). After a restart the oldest conversation's
    turn 2 resumes at that branch point, the newest at its own turn end,
    both exact; the store verifies."""
    model = hybrids[arch]
    big = {"role": "system", "content": "Shared rules and tools. " + text(2600, 3)}
    convs = [[big, {"role": "user", "content": f"Job {i}: " + text(1400, 200 + i)}] for i in range(5)]
    f = ["-c", "8192", *flags(tmp_path, "--kv-cache-max", "1")]
    s = serve(model, *f)
    r1 = [chat(s, c, 4) for c in convs]
    for _ in range(200):  # the writer is done
        if disk_metric(s, "queue_bytes") == 0:
            break
        time.sleep(0.05)
    assert disk_metric(s, "evictions_lru_total") >= 1 and disk_metric(s, "blocks_collected_total") >= 1, s.metrics()
    assert s.stop() == 0
    p = subprocess.run([THAW, "cache", "verify", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # 5 turn ends were written (4 handovers, the shutdown) and the branch
    # point's: the evicted conversations' went with them
    assert 1 <= snapshots_on_disk(tmp_path) < 6, os.listdir(tmp_path)
    turn2 = [c + [{"role": "assistant", "content": reply(r)}, ask(9)] for c, r in zip(convs, r1)]
    refs = []
    for i in (0, 4):
        sr = serve(model, "-np", "1", "-c", "8192", "--cache-ram", "0")
        refs.append(out(chat(sr, turn2[i], 4)))  # from scratch: the branch point's batches
        sr.stop()
    sr = serve(model, "-np", "1", "-c", "8192", "--cache-ram", "0")
    assert out(chat(sr, convs[4], 4)) == out(r1[4])
    refs[1] = out(chat(sr, turn2[4], 4))  # the newest: resident, resumed at turn 1's end
    sr.stop()

    s = serve(model, *f)
    m = {k: v for k, v in s.metrics().items() if k.startswith("thaw_kv_disk_")}
    assert m["thaw_kv_disk_bytes"] <= 1 << 20, m
    r = chat(s, turn2[0], 4)
    t = timings(r)
    assert out(r) == refs[0], (t, s.log())
    assert t["cache_source"] == "blocks" and 2000 < t["cache_n"] < r1[0]["usage"]["prompt_tokens"], t
    reset(s)
    r = chat(s, turn2[4], 4)
    t = timings(r)
    assert out(r) == refs[1], (t, s.log())
    assert t["cache_source"] in ("disk", "blocks") and t["cache_n"] > r1[4]["usage"]["prompt_tokens"], t
    s.stop()


# ---- turn-end snapshots written when the slot loses the conversation ----
# (snapshots.h, "Written when"): a turn's end is kept in its slot and
# written only when another conversation takes the slot, at shutdown, or
# after --kv-snapshot-idle seconds of idleness.

def disk_metric(s, name):
    return s.metrics().get("thaw_kv_disk_" + name, 0)


def turns(conv, rs, asks):
    """conv extended by each reply in rs and the next user message in asks."""
    h = list(conv)
    for r, a in zip(rs, asks):
        h += [{"role": "assistant", "content": reply(r)}, a]
    return h


def wait_stored(s, n):
    """Until the slot has stored n turns: a request that arrives during a
    turn's canonical re-decode cuts it short, and the turn is stored
    shorter (engine.c slot_cut_fixup), which a loaded machine makes likely."""
    for _ in range(600):
        if s.log().count("slot 0: stored ") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} stores expected: " + s.log())


def resident(serve, model, conv, asks):
    """The reference (DESIGN §6): one slot serving the conversation's turns
    back to back, no cache tier. Returns the responses."""
    s = serve(model, "-np", "1", "--cache-ram", "0")
    rs = []
    for k in range(len(asks) + 1):
        rs.append(chat(s, turns(conv, rs, asks[:k])))
    s.stop()
    return rs


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_two_conversations_alternating_restore_each_others_handover_snapshot(serve, hybrids, tmp_path, arch):
    """Two conversations alternate on one slot: each turn takes the slot
    from the other, whose turn-end snapshot is written at that moment, and
    each next turn resumes exactly there (its whole history from disk,
    deeper than the branch point) with the resident reference's output."""
    model = hybrids[arch]
    convs = [[system(), ask(50 + i)] for i in range(2)]
    asks = [[ask(60 + i), ask(70 + i)] for i in range(2)]
    ref = [resident(serve, model, convs[i], asks[i][:1]) for i in range(2)]
    assert out(ref[0][-1]) != out(ref[1][-1])

    s = serve(model, *flags(tmp_path))
    got = [[], []]
    for k in range(2):
        for i in range(2):
            r = chat(s, turns(convs[i], got[i], asks[i][:k]))
            assert out(r) == out(ref[i][k]), (arch, i, k, r["timings"], s.log())
            if k > 0:
                t = timings(r)
                n_prev = got[i][-1]["usage"]["prompt_tokens"]
                # past the last prompt: at the reply's end, the handover's
                # snapshot (through the manifest, or a prefix lookup where
                # the key differs: qwen35's unterminated reasoning)
                assert t["cache_source"] in ("disk", "blocks"), (i, k, t, s.log())
                assert t["cache_n"] > n_prev, (i, k, t, n_prev)
            got[i].append(r)
            wait_stored(s, 2 * k + i + 1)
    # A1's written when B1 took the slot, B1's when A2 did
    assert disk_metric(s, "turn_snapshots_written_total") >= 2, s.get("/metrics").text
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_turn_ends_kept_while_the_slot_keeps_the_conversation(serve, hybrids, tmp_path, arch):
    """One conversation keeps its slot for two turns: no turn-end snapshot
    is written (only the branch point's, shared by new conversations);
    turn 1's is superseded by turn 2's store."""
    model = hybrids[arch]
    conv = [system(), ask(80)]
    asks = [ask(81)]
    ref = resident(serve, model, conv, asks)

    s = serve(model, *flags(tmp_path))
    got = []
    for k in range(2):
        r = chat(s, turns(conv, got, asks[:k]))
        assert out(r) == out(ref[k]), (k, s.log())
        got.append(r)
        wait_stored(s, k + 1)
    m = {k[len("thaw_kv_disk_turn_"):]: v for k, v in s.metrics().items() if k.startswith("thaw_kv_disk_turn_")}
    assert m["snapshots_kept_total"] == 2, m
    assert 1 <= m["snapshots_superseded_total"] <= 2, m
    assert m["snapshots_written_total"] == 0, (m, s.log())
    for _ in range(200):  # the writer is done with the turns' blocks and manifests
        if disk_metric(s, "queue_bytes") == 0:
            break
        time.sleep(0.05)
    assert snapshots_on_disk(tmp_path) == 1, os.listdir(tmp_path)  # the branch point's
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_each_turn_resumes_at_the_last_ones_end_in_its_slot(serve, hybrids, tmp_path, arch):
    """A conversation that keeps its slot resumes each turn where the last
    one ended, its reply included as the next prompt renders it. qwen35's
    reply is reasoning the history drops, so its history form parts from
    what was generated inside the generation prompt ("<think>\n"): the
    engine checkpoints where the generation prompt starts, and the turn's
    canonical form is re-decoded from there. (Without that checkpoint each
    qwen35 turn rolled back to the system prompt's end and prefilled the
    whole conversation again.)"""
    model = hybrids[arch]
    conv = [system(), ask(90)]
    asks = [ask(91), ask(92)]
    ref = resident(serve, model, conv, asks)

    s = serve(model, *flags(tmp_path))
    got = []
    for k in range(3):
        r = chat(s, turns(conv, got, asks[:k]))
        assert out(r) == out(ref[k]), (k, s.log())
        if k:
            t, n_prev = timings(r), got[-1]["usage"]["prompt_tokens"]
            # the last prompt and the reply's history form from the slot;
            # prefilled: only this turn's own message
            assert t["cache_source"] == "slot", (k, t, s.log())
            assert t["cache_n"] > n_prev, (k, t, n_prev, s.log())
            assert t["prompt_n"] < 64, (k, t)
        got.append(r)
        wait_stored(s, k + 1)
    assert "cannot roll back there" not in s.log()
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_restart_after_sigterm_resumes_at_the_shutdown_snapshot(serve, hybrids, tmp_path, arch):
    """SIGTERM writes the turn end the slot kept; after the restart turn 2
    resumes there (past turn 1's prompt), equal to the resident reference."""
    model = hybrids[arch]
    conv = [system(), ask(85)]
    asks = [ask(86)]
    ref = resident(serve, model, conv, asks)

    s = serve(model, *flags(tmp_path))
    r1 = chat(s, conv)
    assert out(r1) == out(ref[0])
    wait_stored(s, 1)
    for _ in range(200):  # the writer is done with the turn's blocks and manifest
        if disk_metric(s, "queue_bytes") == 0:
            break
        time.sleep(0.05)
    assert disk_metric(s, "turn_snapshots_kept_total") == 1
    assert snapshots_on_disk(tmp_path) == 1, os.listdir(tmp_path)
    assert s.stop() == 0
    assert "turn-end snapshots the slots kept" in s.log()
    assert snapshots_on_disk(tmp_path) == 2

    s = serve(model, *flags(tmp_path))
    r = chat(s, turns(conv, [r1], asks))
    t = timings(r)
    assert t["cache_source"] in ("disk", "blocks"), (t, s.log())  # as in the alternating test
    assert t["cache_n"] > r1["usage"]["prompt_tokens"], t
    assert out(r) == out(ref[1])
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_kill_9_with_a_kept_turn_end_falls_back_to_the_branch_point(serve, hybrids, tmp_path, arch):
    """kill -9 once turn 1's blocks and manifest are on disk but its end's
    snapshot is still kept in the slot: after the restart turn 2 finds the
    manifest without its last snapshot, resumes at the deepest snapshot on
    disk (the branch point) with its blocks and prefills the rest, which
    gives the output of the conversation served from scratch (the same
    batches: module docstring)."""
    model = hybrids[arch]
    conv = [system(), ask(90)]
    s = serve(model, "-np", "1", "--cache-ram", "0")
    r1 = chat(s, conv)
    h2 = turns(conv, [r1], [ask(91)])
    s.stop()
    s = serve(model, "-np", "1", "--cache-ram", "0")
    scratch = out(chat(s, h2))
    s.stop()

    s = Server(model, *flags(tmp_path))
    try:
        assert out(chat(s, conv)) == out(r1)
        for _ in range(200):  # stored just after the reply, then written
            if disk_metric(s, "turn_snapshots_kept_total") >= 1 and disk_metric(s, "queue_bytes") == 0:
                break
            time.sleep(0.05)
        assert disk_metric(s, "turn_snapshots_kept_total") == 1
        assert snapshots_on_disk(tmp_path) == 1  # the branch point's only
    finally:
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait()

    s = serve(model, *flags(tmp_path))
    r = chat(s, h2)
    t = timings(r)
    assert t["cache_source"] == "blocks", (t, s.log())
    assert 0 < t["cache_n"] < r1["usage"]["prompt_tokens"], t
    assert out(r) == scratch
    s.stop()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_kept_turn_end_written_after_idle_seconds(serve, hybrids, tmp_path, arch):
    """--kv-snapshot-idle 1: the slot keeps the conversation, and its turn
    end is written once the slot has been idle a second."""
    s = serve(hybrids[arch], *flags(tmp_path, "--kv-snapshot-idle", "1"))
    chat(s, [system(), ask(95)])
    for _ in range(300):
        if disk_metric(s, "turn_snapshots_written_total") >= 1:
            break
        time.sleep(0.05)
    assert disk_metric(s, "turn_snapshots_kept_total") == 1
    assert disk_metric(s, "turn_snapshots_written_total") == 1
    for _ in range(200):
        if snapshots_on_disk(tmp_path) == 2:
            break
        time.sleep(0.05)
    assert snapshots_on_disk(tmp_path) == 2  # the branch point's and the turn end's
    s.stop()


def test_cache_stats_counts_a_hybrids_snapshots_apart_from_its_blocks(serve, hybrids, tmp_path):
    """issue #38: an lfm2 directory holding 2 conversations verified clean
    and both restored, yet `thaw cache stats` said "missing blocks 4 named
    by a manifest but not stored": the manifests' snapshots (TSN1) were
    counted as blocks that are not there. stats names each entry's kind
    as the disk tier does (cache/entry_kind.h): no block is missing, and
    the snapshots are counted apart."""
    model = hybrids["lfm2"]
    convs = [[system(), ask(110 + i)] for i in range(2)]
    s = serve(model, *flags(tmp_path))
    r1 = []
    for c in convs:
        r1.append(chat(s, c))
        wait_stored(s, len(r1))
    assert s.stop() == 0  # the second's turn end is written at shutdown
    assert snapshots_on_disk(tmp_path) >= 3  # the branch point's, each turn end's

    p = subprocess.run([THAW, "cache", "verify", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0 and " 0 corrupt" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([THAW, "cache", "stats", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "missing" not in p.stdout, p.stdout
    assert re.search(r"^conversations +2 \(2 as manifests", p.stdout, re.M), p.stdout
    n = re.search(r"^snapshots +(\d+),", p.stdout, re.M)
    assert n and int(n.group(1)) == snapshots_on_disk(tmp_path), p.stdout

    s = serve(model, *flags(tmp_path))
    for i in range(2):
        reset(s)
        r = chat(s, turns(convs[i], [r1[i]], [ask(120 + i)]))
        t = timings(r)
        assert t["cache_source"] in ("disk", "blocks"), (i, t, s.log())
        assert t["cache_n"] > r1[i]["usage"]["prompt_tokens"], (i, t)
    s.stop()
