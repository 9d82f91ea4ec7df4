"""The on-disk KV cache end to end: the seed workload, restarts, SWA
checkpoints, isolation between conversations, crash safety, corruption,
eviction, and a full disk. Real binary, real files, real HTTP."""
import glob
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from harness import THAW, WORDS, Server, chat, conversation, drained, idle, kv_flags, mkmodel, reply, text, turn2, timings

def ratio(rs):
    return sum(r["timings"]["cache_n"] for r in rs) / sum(r["usage"]["prompt_tokens"] for r in rs)


def seed_workload(serve, model, flags, order2=(0, 1, 3, 2), restart=False, order1=(0, 1, 2, 3), drain=False):
    """4 conversations x 2 turns through -np 2: turn 1 in order 1 2 3 4, turn 2
    in `order2` (after the disk writer caught up, with drain). Returns
    (turn-1 responses, turn-2 responses by conversation)."""
    s = serve(model, "-np", "2", "-c", "8192", *flags)
    convs = [conversation(i) for i in range(4)]
    r1 = {i: chat(s, convs[i]) for i in order1}
    if drain:
        drained(s)
    if restart:
        assert s.stop() == 0
        s = serve(model, "-np", "2", "-c", "8192", *flags)
    r2 = {i: chat(s, turn2(convs[i], r1[i], i)) for i in order2}
    return s, r1, r2


# ---- the seed workload -----------------------------------------------------------

def test_seed_workload_cache_off_serves_almost_nothing_from_cache(serve):
    s, _, r2 = seed_workload(serve, "llama", ["--cache-ram", "0"])
    assert ratio(r2.values()) < 0.05  # only the template's opening tokens


def test_seed_workload_cache_on(serve, tmp_path):
    # drained: prefetching (below) reads committed entries; one still in the
    # writer's queue is served from memory (test_turn_2_right_after_...)
    s, r1, r2 = seed_workload(serve, "llama", kv_flags(tmp_path), drain=True)
    assert ratio(r2.values()) >= 0.98
    sources = {i: r["cache_source"] for i, r in r2.items()}
    assert list(sources.values()).count("disk") >= 2, sources
    m = s.metrics()
    assert m["thaw_kv_cache_hits_disk_total"] >= 2
    # every turn 2 names a conversation on disk: its reads start at submit
    assert m["thaw_kv_cache_prefetches_total"] >= 1
    assert m["thaw_kv_disk_stores_total"] >= 4
    assert len(glob.glob(str(tmp_path / "*.idx"))) >= 4
    for r in r2.values():
        assert r["timings"]["restore_ms"] >= 0
        if r["cache_source"] == "disk":
            assert r["timings"]["restore_ms"] > 0


def test_resident_order_needs_no_disk(serve, tmp_path):
    s, _, r2 = seed_workload(serve, "llama", kv_flags(tmp_path), order1=(0, 1), order2=(0, 1), drain=True)
    assert ratio(r2.values()) >= 0.98
    assert s.metrics()["thaw_kv_cache_hits_disk_total"] == 0
    assert all(r["cache_source"] == "slot" for r in r2.values())


def test_turn_2_right_after_its_reply_finds_a_store_still_queued(serve, tmp_path):
    # --cache-ram 0: the disk tier alone, on a slow disk (every fsync takes
    # 400 ms, as a busy server's writer falls behind). A short request takes
    # the only slot between each turn 1 and its turn 2, which follows at
    # once: the turn-1 store still waits in the writer's queue (or is
    # mid-write), and the lookup must find it there rather than miss until
    # the write lands.
    convs = [conversation(i, 900) for i in range(3)]
    env = dict(os.environ, THAW_TEST_DISK_FSYNC_DELAY_MS="400")
    s = serve("llama", "-np", "1", "-c", "8192", *kv_flags(tmp_path), env=env)
    r2 = []
    for i, c in enumerate(convs):
        r1 = chat(s, c)
        chat(s, [{"role": "user", "content": f"hi {i}"}], max_tokens=1)  # too short to store
        r2.append(chat(s, turn2(c, r1, i)))
    assert all(r["cache_source"] == "disk" for r in r2), [r["timings"] for r in r2]
    assert ratio(r2) >= 0.95
    s.stop()


