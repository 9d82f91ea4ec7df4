"""When a finished turn is on disk, and what a restart under load keeps
(issue #42): a turn's commit costs the same few syncs whatever its number
of blocks, so it lands soon after the reply even on a slow disk; a reply
whose re-decoding has to wait for a busy engine is stored as it stands
first; SIGTERM with a backlog of stores and slow syncs exits within
--shutdown-timeout with every finished turn restorable; a second SIGTERM
exits at once. Real binary, real files, a slow disk by test hook
(THAW_TEST_DISK_FSYNC_DELAY_MS: every fsync and syncfs sleeps first)."""
import signal
import threading
import time

from harness import Server, assistant, drained, reply, system, text, user


def chat(s, messages, max_tokens=8):
    r = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def committed(s, before):
    """The turn's blocks and a manifest naming them are on disk."""
    m = s.metrics()
    queued = m["thaw_kv_disk_blocks_written_total"] - before["thaw_kv_disk_blocks_written_total"] + 1
    return m["thaw_kv_disk_stores_total"] - before["thaw_kv_disk_stores_total"] >= queued


def from_cache(r):
    u = r["usage"]
    return u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"]


def test_turn_commits_in_two_syncs_on_a_slow_disk(serve, models, tmp_path):
    """~8 blocks and a manifest: per-file fsyncs took 2 x 9 + 3 of them
    (10.5 s at 500 ms each); the group commit takes two, so the turn is on
    disk well within 4 s of the reply. Killed then (SIGKILL: nothing more
    is written), the restarted server continues the conversation from it."""
    delay_ms = 500
    flags = ["--kv-cache-dir", str(tmp_path), "--cache-ram", "0", "-c", "4096"]
    s = serve("llama", *flags, env={"THAW_TEST_DISK_FSYNC_DELAY_MS": str(delay_ms)})
    conv = [system("a long conversation. " + text(900, 1)), user("what comes next?")]
    before = s.metrics()
    r1 = chat(s, conv)
    t0 = time.time()
    while not committed(s, before) and time.time() - t0 < 4.0:
        time.sleep(0.02)
    assert committed(s, before), s.log()
    m = s.metrics()
    blocks = m["thaw_kv_disk_blocks_written_total"] - before["thaw_kv_disk_blocks_written_total"]
    syncs = m["thaw_kv_disk_fsyncs_total"] - before["thaw_kv_disk_fsyncs_total"]
    assert blocks >= 6
    assert syncs <= 4, f"{syncs} syncs for {blocks} blocks"
    s.kill()
    s2 = serve("llama", *flags)
    r2 = chat(s2, conv + [assistant(reply(r1)), user("and then?")])
    got, _ = from_cache(r2)
    assert r2["cache_source"] in ("disk", "blocks")
    assert got >= 0.95 * r1["usage"]["prompt_tokens"], (got, r1["usage"])


def test_prompt_blocks_go_to_disk_while_the_reply_is_generated(serve, models, tmp_path):
    """A turn's prompt blocks are queued once its first token is out, as a
    group of their own written without syncs (nothing names them yet), so
    the store at the reply's end writes only the blocks past the prompt's
    last whole one and the manifest, whose group syncs them all. Killed
    then, the restarted server continues the conversation from them."""
    B = 128  # --kv-cache-block's default
    flags = ["--kv-cache-dir", str(tmp_path), "--cache-ram", "0", "-c", "4096"]
    s = serve("llama", *flags, env={"THAW_TEST_DISK_FSYNC_DELAY_MS": "200"})
    conv = [system("a long conversation. " + text(900, 3)), user("what comes next?")]
    before = s.metrics()
    r1 = chat(s, conv, max_tokens=24)
    m = drained(s)

    def grew(k):
        return m[k] - before[k]
    n_prompt = r1["usage"]["prompt_tokens"]
    n_stored = n_prompt + r1["usage"]["completion_tokens"]
    assert n_prompt >= 6 * B
    assert grew("thaw_kv_disk_blocks_ahead_total") == n_prompt // B, s.log()
    # the turn's own store: the blocks the reply completed, not the prompt's
    assert grew("thaw_kv_disk_blocks_written_total") - n_prompt // B <= n_stored // B - n_prompt // B + 1
    assert grew("thaw_kv_disk_commit_groups_unsynced_total") >= 1
    # the blocks ahead cost no sync: the turn's group syncs twice, an early
    # store's (before the re-decode) twice more
    assert grew("thaw_kv_disk_fsyncs_total") <= 4
    s.kill()
    s2 = serve("llama", *flags)
    r2 = chat(s2, conv + [assistant(reply(r1)), user("and then?")])
    got, _ = from_cache(r2)
    assert r2["cache_source"] in ("disk", "blocks")
    assert got >= 0.95 * n_prompt, (got, r1["usage"], s.log())


