"""The chat page at / and GET /cache: served by the real binary, checked over
HTTP, and used in headless Chromium (Debian's chromium, driven by
playwright-core from .deps/webui through webui_driver.mjs): a streamed
reply, a restart, the next turn restored from disk with its restore time,
the cache view counting the hit; no console errors, nothing fetched from
anywhere but thaw."""
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from harness import REPO, THAW

NPM = os.path.join(REPO, ".deps", "webui", "node_modules")
CHROMIUM = os.environ.get("THAW_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.path.join(os.path.dirname(__file__), "webui_driver.mjs")
DOCS = os.path.join(REPO, "docs")
LONG_ENOUGH = ("--kv-cache-min-tokens", "16")  # the page's first turn is stored


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    """Skips only when the browser itself cannot run; a missing driver is a
    set-up error (scripts/setup.sh installs both)."""
    try:
        p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--version"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"chromium cannot run here ({CHROMIUM}: {e}); scripts/setup.sh installs Debian's chromium")
    if p.returncode != 0:
        pytest.skip(f"chromium cannot run here ({CHROMIUM} --version: {p.stderr.strip()[:200]})")
    assert os.path.isfile(os.path.join(NPM, "playwright-core", "package.json")), \
        "playwright-core is missing from .deps/webui: run scripts/setup.sh"
    return CHROMIUM


def drive(phase, url, profile, out, key=None):
    args = ["node", DRIVER, phase, url, str(profile), str(out)] + ([key] if key else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "THAW_WEBUI_NPM": NPM, "THAW_CHROMIUM": CHROMIUM})
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert "failure" not in res, res["failure"]
    # the page works with every other origin blocked, and never tried one
    assert res["blocked"] == [], res
    assert res["console_errors"] == [], res
    assert res["page_errors"] == [], res
    return res


def help_text():
    s = subprocess.run([THAW, "serve", "--help"], capture_output=True, text=True)
    return s.stdout + s.stderr


# ---- over HTTP ------------------------------------------------------------------

def test_page_is_served_with_a_strict_csp(serve):
    s = serve("llama")
    r = s.get("/")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/html")
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    # no inline script: every <script> names its file, and it is a module
    html = r.text
    assert html.count("<script") == html.count('<script type="module" src=')
    for path in ("/webui/app.js", "/webui/chat.js", "/webui/cacheview.js", "/webui/vendor/marked.js",
                 "/webui/vendor/purify.js", "/webui/vendor/uPlot.js", "/webui/vendor/highlight.js"):
        a = s.get(path)
        assert a.status_code == 200, path
        assert a.headers["Content-Type"].startswith("text/javascript"), path
        assert "Content-Security-Policy" in a.headers
    assert s.get("/webui/vendor/uPlot.css").headers["Content-Type"].startswith("text/css")
    # only the embedded table: no path reaches the file system
    for path in ("/webui/../src/http/server.c", "/webui/", "/webui/nope.js", "/index.html"):
        assert s.get(path).status_code == 404, path
    assert "chat page: http://127.0.0.1:" in s.log()


def test_no_webui_answers_404_and_keeps_the_api(serve):
    assert "--no-webui" in help_text()  # the flag table documents it
    s = serve("llama", "--no-webui")
    for path in ("/", "/webui/app.js"):
        r = s.get(path)
        assert r.status_code == 404, path
        assert "Content-Security-Policy" not in r.headers
    assert s.get("/health").status_code == 200
    assert s.chat([{"role": "user", "content": "hi"}], max_tokens=2)["choices"]
    assert "chat page" not in s.log()


def test_cache_needs_the_key_and_shows_only_counts(serve, tmp_path):
    secret = "ZEBRA-PASSPHRASE-7731"
    s = serve("llama", "--api-key", "k-one", "--api-key", "k-two", "--kv-cache-dir", str(tmp_path / "kv"),
              "--cache-ram", "0", *LONG_ENOUGH)
    assert s.get("/").status_code == 200  # the page itself is public: it asks for the key
    assert s.get("/cache").status_code == 401
    assert s.get("/cache", headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": "Bearer k-one"}
    msgs = [{"role": "user", "content": f"remember {secret} " + "word " * 40}]
    r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0}, headers=auth)
    assert r.status_code == 200, r.text
    s.stop()  # every store written: the disk gauges below are settled
    s = serve("llama", "--api-key", "k-one", "--api-key", "k-two", "--kv-cache-dir", str(tmp_path / "kv"),
              "--cache-ram", "0", "--kv-cache-max", "64", *LONG_ENOUGH)
    msgs.append(r.json()["choices"][0]["message"])
    msgs.append({"role": "user", "content": "again"})
    r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0}, headers=auth)
    assert r.json()["cache_source"] == "disk"
    # this turn's store settled too: the gauges compared below stay put between the two reads
    deadline = time.time() + 60
    while True:
        g = dict(line.split(" ") for line in s.get("/metrics", headers=auth).text.splitlines()
                 if line and not line.startswith("#"))
        if float(g["thaw_slots_busy"]) == 0 and float(g["thaw_kv_disk_queue_bytes"]) == 0:
            break
        assert time.time() < deadline, "the store did not settle"
        time.sleep(0.05)
    c = s.get("/cache", headers={"Authorization": "Bearer k-two"})
    assert c.status_code == 200 and c.headers["Content-Type"] == "application/json"
    body = c.text
    for leak in (secret, "k-one", "k-two", "remember", "again"):
        assert leak not in body, leak
    doc = c.json()
    assert doc["object"] == "thaw.cache"
    m = doc["metrics"]
    assert all(isinstance(v, (int, float)) for v in m.values())
    # the same numbers as /metrics (one source), under the same names
    prom = {k: v for k, v in (line.split(" ") for line in
            s.get("/metrics", headers=auth).text.splitlines() if line and not line.startswith("#"))}
    for name in ("kv_cache_hits_disk_total", "kv_cache_lookups_total", "kv_cache_misses_total",
                 "kv_disk_entries", "kv_disk_bytes", "kv_disk_blocks_skipped_total"):
        assert float(prom["thaw_" + name]) == m[name], name
    assert m["kv_cache_hits_disk_total"] == 1
    assert m["kv_disk_budget_bytes"] == 64 << 20
    assert m["kv_cache_ram_budget_bytes"] == 0
    assert m["kv_disk_bytes"] > 0