def test_repeated_prompt_right_after_a_streamed_reply_lands_on_the_warm_slot(serve):
    # -np 2: the slot holding the prompt may still be finishing post-reply
    # work (re-decoding the reply's canonical form, storing) when the
    # client, which already has [DONE], sends the same prompt again. It
    # must wait for that slot (milliseconds), not prefill on the cold one.
    s = serve("llama", "-np", "2", "-c", "8192", "--kv-cache-min-tokens", "16")
    for i in range(8):
        conv = conversation(i, 300)  # a new one each time: only the template's opening is shared
        s.chat_stream(conv, max_tokens=24)
        r = chat(s, conv, 8)
        # the cold slot shares only the template's opening tokens
        assert r["timings"]["cache_n"] >= 0.9 * r["usage"]["prompt_tokens"], (i, r["timings"])
    s.stop()


def test_a_request_cuts_another_conversations_post_reply_work_short(serve, tmp_path):
    # -np 1, back to back: every request finds the only slot re-decoding the
    # previous reply (FIXUP). With --fixup-wait-ms 0 it does not wait for
    # that: it cuts the work short, what was done is stored, and that
    # conversation's next turn prefills the rest from its stored prefix.
    # THAW_TEST_FIXUP_HOLD holds each re-decode until a request needs the
    # slot, as on a model too slow to finish it between two requests: the
    # tiny test model would otherwise finish it before the next request
    # arrives (a race this test lost 1 time in 4 without a hold).
    s = serve("llama", "-np", "1", "-c", "8192", "--metrics", "--fixup-wait-ms", "0", *kv_flags(tmp_path),
              env={"THAW_TEST_FIXUP_HOLD": "1"})
    convs = [conversation(i, 300) for i in range(6)]
    r1 = [chat(s, c, max_tokens=64) for c in convs]  # long replies: long re-decodes
    cut = s.metrics()["thaw_kv_cache_fixups_cut_total"]
    assert cut >= 1, "no request found the slot still re-decoding"
    # (the last reply's re-decode stays held: the first turn 2 cuts it)
    r2 = [chat(s, turn2(c, r, i)) for i, (c, r) in enumerate(zip(convs, r1))]
    # every conversation still restores all of turn 1's prompt and the part
    # of its reply that was re-decoded before the cut
    for r, first in zip(r2, r1):
        assert r["timings"]["cache_n"] >= first["usage"]["prompt_tokens"], r["timings"]
    s.stop()


def test_a_restart_right_after_each_reply_loses_no_turn(serve, tmp_path):
    # What a `systemctl restart` does, 20 times in a row: a reply, SIGTERM
    # the moment the client has it, start again, the next turn. Every
    # reply's post-reply work is still undone when the signal arrives
    # (THAW_TEST_FIXUP_HOLD holds the re-decode of its canonical form until
    # shutdown), and the disk is slow (every fsync 20 ms), so its blocks
    # are still queued: shutdown must finish the re-decode, store, and
    # write every queued store before it exits. Each next turn then
    # restores all that was stored, from disk.
    env = {"THAW_TEST_FIXUP_HOLD": "1", "THAW_TEST_DISK_FSYNC_DELAY_MS": "20"}
    args = ["-np", "2", "-c", "4096", *kv_flags(tmp_path), "--kv-cache-min-tokens", "16"]
    conv = [{"role": "system", "content": "restart persona. " + text(150, 77)},
            {"role": "user", "content": "Question 0: what about the river?"}]
    s = serve("llama", *args, env=env)
    r = chat(s, conv)
    for i in range(1, 21):
        assert s.stop() == 0
        log = s.log()
        stored = re.findall(r"slot \d+: stored [0-9a-f]+: (\d+) tokens", log)
        assert stored, log
        assert "shutdown: post-reply work stopped" not in log, log
        s = serve("llama", *args, env=env)
        conv += [{"role": "assistant", "content": reply(r)},
                 {"role": "user", "content": f"Question {i}: and the {WORDS[i % len(WORDS)]}?"}]
        r = chat(s, conv)
        t = timings(r)
        assert t["cache_source"] == "disk" and t["cache_n"] == int(stored[-1]), (i, t, stored)
    s.stop()


def test_restart_between_turns(serve, tmp_path):
    s, _, r2 = seed_workload(serve, "llama", kv_flags(tmp_path), restart=True)
    assert ratio(r2.values()) >= 0.98
    assert all(r["cache_source"] == "disk" for r in r2.values())


