"""Many models in one process (--models-dir, DESIGN §16): requests routed by
their 'model', --models-max with LRU unloading, and the headline: a model
unloaded and loaded back restores its conversations from --kv-cache-dir
(llama-server's router, llama-swap and Ollama prefill them again). -m alone
keeps its one-model behaviour."""
import subprocess
import threading
import time

import pytest

from harness import THAW, Server, conversation, idle, mkmodel, reply, turn2, timings


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models_dir")
    mkmodel(d / "alpha.gguf", "--arch", "llama", "--seed", "11")
    mkmodel(d / "beta.gguf", "--arch", "gemma3", "--seed", "12", "--swa-window", "32")
    (d / "notes.txt").write_text("not a model\n")
    return d


@pytest.fixture
def router(models_dir):
    started = []

    def start(*args):
        s = Server(None, "--models-dir", str(models_dir), *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def ask(s, model, messages, max_tokens=16):
    r = s.post("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": max_tokens,
                                        "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def statuses(s):
    r = s.get("/models")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    return {m["id"]: m["status"]["value"] for m in body["data"]}


def test_a_swapped_model_restores_its_conversation_from_disk(router, models_dir, tmp_path):
    s = router("--models-max", "1", "--kv-cache-dir", str(tmp_path / "kv"), "--cache-ram", "0", "-c", "4096")
    conv = conversation(1, n_words=500)
    a1 = ask(s, "alpha", conv)
    idle(s)
    b1 = ask(s, "beta", conversation(2, n_words=200))  # --models-max 1: alpha is unloaded first
    assert b1["model"] == "beta"
    assert statuses(s) == {"alpha": "unloaded", "beta": "loaded"}
    assert "model alpha: unloading" in s.log()
    a2 = ask(s, "alpha.gguf", turn2(conv, a1, 1))  # the file name names it too
    t = timings(a2)
    history = a1["usage"]["prompt_tokens"] + a1["usage"]["completion_tokens"]
    assert t["cache_source"] in ("disk", "blocks"), t
    assert t["cache_n"] >= 0.95 * history, (t, history)
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] == t["cache_n"], a2["usage"]
    assert statuses(s) == {"alpha": "loaded", "beta": "unloaded"}
    s.stop()

    # the same turns from a fresh one-model server, prefilled: the same words
    with Server(str(models_dir / "alpha.gguf")) as ref:
        r1 = ask(ref, "anything", conv)
        assert reply(r1) == reply(a1)
        r2 = ask(ref, "anything", turn2(conv, r1, 1))
        assert r2["cache_source"] in ("slot", "none")
        assert reply(r2) == reply(a2)


def test_a_swap_right_after_a_reply_stores_that_reply(router, tmp_path):
    # no wait for the slot's post-reply work: the unload finishes it and
    # stores the conversation (a clean shutdown of that engine) before beta loads
    s = router("--models-max", "1", "--kv-cache-dir", str(tmp_path / "kv"), "--cache-ram", "0")
    conv = conversation(3, n_words=400)
    a1 = ask(s, "alpha", conv)
    ask(s, "beta", [{"role": "user", "content": "hello"}], 2)
    a2 = ask(s, "alpha", turn2(conv, a1, 3))
    history = a1["usage"]["prompt_tokens"] + a1["usage"]["completion_tokens"]
    assert a2["cache_source"] in ("disk", "blocks"), a2["timings"]
    assert a2["timings"]["cache_n"] >= 0.95 * history, (a2["timings"], history)


def test_two_models_loaded_share_one_cache_directory(router, models_dir, tmp_path):
    # --models-max 2: both engines loaded at once, both disk tiers handles
    # onto one store (one lock, one writer); after a restart each model
    # restores its own conversation from that directory, and never the other's
    kv = str(tmp_path / "kv")
    s = router("--models-max", "2", "--kv-cache-dir", kv, "--cache-ram", "0", "-c", "4096")
    ca, cb = conversation(4, n_words=500), conversation(5, n_words=400)
    a1 = ask(s, "alpha", ca)
    b1 = ask(s, "beta", cb)
    assert statuses(s) == {"alpha": "loaded", "beta": "loaded"}
    assert s.log().count("one store for every model") == 1
    s.stop()  # a clean shutdown stores what both models' slots hold

    s = router("--models-max", "2", "--kv-cache-dir", kv, "--cache-ram", "0", "-c", "4096")
    a2 = ask(s, "alpha", turn2(ca, a1, 4))
    b2 = ask(s, "beta", turn2(cb, b1, 5))
    assert statuses(s) == {"alpha": "loaded", "beta": "loaded"}
    for r1, r2 in ((a1, a2), (b1, b2)):
        history = r1["usage"]["prompt_tokens"] + r1["usage"]["completion_tokens"]
        assert r2["cache_source"] in ("disk", "blocks"), r2["timings"]
        assert r2["timings"]["cache_n"] >= 0.95 * history, (r2["timings"], history)
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == r2["timings"]["cache_n"], r2["usage"]
    # beta asked alpha's conversation: alpha's state is not beta's
    x = ask(s, "beta", turn2(ca, a1, 4))
    assert x["cache_source"] in ("none", "slot"), x["timings"]
    s.stop()

    # the same turns from fresh one-model servers without a cache: the same words
    for name, conv, r1, r2, i in (("alpha", ca, a1, a2, 4), ("beta", cb, b1, b2, 5)):
        with Server(str(models_dir / (name + ".gguf")), "-c", "4096") as ref:
            f1 = ask(ref, name, conv)
            assert reply(f1) == reply(r1)
            f2 = ask(ref, name, turn2(conv, f1, i))
            assert f2["cache_source"] in ("slot", "none")
            assert reply(f2) == reply(r2)


def test_a_busy_model_is_not_unloaded_and_no_http_thread_waits(router):
    # one HTTP thread: a request waiting for its model must not hold it, or
    # alpha's reply (sent by that thread) would wait for beta's load, which
    # waits for alpha's reply to end (upstream: test_router_queue_does_not_evict_busy_model)
    s = router("--models-max", "1", "--threads-http", "1", "--timeout", "60")
    msgs = [{"role": "user", "content": "tell me a story"}]
    out = {}

    def run(model, n):
        out[model] = ask(s, model, msgs, n)

    t0 = time.time()
    ta = threading.Thread(target=run, args=("alpha", 48))
    ta.start()
    deadline = time.time() + 30
    while statuses(s)["alpha"] != "loaded":
        assert time.time() < deadline
        time.sleep(0.05)
    tb = threading.Thread(target=run, args=("beta", 2))
    tb.start()
    ta.join(60)
    tb.join(60)
    assert out["alpha"]["usage"]["completion_tokens"] == 48, out  # not cut short by the unload
    assert out["beta"]["model"] == "beta"
    assert statuses(s) == {"alpha": "unloaded", "beta": "loaded"}
    assert time.time() - t0 < 30, "a request waited for its model on the HTTP thread"
    log = s.log()
    assert log.index("model alpha: unloading") > log.index("model alpha: loading")


def test_requests_for_two_models_at_once_load_each_once(router):
    # --models-max 1: one is loaded and serves its request before the
    # other's load unloads it (a model loaded for a waiting request is not
    # an LRU victim until that request has it)
    s = router("--models-max", "1")
    msgs = [{"role": "user", "content": "hello"}]
    out = {}
    threads = [threading.Thread(target=lambda m=m: out.update({m: ask(s, m, msgs, 2)})) for m in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out["alpha"]["model"] == "alpha" and out["beta"]["model"] == "beta", out
    loads = [l for l in s.log().splitlines() if ": loading /" in l]
    assert len(loads) == 2, loads


def test_get_routes_name_the_model_in_the_query(router):
    s = router("--models-max", "2")
    r = s.get("/props?model=beta")
    assert r.status_code == 200, r.text
    assert r.json()["model_alias"] == "beta"
    assert statuses(s)["beta"] == "loaded"
    r = s.get("/props")  # no model named: llama-server's router answers for itself
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["role"] == "router" and p["max_instances"] == 2 and p["models_autoload"] is True, p
    assert p["build_info"].startswith("b"), p
    assert s.get("/props?model=gamma").status_code == 404


def metrics(s, query=""):
    r = s.get("/metrics" + query)
    assert r.status_code == 200, r.text
    return {k: float(v) for k, v in (ln.split(" ") for ln in r.text.splitlines() if ln and not ln.startswith("#"))}


def test_metrics_slots_and_props_per_model(router, tmp_path):
    # llama-server's router answers /metrics, /slots and /props per model
    # (?model=); each engine counts in its own struct, kept across unloads
    s = router("--models-max", "2", "--metrics", "-np", "2", "--kv-cache-dir", str(tmp_path / "kv"))
    a = ask(s, "alpha", conversation(6, n_words=60), 8)
    ask(s, "beta", [{"role": "user", "content": "hi"}], 3)
    ask(s, "beta", [{"role": "user", "content": "hello there"}], 3)
    idle(s)
    ma, mb, total = metrics(s, "?model=alpha"), metrics(s, "?model=beta"), metrics(s)
    assert ma["thaw_predicted_tokens_total"] == a["usage"]["completion_tokens"]
    assert mb["thaw_predicted_tokens_total"] <= 6 and mb["thaw_predicted_tokens_total"] > 0
    assert total["thaw_predicted_tokens_total"] == ma["thaw_predicted_tokens_total"] + mb["thaw_predicted_tokens_total"]
    assert total["thaw_prompt_tokens_total"] == ma["thaw_prompt_tokens_total"] + mb["thaw_prompt_tokens_total"]
    assert ma["llamacpp:tokens_predicted_total"] == ma["thaw_predicted_tokens_total"]
    assert ma["thaw_slots_total"] == 2 and total["thaw_slots_total"] == 4
    # HTTP: the server's in every view (the 3 chats; scrapes do not count)
    assert total["thaw_requests_total"] == ma["thaw_requests_total"] == 3
    assert s.get("/metrics?model=gamma").status_code == 404
    slots = s.get("/slots?model=alpha")
    assert slots.status_code == 200 and len(slots.json()) == 2, slots.text
    assert s.get("/props?model=alpha").json()["model_alias"] == "alpha"

    # the rate gauges' window is each model's own: a scrape of alpha moves alpha's
    ask(s, "alpha", conversation(8, n_words=80), 4)
    idle(s)
    assert metrics(s, "?model=alpha")["llamacpp:prompt_tokens_seconds"] > 0
    ma = metrics(s, "?model=alpha")
    assert ma["llamacpp:prompt_tokens_seconds"] == 0  # nothing since

    assert s.post("/models/unload", {"model": "alpha"}).status_code == 200
    ma2 = metrics(s, "?model=alpha")  # unloaded: its counters stay, its gauges are zero
    assert ma2["thaw_predicted_tokens_total"] == ma["thaw_predicted_tokens_total"]
    assert ma2["thaw_slots_total"] == 0 and metrics(s)["thaw_slots_total"] == 2
    # the rate gauges: a model's own window (nothing since its last scrape), not the totals'
    assert ma2["llamacpp:prompt_tokens_seconds"] == 0 and ma2["llamacpp:predicted_tokens_seconds"] == 0, ma2
    assert statuses(s)["alpha"] == "unloaded"  # a scrape loads nothing


def test_an_idle_model_sleeps_and_the_next_request_restores_its_conversation(router, models_dir, tmp_path):
    # --sleep-idle-seconds (llama-server's): unloaded as by --models-max,
    # its conversation stored first; a scrape does not keep it awake
    s = router("--models-max", "2", "--sleep-idle-seconds", "2", "--metrics", "--kv-cache-dir", str(tmp_path / "kv"),
               "--cache-ram", "0", "-c", "4096")
    conv = conversation(7, n_words=400)
    a1 = ask(s, "alpha", conv)
    assert statuses(s)["alpha"] == "loaded"
    deadline = time.time() + 30
    while statuses(s)["alpha"] != "unloaded":
        assert time.time() < deadline, s.log()[-2000:]
        metrics(s, "?model=alpha")  # a peek, no use
        time.sleep(0.3)
    assert "model alpha: unloading (idle for 2 s, --sleep-idle-seconds)" in s.log()
    a2 = ask(s, "alpha", turn2(conv, a1, 7))  # loads it again
    history = a1["usage"]["prompt_tokens"] + a1["usage"]["completion_tokens"]
    assert a2["cache_source"] in ("disk", "blocks"), a2["timings"]
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0.95 * history, (a2["usage"], history)
    s.stop()
    with Server(str(models_dir / "alpha.gguf"), "-c", "4096") as ref:
        r1 = ask(ref, "alpha", conv)
        assert reply(r1) == reply(a1)
        assert reply(ask(ref, "alpha", turn2(conv, r1, 7))) == reply(a2)


def test_an_unknown_model_is_a_404_naming_the_models(router):
    s = router()
    r = s.post("/v1/chat/completions", {"model": "gamma", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404, r.text
    msg = r.json()["error"]["message"]
    assert "gamma" in msg and "alpha" in msg and "beta" in msg and "notes" not in msg, msg
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "missing" in r.json()["error"]["message"], r.text
    assert statuses(s) == {"alpha": "unloaded", "beta": "unloaded"}  # nothing was loaded for them


def test_models_load_unload_and_statuses(router):
    s = router("--no-models-autoload", "--models-max", "2")
    assert statuses(s) == {"alpha": "unloaded", "beta": "unloaded"}
    assert s.get("/v1/models").json()["data"][0]["status"]["value"] == "unloaded"  # both paths list them all
    msgs = [{"role": "user", "content": "hello"}]
    r = s.post("/v1/chat/completions", {"model": "alpha", "messages": msgs, "max_tokens": 4})
    assert r.status_code == 400 and "/models/load" in r.text, r.text  # llama-server's router: 400, not loaded
    assert s.post("/models/load", {"model": "alpha"}).json() == {"success": True}
    assert statuses(s) == {"alpha": "loaded", "beta": "unloaded"}
    assert ask(s, "alpha", msgs, 4)["model"] == "alpha"
    assert s.post("/models/load", {"model": "beta"}).status_code == 200
    assert statuses(s) == {"alpha": "loaded", "beta": "loaded"}  # --models-max 2: both fit
    assert s.post("/models/unload", {"model": "alpha"}).json() == {"success": True}
    assert statuses(s) == {"alpha": "unloaded", "beta": "loaded"}
    assert s.post("/models/unload", {"model": "alpha"}).status_code == 400  # not loaded
    assert s.post("/models/unload", {"model": "gamma"}).status_code == 404
    assert s.post("/models/load", {}).status_code == 400
    # llama-server's ?autoload= overrides --no-models-autoload for one request
    r = s.post("/v1/chat/completions?autoload=true", {"model": "alpha", "messages": msgs, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert statuses(s) == {"alpha": "loaded", "beta": "loaded"}


def test_lru_unloads_the_least_recently_used(router):
    s = router("--models-max", "1")
    msgs = [{"role": "user", "content": "hello"}]
    for model in ("alpha", "beta", "alpha"):
        assert ask(s, model, msgs, 2)["model"] == model
        loaded = [m for m, st in statuses(s).items() if st == "loaded"]
        assert loaded == [model]


def test_m_alone_serves_its_one_model_whatever_the_request_names(tmp_path, models_dir):
    with Server(str(models_dir / "alpha.gguf")) as s:
        msgs = [{"role": "user", "content": "hello"}]
        assert ask(s, "no-such-model", msgs, 2)["model"] == "alpha.gguf"
        assert ask(s, "", msgs, 2)["model"] == "alpha.gguf"
        body = s.get("/v1/models").json()
        assert body["data"][0]["id"] == "alpha.gguf" and "models" in body  # its own shape, with meta
        assert s.post("/models/load", {"model": "alpha"}).status_code == 501
        assert s.post("/models/unload", {"model": "alpha.gguf"}).status_code == 501


def test_models_flags_are_checked(models_dir, tmp_path):
    def run(*args):
        p = subprocess.run([THAW, "serve", *args], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr

    rc, err = run("-m", str(models_dir / "alpha.gguf"), "--models-dir", str(models_dir))
    assert rc == 2 and "give one" in err, err
    rc, err = run("--models-dir", str(tmp_path / "absent"))
    assert rc == 2 and "cannot open" in err, err
    rc, err = run("--models-dir", str(models_dir), "--sleep-idle-seconds", "0")
    assert rc == 2 and "--sleep-idle-seconds 0" in err, err
    (tmp_path / "empty").mkdir()
    rc, err = run("--models-dir", str(tmp_path / "empty"), "--port", "0")
    assert rc != 0 and "no .gguf file" in err, err


# ---- --models-preset: llama-server's INI of models and their settings ------------------------


def n_ctx(s, model):
    r = s.get("/props?model=" + model)
    assert r.status_code == 200, r.text
    return r.json()["default_generation_settings"]["n_ctx"], r.json()["model_path"]


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory):
    """A model outside --models-dir, for a preset's `model = PATH`."""
    return mkmodel(tmp_path_factory.mktemp("elsewhere") / "gamma.gguf", "--arch", "llama", "--seed", "13")


def test_a_preset_sets_each_model_names_aliases_and_loads_on_startup(models_dir, elsewhere, tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text("version = 1\n"
                   "; every model\n"
                   "[*]\n"
                   "c = 512\n"
                   "[alpha]            # the --models-dir file of that stem\n"
                   "ctx-size = 1024\n"
                   "alias = small, claude-3-5-haiku-latest\n"
                   "load-on-startup = true\n"
                   "[gamma]\n"
                   "model = %s\n"
                   "np = 2\n" % elsewhere)
    with Server(None, "--models-dir", str(models_dir), "--models-preset", str(ini)) as s:
        # loaded before the server listened: no request asked for it
        assert statuses(s) == {"alpha": "loaded", "beta": "unloaded", "gamma": "unloaded"}
        listed = {m["id"]: m["aliases"] for m in s.get("/v1/models").json()["data"]}
        assert listed == {"alpha": ["small", "claude-3-5-haiku-latest"], "beta": [], "gamma": []}, listed
        # [alpha] over [*]; beta, named by no section, gets [*]; gamma's file is elsewhere
        assert n_ctx(s, "alpha") == (1024, str(models_dir / "alpha.gguf"))
        assert n_ctx(s, "beta") == (512, str(models_dir / "beta.gguf"))
        assert n_ctx(s, "gamma") == (256, elsewhere)  # -np 2 splits its 512
        assert len(s.get("/slots?model=gamma").json()) == 2
        # Claude Code's small-fast model name routes to the model whose alias it is
        r = ask(s, "claude-3-5-haiku-latest", [{"role": "user", "content": "hello"}], 2)
        assert r["model"] == "alpha"
        assert statuses(s)["alpha"] == "loaded" and s.get("/props?model=small").status_code == 200
        assert s.post("/models/unload", {"model": "small"}).status_code == 200
        assert statuses(s)["alpha"] == "unloaded"

    # llama-server's precedence: the command line over [alpha] over [*]
    with Server(None, "--models-dir", str(models_dir), "--models-preset", str(ini), "-c", "2048") as s:
        assert n_ctx(s, "alpha")[0] == 2048 and n_ctx(s, "beta")[0] == 2048


def test_a_preset_alone_is_the_list_of_models(models_dir, elsewhere, tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text("[a]\nm = %s\n\n[g]\nmodel = %s\nctx-size = 768\n" % (models_dir / "alpha.gguf", elsewhere))
    with Server(None, "--models-preset", str(ini)) as s:
        assert statuses(s) == {"a": "unloaded", "g": "unloaded"}  # no beta: there is no --models-dir
        assert ask(s, "g", [{"role": "user", "content": "hi"}], 2)["model"] == "g"
        assert n_ctx(s, "g")[0] == 768
        assert s.post("/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
                      ).status_code == 404  # a preset's model is named by its section


def test_preset_errors_name_the_file_and_line(models_dir, tmp_path):
    def run(text, *args):
        ini = tmp_path / "bad.ini"
        ini.write_text(text)
        p = subprocess.run([THAW, "serve", "--models-dir", str(models_dir), "--models-preset", str(ini), "--port", "0",
                            *args], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr

    rc, err = run("[alpha]\nc = 1024\nno-such-flag = 1\n")
    assert rc == 2 and "bad.ini:3: unknown key 'no-such-flag'" in err, err
    rc, err = run("[*]\nc = 1024\n[alpha]\nthis is not a setting\n")
    assert rc == 2 and "bad.ini:4: expected KEY = VALUE" in err, err
    rc, err = run("[alpha]\nport = 9000\n")
    assert rc == 2 and "bad.ini:2: 'port' sets the server, not a model" in err, err
    rc, err = run("[*]\nkv-cache-dir = /tmp/x\n")
    assert rc == 2 and "bad.ini:2: 'kv-cache-dir' sets the server" in err, err
    rc, err = run("[alpha]\nc = lots\n")
    assert rc == 2 and "expects a number" in err and "bad.ini:2: in 'c = lots'" in err, err
    rc, err = run("[delta]\nc = 1024\n")
    assert rc == 2 and "bad.ini:1: [delta] names no model" in err, err
    rc, err = run("[alpha]\nalias = beta\n")
    assert rc != 0 and "alias 'beta' of model alpha also names model beta" in err, err
    rc, err = run("[alpha]\nc = 1024\n", "-m", str(models_dir / "alpha.gguf"))
    assert rc == 2 and "give one" in err, err


def sse_events(s, out, stop, ready):
    """Collects GET /models/sse's events into `out` until `stop` is set."""
    import json
    import requests
    with requests.get(s.url + "/models/sse", stream=True, timeout=120) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        ready.set()
        try:
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data: "):
                    out.append(json.loads(line[6:]))
                if stop.is_set():
                    break
        except requests.exceptions.RequestException:
            pass  # the server stopped while the stream was open


def test_models_sse_tells_each_move_and_the_load_progress(router):
    s = router("--models-max", "1")
    events, stop, ready = [], threading.Event(), threading.Event()
    t = threading.Thread(target=sse_events, args=(s, events, stop, ready), daemon=True)
    t.start()
    assert ready.wait(30)
    ask(s, "alpha", [{"role": "user", "content": "hi"}], 2)
    ask(s, "beta", [{"role": "user", "content": "hi"}], 2)  # alpha unloaded first
    s.post("/models/load", {"model": "alpha"})  # an event after the ones asserted, to stop the reader
    deadline = time.time() + 30
    while time.time() < deadline and not any(e["model"] == "alpha" and e["data"]["status"] == "loaded"
                                             for e in events[1:] if e["model"] == "alpha"):
        time.sleep(0.05)
    stop.set()
    moves = [(e["model"], e["data"]["status"]) for e in events]
    assert all(e["event"] == "status_change" for e in events), events
    # the order of the moves, each model's progress lines collapsed
    seq = [m for i, m in enumerate(moves) if i == 0 or m != moves[i - 1]]
    assert seq[:6] == [("alpha", "loading"), ("alpha", "loaded"), ("alpha", "unloading"), ("alpha", "unloaded"),
                       ("beta", "loading"), ("beta", "loaded")], seq
    first_load = events[:next(i for i, e in enumerate(events) if e["data"]["status"] == "loaded")]
    progress = [e["data"]["progress"] for e in first_load if "progress" in e["data"]]
    assert progress and progress[0]["stages"] == ["text_model"] and progress[0]["current"] == "text_model"
    assert any(p["value"] == 1.0 for p in progress), progress  # the weights' load told to its end
    assert [p["value"] for p in progress] == sorted(p["value"] for p in progress), progress
    unloaded = [e for e in events if e["data"]["status"] == "unloaded"]
    assert unloaded and all(e["data"]["exit_code"] == 0 for e in unloaded), unloaded


def tokenize_later(s, model, out, key, timeout=120):
    import requests
    try:
        r = s.post("/tokenize", {"model": model, "content": "hello world"}, timeout=timeout)
        out[key] = (r.status_code, time.monotonic())
    except requests.exceptions.RequestException as e:
        out[key] = (e, time.monotonic())


def test_waiting_requests_are_served_in_arrival_order_and_a_client_that_leaves_stops_waiting(models_dir, tmp_path):
    """--models-max 1, alpha kept busy: a request for beta, then one for
    gamma (which sorts before beta) wait in that order and are served in
    it; a request whose client gives up while it waits loads nothing and
    unloads nothing. (upstream's test_router.py: its queue tests)"""
    d = tmp_path / "three"
    d.mkdir()
    for name in ("alpha", "beta", "gamma"):
        (d / f"{name}.gguf").symlink_to(models_dir / "alpha.gguf")
    # each request holds its model 1.5 s before it is served: alpha stays busy while the others queue
    with Server(None, "--models-dir", str(d), "--models-max", "1", env={"THAW_TEST_ROUTE_HOLD_MS": "1500"}) as s:
        assert s.post("/models/load", {"model": "alpha"}).status_code == 200
        out = {}
        busy = threading.Thread(target=tokenize_later, args=(s, "alpha", out, "alpha"))
        busy.start()
        time.sleep(0.5)
        first = threading.Thread(target=tokenize_later, args=(s, "beta", out, "beta"))
        first.start()
        time.sleep(0.5)
        second = threading.Thread(target=tokenize_later, args=(s, "gamma", out, "gamma"))
        second.start()
        time.sleep(0.2)
        waiting = {m["id"]: m["status"].get("waiting", 0) for m in s.get("/models").json()["data"]}
        assert waiting == {"alpha": 0, "beta": 1, "gamma": 1}, waiting
        for t in (busy, first, second):
            t.join(120)
        assert all(out[k][0] == 200 for k in ("alpha", "beta", "gamma")), out
        assert out["alpha"][1] < out["beta"][1] < out["gamma"][1], out  # arrival order, not name order
        loads = [l.split("model ")[1].split(":")[0] for l in s.log().splitlines() if ": loading /" in l]
        assert loads == ["alpha", "beta", "gamma"], loads

        # a client that gives up while its model waits for room takes nothing with it
        busy = threading.Thread(target=tokenize_later, args=(s, "gamma", out, "busy"))
        busy.start()
        time.sleep(0.5)
        tokenize_later(s, "alpha", out, "gave up", timeout=0.5)
        assert not isinstance(out["gave up"][0], int), out
        busy.join(120)
        assert out["busy"][0] == 200, out
        time.sleep(2.5)  # the loader's once-a-second look at its waiting requests
        assert statuses(s) == {"alpha": "unloaded", "beta": "unloaded", "gamma": "loaded"}
        assert "gave up waiting for its load (its client left)" in s.log()


def test_m_model_sleeps_and_wakes_with_its_conversation(models_dir, tmp_path):
    """-m with --sleep-idle-seconds (llama-server's): idle, the model is
    unloaded (/props says is_sleeping; /health, /v1/models and /metrics
    answer without waking it); the next request loads it again and its
    conversation comes back from the disk cache, where llama-server's
    sleep drops its prompt cache."""
    model = str(models_dir / "alpha.gguf")
    conv = conversation(3, n_words=300)
    with Server(model, "--sleep-idle-seconds", "1", "--metrics", "--kv-cache-dir", str(tmp_path / "kv"),
                "--cache-ram", "0") as s:
        a1 = ask(s, "x", conv)
        assert s.get("/props").json()["is_sleeping"] is False
        deadline = time.time() + 30
        while metrics(s).get("thaw_kv_disk_root_stores_total", 0) < 1 or metrics(s)["thaw_kv_disk_queue_bytes"]:
            assert time.time() < deadline, "the turn was not stored"
            time.sleep(0.05)
        awake = s.get("/metrics").text  # the window of the rate gauges starts again at the scrape before
        while not s.get("/props").json()["is_sleeping"]:
            assert time.time() < deadline, "the model did not fall asleep"
            time.sleep(0.1)
        # asleep, /metrics reads as it was (the disk tier's lines too), as
        # llama-server's; scrapes and /props polls do not count as requests
        assert s.get("/metrics").text == awake
        assert "\nthaw_kv_disk_root_stores_total " in awake
        assert s.get("/health").status_code == 200
        assert [m["id"] for m in s.get("/v1/models").json()["data"]] == ["alpha.gguf"]
        assert metrics(s)["thaw_predicted_tokens_total"] == a1["usage"]["completion_tokens"]
        time.sleep(1.5)  # scrapes and looks kept nothing awake, and woke nothing
        assert s.get("/props").json()["is_sleeping"] is True
        a2 = ask(s, "x", turn2(conv, a1, 3))
        assert a2["cache_source"] in ("disk", "blocks"), a2["timings"]
        history = a1["usage"]["prompt_tokens"] + a1["usage"]["completion_tokens"]
        assert a2["timings"]["cache_n"] >= 0.95 * history, (a2["timings"], history)
        assert s.get("/props").json()["is_sleeping"] is False
        assert "unloading (idle for 1 s" in s.log()
    with Server(model) as ref:  # the same turns, never asleep, prefilled: the same words
        r1 = ask(ref, "x", conv)
        assert reply(r1) == reply(a1)
        assert reply(ask(ref, "x", turn2(conv, r1, 3))) == reply(a2)
