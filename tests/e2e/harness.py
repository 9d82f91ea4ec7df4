"""The harness the end-to-end tests and the benchmarks share: generated
models, a real `build/thaw serve` process spoken to over HTTP, and the
helpers several test modules use (messages, requests, waits). A test module
imports its helpers from here, never from another test module."""
import json
import os
import random
import re
import signal
import subprocess
import threading
import time

import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
THAW = os.environ.get("THAW_BIN", os.path.join(REPO, "build", "thaw"))


def mkmodel(path, *args):
    """Writes a generated model with `thaw mkmodel` and returns its path."""
    subprocess.run([THAW, "mkmodel", "-o", str(path), *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return str(path)


class Server:
    """A running `thaw serve`; its log is kept for assertions and failures."""

    def __init__(self, model, *args, env=None, timeout=120):
        """model: a GGUF path for -m, or None. timeout: seconds to wait for "listening on" (a device's first
        start compiles its pipelines: minutes on lavapipe, cold)."""
        # model None: the args name the models (--models-dir)
        # THAW_TEST_SERVE_ARGS: more flags for every server a suite starts (a suite run on the
        # Vulkan device: GGML_VK_VISIBLE_DEVICES=0 THAW_TEST_SERVE_ARGS="-ngl 99")
        extra = os.environ.get("THAW_TEST_SERVE_ARGS", "").split()
        self.args = [THAW, "serve", *(["-m", model] if model else []), "--port", "0", "-t", "2", *args, *extra]
        self.lines = []
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, **(env or {})})
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"listening on (https?)://[^:]+:(\d+)", line)
                if m:
                    self.scheme, self.port = m.group(1), int(m.group(2))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()
        if not ready.wait(timeout) or self.port is None:
            self.kill()
            raise RuntimeError("thaw serve did not start:\n" + self.log())
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"

    def log(self):
        return "\n".join(self.lines)

    def post(self, path, body, headers=None, stream=False, timeout=300):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return requests.post(self.url + path, data=data, headers=headers, stream=stream, timeout=timeout)

    def get(self, path, headers=None):
        return requests.get(self.url + path, headers=headers, timeout=60)

    def chat(self, messages, **kw):
        body = {"messages": messages, "temperature": 0, "max_tokens": 16, **kw}
        r = self.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        return r.json()

    def chat_stream(self, messages, **kw):
        """Returns (text, final_chunk, usage_chunk or None, all chunks)."""
        body = {"messages": messages, "temperature": 0, "max_tokens": 16, "stream": True, **kw}
        r = self.post("/v1/chat/completions", body, stream=True)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks, done = [], False
        for line in r.iter_lines(decode_unicode=True):
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            chunks.append(json.loads(payload))
        assert done, "stream ended without [DONE]"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
        final = [c for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
        usage = [c for c in chunks if "usage" in c]
        return text, final[-1], (usage[-1] if usage else None), chunks

    def metrics(self):
        out = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.split(" ")
                out[k] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


class S3Store:
    """A real S3 store (single-node Ceph RGW, scripts/s3store.sh) with all
    its state under `dir`; requests go through `curl --aws-sigv4`, the
    client the shared tier's tests and benches can count on."""

    SCRIPT = os.path.join(REPO, "scripts", "s3store.sh")

    def __init__(self, dir):
        self.dir = str(dir)
        try:
            p = subprocess.run(["bash", self.SCRIPT, "start", self.dir], capture_output=True, text=True,
                               timeout=180)
        except subprocess.TimeoutExpired:
            self.stop()  # the script was killed half-way: its daemons were not
            raise
        if p.returncode != 0:
            raise RuntimeError("scripts/s3store.sh start failed (packages: scripts/setup.sh):\n"
                               + p.stdout + p.stderr)
        self.env = dict(re.findall(r"^export (\w+)=(\S*)$", p.stdout, re.M))
        self.endpoint = self.env["THAW_S3_ENDPOINT"]
        self.started_in = p.stderr  # "ready in N s: ..."

    def pid(self, daemon):
        """The pid of `daemon`: "mon", "osd" or "rgw"."""
        with open(os.path.join(self.dir, "run", daemon + ".pid")) as f:
            return int(f.read())

    def curl_args(self, method, path, headers=(), max_time=10):
        e = self.env
        args = ["curl", "-sS", "-X", method, "--max-time", str(max_time),
                "--aws-sigv4", f"aws:amz:{e['AWS_REGION']}:s3",
                "--user", f"{e['AWS_ACCESS_KEY_ID']}:{e['AWS_SECRET_ACCESS_KEY']}",
                # RGW rejects curl's signature without it (SignatureDoesNotMatch)
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                "-o", "-", "-w", "\n%{http_code}"]
        for h in headers:
            args += ["-H", h]
        return args + [self.endpoint + path]

    @staticmethod
    def parse(p):
        """(status, body) from a curl_args run; status 0 when curl failed
        (p.returncode then says why: 28 is a time-out)."""
        body, _, code = p.stdout.rpartition(b"\n")
        return (int(code) if p.returncode == 0 else 0), body

    def request(self, method, path, data=None, headers=(), max_time=10):
        args = self.curl_args(method, path, headers, max_time)
        if data is not None:
            args[1:1] = ["--data-binary", "@-"]
        p = subprocess.run(args, input=data, capture_output=True, timeout=max_time + 30)
        return self.parse(p)

    def stop(self):
        subprocess.run(["bash", self.SCRIPT, "stop", self.dir], capture_output=True, timeout=60)


# ---- conversations: messages, requests, waits ---------------------------------

WORDS = ("river stone light garden window paper engine market silver winter question number "
         "village morning harbor letter forest season").split()


def text(n, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(i, n_words=900):
    # each system prompt differs from its first word on: only the template's
    # opening tokens are shared between conversations
    return [{"role": "system", "content": f"{WORDS[i]} persona {i}. " + text(n_words, i)},
            {"role": "user", "content": f"Question {i}: what about the {WORDS[i + 3]}?"}]


def chat(s, messages, max_tokens=16):
    r = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def timings(r):
    """A reply's timings with thaw's cache_source (beside them in the reply:
    llama-server's timings hold numbers only) merged in."""
    return {**(r.get("timings") or {}), "cache_source": r.get("cache_source")}


def reply(r):
    return r["choices"][0]["message"]["content"]


def turn2(conv, r1, i):
    return conv + [{"role": "assistant", "content": reply(r1)},
                   {"role": "user", "content": f"And then, {WORDS[i + 5]}?"}]


def kv_flags(d, *extra):
    return ["--kv-cache-dir", str(d), "--cache-ram", "0", *extra]


def drained(s, timeout=60):
    """Waits until the slots are idle and the disk writer holds nothing."""
    deadline = time.time() + timeout
    while True:
        m = s.metrics()
        if m["thaw_slots_busy"] == 0 and m["thaw_kv_disk_queue_bytes"] == 0:
            return m
        assert time.time() < deadline, "the disk writer did not drain"
        time.sleep(0.05)


def idle(s, timeout=60):
    """Waits until no slot is busy, post-reply work (the re-decode of a
    reply's canonical form, the store) included. Under load that work can
    outlast the client's next request, which then cuts it short and finds
    fewer tokens stored (by design: a request never waits for another's
    post-reply work; test_a_request_cuts_another_conversations_post_reply_work_short
    covers it); a test about a tier waits for it to finish instead."""
    deadline = time.time() + timeout
    while s.metrics()["thaw_slots_busy"] != 0:
        assert time.time() < deadline, "the slots did not go idle"
        time.sleep(0.05)


def user(text):
    return {"role": "user", "content": text}


def system(text):
    return {"role": "system", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def shared_system():
    return {"role": "system", "content": "Shared rules and tools. " + text(250, 3)}


def ask(i):
    return {"role": "user", "content": f"Job {i}: " + text(30, 100 + i)}


def events(resp):
    """The data lines of an SSE response, as text (JSON not parsed)."""
    out = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            out.append(line[6:])
    return out


# ---- devices: where the model sits, Mesa's software Vulkan device --------------

# ggml skips a Vulkan device of CPU type (Mesa's lavapipe, which every
# machine with Debian's mesa-vulkan-drivers has) unless it is named here;
# "0,0" makes the one device two (Vulkan0, Vulkan1) for -ts and -dev
VULKAN_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}


def list_devices(env=None):
    """`thaw serve --list-devices`: the CompletedProcess (stdout lists them)."""
    return subprocess.run([THAW, "serve", "--list-devices"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def placement(s):
    """GET /props' placement, its places by name ("host", "Vulkan0", ...)."""
    pl = s.get("/props").json()["placement"]
    pl["places"] = {p["name"]: p for p in pl["places"]}
    return pl
