"""GET /metrics as llama-server's dashboards read it: its llamacpp:* names,
HELP and TYPE lines and meanings, served beside thaw's own thaw_* names,
and the Process-Start-Time-Unix header; --no-metrics answers 501."""
import time

from harness import drained

# llama-server's names and types (tools/server/server-task.cpp, to_metrics)
COUNTERS = ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
            "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max",
            "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
            "spec_decode_num_drafts_total")
GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
          "n_busy_slots_per_decode")


def scrape(s):
    """({name without 'llamacpp:': value}, {name: type}, text, response) of one scrape."""
    r = s.get("/metrics")
    assert r.status_code == 200, r.text
    types, values = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE llamacpp:"):
            _, _, name, kind = line.split(" ")
            types[name[len("llamacpp:"):]] = kind
        elif line.startswith("llamacpp:"):
            name, value = line.split(" ")
            values[name[len("llamacpp:"):]] = float(value)
    return values, types, r.text, r


def idle(s):
    """One scrape once no request is in flight (the reply is out before its
    slot is released); /slots tells, so no scrape ends the rates' window early."""
    for _ in range(100):
        if not any(sl["is_processing"] for sl in s.get("/slots").json()):
            m = scrape(s)
            assert m[0]["requests_processing"] == 0
            return m
        time.sleep(0.05)
    raise AssertionError("a request stayed in flight")


def test_llamacpp_names_types_and_values_move(serve):
    s = serve("llama", "-np", "1")
    before, types, text, r = scrape(s)
    for name in COUNTERS + GAUGES:
        assert types.get(name) == ("counter" if name in COUNTERS else "gauge"), name
        assert f"# HELP llamacpp:{name} " in text, name
        assert name in before, name
    assert "thaw_prompt_tokens_total " in text  # thaw's own names stay
    started = int(r.headers["Process-Start-Time-Unix"])
    assert time.time() - 600 < started <= time.time()
    assert before["n_decode_total"] == 0 and before["tokens_predicted_total"] == 0

    prompt = "the quick brown fox jumps over the lazy dog"
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True}
    first = s.post("/completion", body).json()["timings"]
    m, _, _, _ = idle(s)
    assert first["predicted_n"] == 8
    assert m["prompt_tokens_total"] == first["prompt_n"] > 0
    assert m["tokens_predicted_total"] == 8
    assert m["n_decode_total"] >= 8  # the prompt's batches, then one per token after the first
    assert m["n_tokens_max"] >= first["prompt_n"] + 7
    assert m["prompt_seconds_total"] > 0 and m["tokens_predicted_seconds_total"] > 0
    assert 0 < m["n_busy_slots_per_decode"] <= 1  # one slot
    # the rates cover the window since the previous scrape: this one saw the request
    assert m["prompt_tokens_seconds"] > 0 and m["predicted_tokens_seconds"] > 0
    assert m["requests_deferred"] == 0

    # the same prompt again: its prefix comes from the slot, counted apart
    second = s.post("/completion", body).json()["timings"]
    assert second["cache_n"] > 0
    m2, _, _, _ = idle(s)
    assert m2["prompt_tokens_cached_total"] == first["cache_n"] + second["cache_n"]
    assert m2["prompt_tokens_total"] == first["prompt_n"] + second["prompt_n"]
    assert m2["tokens_predicted_total"] == 16
    # nothing decoded since that scrape: an empty window reads 0, the counters stay
    m3, _, _, _ = scrape(s)
    assert m3["prompt_tokens_seconds"] == 0 and m3["predicted_tokens_seconds"] == 0
    assert m3["tokens_predicted_total"] == 16


def test_no_metrics_answers_501(serve):
    s = serve("llama", "-np", "1", "--no-metrics")
    r = s.get("/metrics")
    assert r.status_code == 501
    assert "--metrics" in r.json()["error"]["message"]


HOLD_OPS = ("decode", "fixup", "restore", "store", "checkpoint", "snapshot", "image", "draft")


def hold(m, op):
    """(count, sum seconds, max seconds, [(le, cumulative count)]) of
    thaw_engine_hold_seconds{op} in a harness metrics() dict."""
    buckets = sorted(((float(k.split('le="')[1].rstrip('"}')), v) for k, v in m.items()
                      if k.startswith(f'thaw_engine_hold_seconds_bucket{{op="{op}",')), key=lambda b: b[0])
    return (m[f'thaw_engine_hold_seconds_count{{op="{op}"}}'], m[f'thaw_engine_hold_seconds_sum{{op="{op}"}}'],
            m[f'thaw_engine_hold_max_seconds{{op="{op}"}}'], buckets)


def check_histogram(m):
    for op in HOLD_OPS:
        count, total, longest, buckets = hold(m, op)
        assert buckets[-1] == (float("inf"), count), op
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), (op, buckets)  # cumulative
        assert longest <= total + 1e-9, op
        if count == 0:
            assert total == 0 and longest == 0, op
        else:  # every piece is at most the longest: all counted by the first bound above it
            assert longest <= next(le for le, n in buckets if n == count), (op, longest, buckets)


def test_engine_hold_histogram_times_each_kind_of_work(serve, tmp_path):
    """Every piece of work the engine thread does is timed into
    thaw_engine_hold_seconds{op}: the decode steps (as many as llama-server's
    n_decode_total counts, re-decoding alone apart), the restore of a
    returning conversation after a restart, its stores, and a sliding-window
    model's checkpoints."""
    flags = ["-np", "1", "--kv-cache-dir", str(tmp_path / "kv"), "--cache-ram", "0"]
    s = serve("llama", *flags)
    m0 = s.metrics()
    check_histogram(m0)
    assert all(hold(m0, op)[0] == 0 for op in HOLD_OPS)
    conv = [{"role": "system", "content": "metrics persona. " + "river stone light garden " * 100},
            {"role": "user", "content": "Hello there?"}]
    r = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0}).json()
    m1 = drained(s)  # the post-reply work and the store done
    check_histogram(m1)
    assert hold(m1, "decode")[0] + hold(m1, "fixup")[0] == m1["llamacpp:n_decode_total"] >= 8
    assert hold(m1, "store")[0] >= 1 and hold(m1, "store")[1] > 0
    assert s.stop() == 0

    s = serve("llama", *flags)
    conv += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And then?"}]
    r2 = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0}).json()
    assert r2["timings"]["cache_n"] > 0 and r2["cache_source"] == "disk"
    m2 = s.metrics()
    check_histogram(m2)
    count, total, longest, _ = hold(m2, "restore")
    assert count == 1 and total > 0 and longest == total  # one admission, and it restored from disk
    assert hold(m2, "checkpoint")[0] == 0 and hold(m2, "image")[0] == 0 and hold(m2, "draft")[0] == 0

    g = serve("gemma3", "-np", "1")
    g.post("/v1/chat/completions", {"messages": conv, "max_tokens": 4, "temperature": 0})
    mg = g.metrics()
    check_histogram(mg)
    assert hold(mg, "checkpoint")[0] >= 1  # the prompt's end, where the next turn rolls back to