# ---- in the browser -------------------------------------------------------------

def test_browser_chat_restart_restore_from_disk_and_cache_view(serve, browser, tmp_path):
    port = free_port()  # the same origin both times: localStorage is per origin
    kv, profile, shots = tmp_path / "kv", tmp_path / "profile", tmp_path / "screenshots"
    shots.mkdir()
    args = ("--port", str(port), "--kv-cache-dir", str(kv), "--cache-ram", "0", *LONG_ENOUGH)
    s = serve("llama", *args)
    url = f"http://127.0.0.1:{port}/"

    first = drive("chat", url, profile, shots)
    assert first["reply"].strip(), first
    assert first["sse"] == ["text/event-stream; charset=utf-8"], first  # streamed
    assert first["n_messages"] == 2
    assert "prompt " in first["stats"] and "tok/s" in first["stats"]
    assert s.stop() == 0  # the store is on disk before the process ends

    s = serve("llama", *args)
    again = drive("continue", url, profile, shots)
    assert again["kept"] == 2, again  # the conversation came back from localStorage
    assert again["n_messages"] == 4
    assert again["source"] == "disk", again
    assert "restore " in again["stats"] and "saved ≈" in again["stats"], again

    view = drive("cache", url, profile, shots)
    assert view["tiles"]["hits-disk"] == "1", view
    assert view["tiles"]["misses"] == "0", view
    assert view["charts"] == 2, view
    for name in ("chat", "chat-restored", "cache"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    if os.environ.get("THAW_UPDATE_SCREENSHOTS"):  # the README's pictures
        for name in ("chat-restored", "cache"):
            shutil.copy(shots / f"{name}.png", os.path.join(DOCS, f"webui-{name}.png"))


def test_browser_asks_for_the_key_on_401(serve, browser, tmp_path):
    s = serve("llama", "--api-key", "sesame")
    res = drive("key", s.url + "/", tmp_path / "profile", tmp_path, key="sesame")
    assert res["reply"].strip(), res
    assert res["stored_key"] == "sesame"
    assert (tmp_path / "key.png").exists()


def test_browser_stop_regenerate_edit(serve, browser, tmp_path):
    s = serve("llama", "-c", "8192")
    res = drive("controls", s.url + "/", tmp_path / "profile", tmp_path)
    # stop: the partial reply stays, the page is ready for the next message
    assert res["stopped"]["send_enabled"] and res["stopped"]["n"] == 2 and res["stopped"]["partial"] > 0, res
    # regenerate: the reply is replaced, not added to
    assert res["regenerated"]["n"] == 2 and "prompt " in res["regenerated"]["stats"], res
    # edit last: the message comes back into the box and leaves the history
    assert res["edit"] == {"input": "Write at length.", "n": 0}, res
    assert res["user_texts"] == ["Write briefly instead."] and res["n_messages"] == 2, res
    assert "client went away, request cancelled" in s.log()  # Stop reached the server


def test_browser_renders_markdown_sanitized_reasoning_and_tool_calls(serve, browser, tmp_path):
    s = serve("llama")
    res = drive("render", s.url + "/", tmp_path / "profile", tmp_path)
    r = res["render"]
    assert r["h1"] == "Title" and r["bold"] == "bold" and r["items"] == 2, r
    assert r["highlighted"], r  # the python block went through highlight.js
    assert r["scripts"] == 0 and r["handlers"] == [] and r["js_links"] == 0 and r["pwned"] is None, r
    assert res.get("csp_refused", 0) >= 1, res  # and the CSP refused the handler before DOMPurify dropped it
    assert "The user wants a list. Keep it short." in res["reasoning"] and not res["reasoning_open"], res
    assert "get_weather" in res["tool"] and '{"city":"Paris"}' in res["tool"], res
    assert "cached 900 from blocks" in res["stats"] and "restore 12.5 ms" in res["stats"], res
    assert "prompt 920 tok" in res["stats"] and "gen 30 tok, 100.0 tok/s" in res["stats"], res
