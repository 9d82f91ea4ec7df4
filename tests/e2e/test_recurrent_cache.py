"""The disk cache on models whose memory cannot simply be truncated: the
hybrid lfm2 model (short-convolution layers with a recurrent state beside
attention layers; libllama calls it hybrid, thaw treats it as recurrent) and
the gemma4 model (sliding-window layers). A conversation's turn 1 is stored,
the server restarts, and turn 2 must come back from disk, checkpoints
included, with the exact reference's output (DESIGN §6: the same
conversation served back to back from a resident slot)."""
import glob
import os

import pytest

from harness import chat, conversation, kv_flags, mkmodel, reply, turn2, timings


@pytest.fixture(scope="module")
def partial_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("partial_models")
    return {
        "lfm2": mkmodel(d / "lfm2.gguf", "--arch", "lfm2", "--seed", "3"),
        "gemma4": mkmodel(d / "gemma4.gguf", "--arch", "gemma4", "--seed", "4", "--swa-window", "32"),
    }


def turn3(conv2, r2, i):
    return conv2 + [{"role": "assistant", "content": reply(r2)},
                    {"role": "user", "content": f"Last one: number {i}?"}]


def reference(serve, model, conv, i):
    """Three turns back to back from one resident slot, no cache tier."""
    s = serve(model, "-np", "1", "--cache-ram", "0")
    r1 = chat(s, conv)
    r2 = chat(s, turn2(conv, r1, i))
    r3 = chat(s, turn3(turn2(conv, r1, i), r2, i))
    s.stop()
    return r1, r2, r3


@pytest.mark.parametrize("arch", ["lfm2", "gemma4"])
def test_restart_between_turns_restores_from_disk_with_checkpoints(serve, partial_models, tmp_path, arch):
    model = partial_models[arch]
    i = 2
    conv = conversation(i, 600)
    ref1, ref2, ref3 = reference(serve, model, conv, i)

    # whole states with their .ckpt: with blocks (the default) a hybrid
    # stores snapshots instead (tests/e2e/test_blocks_hybrid.py) and an SWA
    # model its window's rows in the blocks (tests/e2e/test_blocks_swa.py)
    flags = ["-np", "1", *kv_flags(tmp_path, "--kv-cache-min-tokens", "16", "--kv-cache-block", "0")]
    s = serve(model, *flags)
    r1 = chat(s, conv)
    assert reply(r1) == reply(ref1)
    assert s.stop() == 0
    stored = [line for line in s.lines if ": stored " in line]
    assert stored and all("+ checkpoints" in line for line in stored), s.log()
    assert glob.glob(str(tmp_path / "*.idx")), "turn 1 was not stored"
    ckpts = glob.glob(str(tmp_path / "*.ckpt"))
    assert ckpts and all(os.path.getsize(c) > 0 for c in ckpts), os.listdir(tmp_path)

    s = serve(model, *flags)
    conv2 = turn2(conv, r1, i)
    r2 = chat(s, conv2)
    t = timings(r2)
    assert t["cache_source"] == "disk", (t, s.log())
    # turn 1's prompt and reply came from disk: only the new user message
    # (and the template's glue around it) is decoded
    assert t["cache_n"] >= 0.9 * r2["usage"]["prompt_tokens"], t
    assert t["cache_n"] < r2["usage"]["prompt_tokens"]
    assert reply(r2) == reply(ref2)

    # turn 3 from the resident slot of the restored conversation
    r3 = chat(s, turn3(conv2, r2, i))
    assert r3["cache_source"] == "slot"
    assert r3["timings"]["cache_n"] >= 0.9 * r3["usage"]["prompt_tokens"]
    assert reply(r3) == reply(ref3)
    m = s.metrics()
    assert m["thaw_kv_cache_hits_disk_total"] == 1
    s.stop()


def test_hybrid_model_is_served_as_recurrent(serve, partial_models):
    # the only line where thaw names the kind of memory it found: the
    # warning that checkpoints are off (engine.c: llama_model_is_recurrent
    # || llama_model_is_hybrid); an SWA model says "sliding-window" there
    s = serve(partial_models["lfm2"], "--ctx-checkpoints", "0")
    assert "recurrent model with --ctx-checkpoints 0" in s.log(), s.log()
    line = next(l for l in s.lines if "model lfm2.gguf: " in l)
    assert "model lfm2.gguf: lfm2 " in line and "(sliding window)" not in line, line
    s.stop()
    s = serve(partial_models["gemma4"], "--ctx-checkpoints", "0")
    assert "sliding-window model with --ctx-checkpoints 0" in s.log(), s.log()
    s.stop()


def test_recurrent_checkpoints_table(serve, partial_models, tmp_path):
    """DESIGN §2's checkpoint table on the hybrid model. A long gibberish
    reply re-tokenizes differently from the tokens that were generated, so
    before its state can be stored for the next turn the slot must roll back
    to where they diverge: a recurrent state exists only at its end, so only
    a checkpoint (taken at the end of the prompt) gets it there. Without
    checkpoints the stored state is one no later turn extends."""
    model = partial_models["lfm2"]
    conv = conversation(1, 300)
    rows, replies = {}, {}
    for name, extra in [("off", None), ("no-ckpt", ["--ctx-checkpoints", "0"]), ("ckpt", [])]:
        # whole states and .ckpt files (blocks and snapshots: test_blocks_hybrid.py)
        flags = [] if extra is None else kv_flags(tmp_path / name, "--kv-cache-min-tokens", "16",
                                                  "--kv-cache-block", "0", *extra)
        # turn 2 always waits for turn 1's re-decode: under load that takes
        # longer than the default --fixup-wait-ms, turn 2 cut it short and
        # prefilled the rest (cache_n 332 of 449), a policy tested elsewhere;
        # this table is about checkpoints
        flags = ["--fixup-wait-ms", "1000000", *flags]
        s = serve(model, "-np", "1", *flags)
        r1 = chat(s, conv, max_tokens=100)
        if extra is not None:
            s.stop()
            s = serve(model, "-np", "1", *flags)
        r2 = chat(s, turn2(conv, r1, 1))
        rows[name], replies[name] = timings(r2), (reply(r1), reply(r2))
        s.stop()
    total = rows["off"]["cache_n"] + rows["off"]["prompt_n"]
    # resident (RAM tier, default): the slot rolled back through its checkpoint
    assert rows["off"]["cache_source"] in ("slot", "ram") and rows["off"]["cache_n"] > 0.9 * total
    assert rows["ckpt"]["cache_source"] == "disk" and rows["ckpt"]["cache_n"] > 0.9 * total
    assert rows["no-ckpt"]["cache_n"] == 0
    assert glob.glob(str(tmp_path / "ckpt" / "*.ckpt")) and not glob.glob(str(tmp_path / "no-ckpt" / "*.ckpt"))
    # the same conversation whatever was reused
    assert replies["ckpt"] == replies["off"] == replies["no-ckpt"]
