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
import signal
import subprocess
import time

import pytest

from conftest import mkmodel
from harness import THAW, Server
from test_kv_cache import chat, reply, text

B = 32  # small blocks: the test conversations span several


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrids")
    return {
        "lfm2": mkmodel(d / "lfm2.gguf", "--arch", "lfm2", "--layers", "4", "--seed", "7"),
        "qwen35": mkmodel(d / "qwen35.gguf", "--arch", "qwen35", "--layers", "4", "--seed", "8"),
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
        t = r["timings"]
        assert out(r) == ref[i], f"conversation {i}"
        # resumed at the end of the system messages: mostly from cache,
        # and not at a block boundary (a snapshot, not a run of blocks)
        assert t["cache_source"] == "blocks", (t, s.log())
        assert t["cache_n"] >= 0.75 * r["usage"]["prompt_tokens"], t
        assert t["cache_n"] < r["usage"]["prompt_tokens"]
    assert "and a snapshot (prefix lookup)" in s.log()
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
        t = r["timings"]
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
        t = r["timings"]
        want = resident[i] if t["cache_n"] > n1[i] else scratch[i]
        assert out(r) == want, (i, t, s.log())
    assert s.get("/health").status_code == 200
    s.stop()
