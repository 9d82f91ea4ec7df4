"""The block store on hybrid models (lfm2: short convolutions; qwen35: gated
delta-net; DESIGN §12, src/cache/snapshots.h): attention layers in blocks, the
recurrent state as snapshots at the end of every turn and of the leading
system messages. After a restart a new conversation resumes at the shared
system prompt's snapshot, an edited history at the last turn's end, and two
conversations that diverge past a snapshot each get their own output.

Exact, as DESIGN §6 asks: each output equals a resident slot's (no cache
tier) that reached the same position the same way. A resident slot also
stops its prefill at the end of the system messages (a snapshot position:
the engine checkpoints there), so a conversation restored at that snapshot
and one served from scratch decode the same batches."""
import glob
import os

import pytest

from conftest import mkmodel
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