def test_file_modes(serve, tmp_path):
    d = tmp_path / "cache"
    seed_workload(serve, "llama", kv_flags(d), order2=())
    assert os.stat(d).st_mode & 0o777 == 0o700
    files = [f for f in glob.glob(str(d / "*")) if not f.endswith("lock")]
    assert files
    for f in files:
        try:  # the writer may still rename or sweep a .tmp between the glob and the stat
            mode = os.stat(f).st_mode
        except FileNotFoundError:
            continue
        assert mode & 0o777 == 0o600, f


# ---- outputs: a restore changes nothing -------------------------------------------

def reference(serve, model, convs, n1=16, n2=16):
    """The exact reference (DESIGN §6): each conversation served back to back
    from a resident slot, no cache tier."""
    s = serve(model, "-np", "1", "-c", "8192", "--cache-ram", "0")
    out = []
    for i, c in enumerate(convs):
        r1 = chat(s, c, n1)
        out.append((r1, chat(s, turn2(c, r1, i), n2)))
    s.stop()
    return out


def check_isolation(serve, tmp_path, model, convs):
    ref = reference(serve, model, convs)
    s = serve(model, "-np", "2", "-c", "8192", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16"))
    r1 = [chat(s, c) for c in convs]
    assert [reply(r) for r in r1] == [reply(a) for a, _ in ref]
    assert s.stop() == 0
    s = serve(model, "-np", "2", "-c", "8192", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16"))
    for i in reversed(range(len(convs))):
        prompt = turn2(convs[i], r1[i], i)
        r2 = chat(s, prompt)
        assert reply(r2) == reply(ref[i][1]), f"conversation {i}"
        assert r2["cache_source"] == "disk"
        # what was installed is a prefix of this request's own tokens: the
        # reused count never exceeds the prompt and the reply matches the
        # reference, which a foreign prefix would not give
        assert r2["timings"]["cache_n"] < r2["usage"]["prompt_tokens"]
    return s


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_no_cross_contamination_system_prompts_one_token_apart(serve, tmp_path, arch):
    base = text(300, 7)
    convs = [[{"role": "system", "content": base + f" {w}"},
              {"role": "user", "content": "Describe it."}] for w in ("river", "stone", "light", "paper")]
    check_isolation(serve, tmp_path, arch, convs)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_no_cross_contamination_identical_then_diverging(serve, tmp_path, arch):
    # byte-identical turn 1 for all four: one shared entry; turn 2 diverges
    conv = conversation(0, 300)
    ref_s = serve(arch, "-np", "1", "-c", "8192", "--cache-ram", "0")
    r1 = chat(ref_s, conv)
    follow = [conv + [{"role": "assistant", "content": reply(r1)},
                      {"role": "user", "content": f"Now about the {w}."}] for w in ("river", "stone", "light", "paper")]
    ref = []
    for f in follow:
        ref_s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 16, "temperature": 0})
        ref.append(reply(chat(ref_s, f)))
    ref_s.stop()
    s = serve(arch, "-np", "2", "-c", "8192", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16"))
    assert reply(chat(s, conv)) == reply(r1)
    s.stop()
    s = serve(arch, "-np", "2", "-c", "8192", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16"))
    got = [reply(chat(s, f)) for f in follow]
    assert got == ref


# ---- SWA: checkpoints ------------------------------------------------------------

def test_swa_checkpoints_table(serve, tmp_path):
    """DESIGN §2's table on the gemma3 (sliding-window) model: a returning
    conversation whose stored state must be rolled back past the window only
    reuses its prefix when checkpoints were stored with it."""
    conv = conversation(1, 300)
    rows = {}
    for name, extra in [("off", None), ("no-ckpt", ["--ctx-checkpoints", "0"]), ("ckpt", [])]:
        d = tmp_path / name
        flags = ["-ub", "8"] + ([] if extra is None else kv_flags(d, "--kv-cache-min-tokens", "16", *extra))
        s = serve("gemma3", "-np", "1", *flags)
        # a reply longer than the sliding cache keeps (window + ubatch,
        # padded to 256 cells): rolling back to where its canonical form
        # diverges needs a checkpoint
        r1 = chat(s, conv, max_tokens=400)
        if extra is not None:
            s.stop()
            s = serve("gemma3", "-np", "1", *flags)
        rows[name] = timings(chat(s, turn2(conv, r1, 1)))
        s.stop()
    total = rows["off"]["cache_n"] + rows["off"]["prompt_n"]
    assert rows["off"]["cache_n"] > 0.4 * total  # back to turn 1's prompt end, via its checkpoint
    assert rows["ckpt"]["cache_n"] > 0.9 * total and rows["ckpt"]["cache_source"] == "disk"
    # With blocks (the default) each block carries its SWA rows (DESIGN
    # §12): the window is rebuilt from them, so the checkpoints, a window
    # copy each, are not stored, and without checkpoints the stored blocks
    # still serve the prefix up to a boundary.
    assert not glob.glob(str(tmp_path / "ckpt" / "*.ckpt")), os.listdir(tmp_path / "ckpt")
    assert rows["no-ckpt"]["cache_n"] > 0 and rows["no-ckpt"]["cache_n"] % 128 == 0, rows["no-ckpt"]


# ---- crash safety and corruption ---------------------------------------------------

def test_kill_9_while_storing(serve, tmp_path, models):
    convs = [conversation(i, 300) for i in range(4)]
    flags = ["-np", "2", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    r1 = {}
    for k in range(6):
        s = Server(models["llama"], *flags)
        try:
            i = k % 4
            r1[i] = chat(s, convs[i], 8)
            # the writer is storing now: kill at a different moment each time
            time.sleep(k * 0.003)
        finally:
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
    s = serve("llama", *flags)
    assert not glob.glob(str(tmp_path / "*.tmp*")), "startup sweep left temporary files"
    p = subprocess.run([THAW, "cache", "verify", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    ref = reference(serve, "llama", convs, n1=8, n2=8)
    for i, r in sorted(r1.items()):
        assert reply(r) == reply(ref[i][0])
        assert reply(chat(s, turn2(convs[i], r, i), 8)) == reply(ref[i][1]), f"conversation {i}"


@pytest.mark.parametrize("ext,damage", [(e, d) for e in ("kv", "ckpt", "idx") for d in ("flip", "truncate")])
def test_corrupt_entry_is_a_miss_and_removed(serve, tmp_path, ext, damage):
    arch = "gemma3" if ext == "ckpt" else "llama"  # only SWA models store checkpoints
    conv = conversation(2, 300)
    # whole-state entries (one .kv per turn); a damaged block or manifest:
    # test_blocks.py
    flags = ["-np", "1", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16", "--kv-cache-block", "0")]
    ref = serve(arch, "-np", "1")  # resident reference, no cache tier
    r1 = chat(ref, conv)
    good = reply(chat(ref, turn2(conv, r1, 2)))
    ref.stop()
    s = serve(arch, *flags)
    assert reply(chat(s, conv)) == reply(r1)
    s.stop()
    entries = glob.glob(str(tmp_path / "*.idx"))
    assert len(entries) == 1  # turn 1's entry: the one turn 2 looks up
    victim = entries[0][:-4] + "." + ext
    assert os.path.exists(victim), victim
    with open(victim, "r+b") as f:
        size = os.path.getsize(victim)
        if damage == "flip":
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        else:
            f.truncate(size // 2)
    s = serve(arch, *flags)
    r2 = chat(s, turn2(conv, r1, 2))
    assert r2["cache_source"] == "none"
    assert reply(r2) == good
    assert not os.path.exists(entries[0]), "the corrupt entry was not removed"
    assert s.chat(conv, max_tokens=2)["choices"]


# ---- eviction, limits, identity ----------------------------------------------------

def test_ttl_evicts_even_across_restart(serve, tmp_path):
    conv = conversation(0, 300)
    flags = ["-np", "1", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16")]
    s = serve("llama", *flags, "--kv-cache-ttl", "1")
    r1 = chat(s, conv)
    s.stop()
    time.sleep(2.2)
    s = serve("llama", *flags, "--kv-cache-ttl", "1")
    r2 = chat(s, turn2(conv, r1, 0))
    assert r2["cache_source"] == "none"
    assert s.metrics()["thaw_kv_disk_evictions_ttl_total"] >= 1


def test_lru_budget_keeps_the_most_recent(serve, tmp_path):
    # ~2000-token conversations: ~0.5 MiB of state each on the tiny model
    convs = [conversation(i, 1700) for i in range(3)]
    flags = ["-np", "1", "-c", "8192", *kv_flags(tmp_path, "--kv-cache-max", "1")]
    s = serve("llama", *flags)
    r1 = [chat(s, c, 4) for c in convs]
    s.stop()
    s = serve("llama", *flags)
    sources = [chat(s, turn2(c, r, i), 4)["cache_source"] for i, (c, r) in reversed(list(enumerate(zip(convs, r1))))]
    # newest first: conversations 3 and 2 were kept; 1, the least recently
    # used, was evicted (at most the template's first tokens come from the slot)
    assert sources[:2] == ["disk", "disk"] and sources[2] != "disk", sources
    assert s.metrics()["thaw_kv_disk_bytes"] <= 1 << 20


def test_min_tokens(serve, tmp_path):
    s = serve("llama", *kv_flags(tmp_path))  # default --kv-cache-min-tokens 256
    chat(s, [{"role": "user", "content": "short"}])
    s.stop()
    assert not glob.glob(str(tmp_path / "*.idx"))


def test_other_model_misses(serve, tmp_path, models):
    other = mkmodel(tmp_path / "other.gguf", "--seed", "99")
    conv = conversation(1, 300)
    flags = kv_flags(tmp_path / "c", "--kv-cache-min-tokens", "16")
    s = serve("llama", *flags)
    r1 = chat(s, conv)
    s.stop()
    s = serve(other, *flags)
    assert chat(s, turn2(conv, r1, 1))["cache_source"] == "none"
    s.stop()
    s = serve("llama", *flags)  # its own entry is still there for it
    assert chat(s, turn2(conv, r1, 1))["cache_source"] == "disk"


def test_disk_full_keeps_serving(serve, tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(d)]).returncode != 0:
        pytest.fail("mounting a small tmpfs needs root (CI runs as root)")
    try:
        s = serve("llama", "-np", "2", "-c", "8192", *kv_flags(d, "--kv-cache-min-tokens", "16"))
        convs = [conversation(i, 600) for i in range(3)]
        r1 = [chat(s, c) for c in convs]
        r2 = [chat(s, turn2(c, r, i)) for i, (c, r) in enumerate(zip(convs, r1))]
        assert all(reply(r) is not None for r in r2)
        time.sleep(0.5)
        m = s.metrics()
        # full: stores made room by evicting others (blocks are small), or failed
        assert m["thaw_kv_disk_store_failures_total"] + m["thaw_kv_disk_evictions_enospc_total"] >= 1
        assert not glob.glob(str(d / "*.tmp*"))
        assert s.chat(convs[0], max_tokens=2)["choices"]
        s.stop()
    finally:
        subprocess.run(["umount", "-l", str(d)])


def test_ram_tier_keeps_one_turn_per_conversation_when_the_disk_has_the_rest(serve, tmp_path):
    # With both tiers, a turn's store drops the conversation's previous turn
    # from RAM once the disk holds it: regenerating a reply still finds it.
    a, b = conversation(0, 300), conversation(1, 300)
    s = serve("llama", "-np", "1", "--kv-cache-dir", str(tmp_path), "--cache-ram", "64",
              "--kv-cache-min-tokens", "16")

    def written(n):  # the writer runs behind the replies (n: the turns stored; blocks are entries too)
        drained(s)

    ra1 = chat(s, a)
    idle(s)  # a's turn 1 stored whole before b takes the only slot
    rb1 = chat(s, b)
    written(2)
    ra2 = chat(s, turn2(a, ra1, 0))  # a's turn 1 from RAM; its store supersedes it
    assert ra2["cache_source"] == "ram"
    written(3)
    rb2 = chat(s, turn2(b, rb1, 1))
    assert rb2["cache_source"] == "ram"
    again = chat(s, turn2(a, ra1, 0))  # regenerate a's turn 2: turn 1 now only on disk
    assert again["cache_source"] == "disk"
    assert again["timings"]["cache_n"] >= 0.95 * again["usage"]["prompt_tokens"]
    assert reply(again) == reply(ra2)
    assert s.metrics()["thaw_kv_cache_ram_entries"] == 2  # a's and b's turn 2
    s.stop()


def test_ram_tier_serves_a_conversation_whose_slot_was_reused(serve):
    # no disk tier at all: the RAM tier alone (--cache-ram) brings it back
    convs = [conversation(i, 300) for i in range(2)]
    s = serve("llama", "-np", "1", "--cache-ram", "64", "--kv-cache-min-tokens", "16")
    r1 = []
    for c in convs:  # the second conversation takes the only slot
        r1.append(chat(s, c))
        idle(s)  # once the first one's turn is stored whole
    r2 = chat(s, turn2(convs[0], r1[0], 0))
    assert r2["cache_source"] == "ram"
    assert r2["timings"]["cache_n"] >= 0.95 * r2["usage"]["prompt_tokens"]
    m = s.metrics()
    assert m["thaw_kv_cache_hits_ram_total"] == 1
    # both turn-1 states were captured before the slot could serve turn 2
    assert m["thaw_kv_cache_stores_total"] >= 2 and m["thaw_kv_cache_store_seconds_total"] > 0
    assert m["thaw_kv_cache_ram_entries"] >= 1 and m["thaw_kv_cache_ram_bytes"] > 0
    s.stop()
    ref = reference(serve, "llama", convs[:1])
    assert reply(r2) == reply(ref[0][1])


# ---- a restore beside a stream (issue #37) -------------------------------------

def stream_beside(s, started, n_predict=200):
    """Streams a long completion on its own conversation; sets `started` once
    tokens flow. Returns the thread and the list its chunks' texts go to."""
    got = []

    def run():
        body = {"prompt": "Once upon a time", "n_predict": n_predict, "ignore_eos": True, "temperature": 0,
                "stream": True, "cache_prompt": False}
        with s.post("/completion", body, stream=True) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    got.append(line)
                    if len(got) == 3:
                        started.set()

    th = threading.Thread(target=run)
    th.start()
    return th, got


def test_a_restore_beside_a_stream_is_assembled_off_the_engine_thread(serve, tmp_path):
    """A conversation returning from disk while another slot streams: its
    blocks are read and assembled on the restore thread, the engine installs
    them, and the turn is what it is served alone."""
    convs = [conversation(0, 600)]
    ref = reference(serve, "llama", convs)
    flags = kv_flags(tmp_path, "--kv-cache-min-tokens", "16")
    s = serve("llama", "-np", "2", "-c", "8192", *flags)
    r1 = chat(s, convs[0])
    assert reply(r1) == reply(ref[0][0])
    drained(s)
    assert s.stop() == 0
    s = serve("llama", "-np", "2", "-c", "8192", *flags)
    started = threading.Event()
    th, got = stream_beside(s, started)
    assert started.wait(120)
    r2 = chat(s, turn2(convs[0], r1, 0))
    m = s.metrics()
    th.join(300)
    assert r2["cache_source"] == "disk"
    assert r2["timings"]["cache_n"] >= 0.9 * r2["usage"]["prompt_tokens"]
    assert m["thaw_kv_cache_restores_deferred_total"] == 1, "the restore ran on the engine thread"
    assert m["thaw_slots_busy"] >= 1  # the stream was still going
    assert reply(r2) == reply(ref[0][1])
    assert len(got) >= 100  # the stream went on to its end


def test_the_first_store_readies_a_restore_buffer_of_its_size(serve, tmp_path):
    # A server started with nothing on disk has no warm restore buffer, so
    # its first restore from blocks touched fresh pages (most of that
    # restore's time on a 2-core VM). The first store warms one on a worker,
    # sized for that conversation's state (once); a restart finds the
    # conversation on disk and warms one at open instead.
    # 32 layers of 64: 8 KiB of KV a token, so a conversation's state is a
    # few MiB (smaller ones come from malloc, blob.c)
    model = mkmodel(tmp_path / "deep.gguf", "--layers", "32", "--embd", "64", "--heads", "2", "--kv-heads", "2")
    flags = ["-np", "1", "-c", "8192", "-v", *kv_flags(tmp_path / "cache")]
    s = serve(model, *flags)
    a, b = conversation(1, 600), conversation(2, 600)
    r1 = chat(s, a)
    chat(s, b)  # takes the only slot: turn 2 of a is restored from its blocks
    r2 = chat(s, turn2(a, r1, 1))
    assert r2["cache_source"] == "disk" and r2["timings"]["cache_n"] >= r1["usage"]["prompt_tokens"], r2["timings"]
    log = s.log()
    warmed = [float(m) for m in re.findall(r"a ([0-9.]+) MiB restore buffer warmed after the first store", log)]
    state = [float(m) for m in re.findall(r"([0-9.]+) MiB of state, \d+ blocks read from files", log)]
    assert len(warmed) == 1, log
    assert state and warmed[0] >= max(state), (warmed, state)
    assert s.stop() == 0
    s = serve(model, *flags)
    chat(s, turn2(a, r1, 1))
    log = s.log()
    assert "restore buffer is ready" in log and "warmed after the first store" not in log, log
