"""The compute threads: thaw attaches long-lived threadpools to its llama
context, as llama-server does, instead of letting ggml start and join
threads for every graph (one a decoded token; on a machine whose cores are
busy, decode ran at a fraction of llama-server's speed). -C / -Cr place
them, --poll / --prio / --cpu-strict set how they wait and run. Asserts
what holds on any machine: the pool's threads outlive a request, and a
mask places them."""
import os

import pytest

from harness import Server, chat, idle


def threads(pid):
    """{tid: Cpus_allowed_list} of the process's threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[tid] = line.split(":", 1)[1].strip()
        except FileNotFoundError:  # a thread that ended while we looked
            pass
    return out


def idle_threads(s):
    """the thread count once a request has been answered and its post-reply work is done"""
    chat(s, [{"role": "user", "content": "Count the threads."}], max_tokens=4)
    idle(s)
    return len(threads(s.proc.pid))


def test_the_compute_threads_outlive_a_request(models):
    counts = {}
    for t in (1, 3):
        s = Server(models["llama"], "-t", str(t))
        try:
            counts[t] = idle_threads(s)
            log = s.log()
        finally:
            s.stop()
    # -t 3 keeps two worker threads beside the engine thread; -t 1 none
    # (per-graph threads would be gone by now: the counts would be equal)
    assert counts[3] - counts[1] == 2, counts
    assert "kept between graphs" in log


def test_a_cpu_mask_places_the_threads(models):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: every mask is the default placement")
    cpu = cpus[-1]
    s = Server(models["llama"], "-t", "2", "-C", format(1 << cpu, "x"), "--poll", "0", "--prio", "0")
    try:
        assert "placed by -C/-Cr" in s.log()
        idle_threads(s)
        pinned = [tid for tid, cl in threads(s.proc.pid).items() if cl == str(cpu)]
        assert pinned, threads(s.proc.pid)
    finally:
        s.stop()
    s = Server(models["llama"], "-t", "2", "-Cr", f"{cpu}-{cpu}", "--cpu-strict", "1")
    try:
        idle_threads(s)
        assert any(cl == str(cpu) for cl in threads(s.proc.pid).values())
    finally:
        s.stop()


@pytest.mark.parametrize("flag,value,says", [
    ("-C", "0xzz", "a hex CPU mask"),
    ("-Cr", "3", "a CPU range LO-HI"),
    ("-Cr", "5-2", "a CPU range LO-HI"),
    ("--poll", "101", "--poll"),
    ("--prio", "4", "--prio"),
])
def test_a_bad_placement_value_is_refused_clearly(models, flag, value, says):
    with pytest.raises(RuntimeError, match=says):
        Server(models["llama"], flag, value)