def test_reply_stored_before_a_busy_engine_frees(serve, models, tmp_path):
    """A reply whose re-decoding must wait (the other slot prefills and
    generates without pause) is stored as it stands at once: the store
    does not wait for the engine to be free. Then restored after a kill."""
    flags = ["--kv-cache-dir", str(tmp_path), "--cache-ram", "0", "-np", "2", "-c", "8192",
             "--kv-cache-min-tokens", "700"]
    s = serve("llama", *flags)
    stop = threading.Event()

    def traffic():  # never stored: shorter than --kv-cache-min-tokens
        i = 0
        while not stop.is_set():
            i += 1
            s.post("/v1/chat/completions", {"messages": [user(f"background {i}. " + text(300, 50 + i))],
                                            "max_tokens": 64, "temperature": 0, "cache_prompt": False})

    bg = threading.Thread(target=traffic, daemon=True)
    bg.start()
    try:
        time.sleep(0.5)
        conv = [system("a long conversation. " + text(900, 2)), user("what comes next?")]
        before = s.metrics()
        r1 = chat(s, conv)
        t0 = time.time()
        while not committed(s, before) and time.time() - t0 < 30:
            time.sleep(0.02)
        assert committed(s, before), s.log()
        m = s.metrics()
        # stored as it stood, not after the wait for a free engine
        assert m["thaw_kv_cache_stores_early_total"] - before["thaw_kv_cache_stores_early_total"] >= 1, s.log()
    finally:
        stop.set()
        bg.join(120)
    s.kill()
    s2 = serve("llama", *flags)
    r2 = chat(s2, conv + [assistant(reply(r1)), user("and then?")])
    got, _ = from_cache(r2)
    # at least what the reply and the history share with the next turn's
    # rendering: the prompt of turn 1
    assert got >= 0.95 * r1["usage"]["prompt_tokens"], (got, r1["usage"], s.log())


def test_sigterm_with_a_backlog_on_a_slow_disk(serve, models, tmp_path):
    """Four conversations finish together on a disk whose every sync takes
    500 ms; SIGTERM at once. The writer holds dozens of stores; it writes
    them as one group (two syncs) and the server exits within
    --shutdown-timeout; each conversation's next turn after the restart
    comes from disk."""
    flags = ["--kv-cache-dir", str(tmp_path), "--cache-ram", "0", "-np", "4", "-c", str(4 * 2048),
             "--shutdown-timeout", "8"]
    s = serve("llama", *flags, env={"THAW_TEST_DISK_FSYNC_DELAY_MS": "500"})
    convs = [[system(f"conversation {i}. " + text(700, 10 + i)), user(f"question {i}?")] for i in range(4)]
    r1 = [None] * 4

    def turn1(i):
        r1[i] = chat(s, convs[i])

    ths = [threading.Thread(target=turn1, args=(i,)) for i in range(4)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    queued = s.metrics()["thaw_kv_disk_queue_bytes"]
    t0 = time.time()
    rc = s.stop(signal.SIGTERM, timeout=60)
    took = time.time() - t0
    assert rc == 0, s.log()
    assert took < 8 + 1, f"SIGTERM -> exit took {took:.1f} s (queued {queued} bytes)\n" + s.log()
    assert "wrote" in s.log() or queued == 0, s.log()
    s2 = serve("llama", *flags)
    for i in range(4):
        r2 = chat(s2, convs[i] + [assistant(reply(r1[i])), user("and then?")])
        got, _ = from_cache(r2)
        assert got >= 0.95 * r1[i]["usage"]["prompt_tokens"], (i, got, r1[i]["usage"], s.log())


def test_second_sigterm_exits_at_once(models, tmp_path):
    """A slow disk (5 s a sync) holds the first SIGTERM's drain; a second
    one ends the process at once, and what was committed before is still
    there (nothing torn: the next server opens the directory cleanly)."""
    flags = ["--kv-cache-dir", str(tmp_path), "--cache-ram", "0", "-c", "4096", "--shutdown-timeout", "60"]
    s = Server(models["llama"], *flags, env={"THAW_TEST_DISK_FSYNC_DELAY_MS": "5000"})
    try:
        chat(s, [system("a conversation. " + text(600, 3)), user("hello?")])
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert s.proc.poll() is None  # still writing
        t0 = time.time()
        rc = s.stop(signal.SIGTERM, timeout=30)
        assert time.time() - t0 < 5, s.log()
        assert rc == 1, s.log()
        assert "again: exiting now" in s.log(), s.log()
    finally:
        s.kill()
    s2 = Server(models["llama"], *flags)
    try:
        r = s2.post("/v1/chat/completions", {"messages": [user("hi")], "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
    finally:
        s2.kill()
