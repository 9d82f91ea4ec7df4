#!/usr/bin/env python3
"""The demo behind the README's first command: thaw's disk cache at work.

1. Start `thaw serve` on a generated 12-layer x 1024 model with --kv-cache-dir.
2. Hold the first turn of three long conversations.
3. Restart the server (a new process: nothing survives but the disk).
4. Send each conversation's second turn: its state is restored from disk.
5. Send the same second turns to a server with the cache off, to measure the
   prefill the restore saved.
6. In a terminal: serve the chat page (/) on the same cache until Ctrl-C, and
   print its address; otherwise print the command that does.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from benchlib import THAW, Server, bench_model, table, words  # noqa: E402

TOPICS = ["the harbor at dawn", "a winter garden", "the old silver market"]


def conversation(i):
    return [{"role": "system", "content": f"You are guide number {i}. Background notes: " + words(1800, i)},
            {"role": "user", "content": f"Tell me about {TOPICS[i]}."}]


def chat(server, messages):
    r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 24, "temperature": 0})
    r.raise_for_status()
    return r.json()


def main():
    model = bench_model("llama")
    cache = tempfile.mkdtemp(prefix="thaw-demo-cache-")
    flags = ["-np", "2", "-c", "8192", "--kv-cache-dir", cache]
    try:
        print(f"[demo] serving {os.path.basename(model)} with --kv-cache-dir {cache}", flush=True)
        s = Server(model, *flags)
        turns2 = []
        for i in range(len(TOPICS)):
            conv = conversation(i)
            r = chat(s, conv)
            t = r["timings"]
            print(f"[demo] conversation {i + 1} turn 1: prefilled {t['prompt_n']} tokens in {t['prompt_ms']:.0f} ms",
                  flush=True)
            turns2.append(conv + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                                  {"role": "user", "content": "Tell me more, briefly."}])
        s.stop()
        print("[demo] server stopped; starting a new one on the same cache directory", flush=True)
        s = Server(model, *flags)
        restored = [{**r["timings"], "cache_source": r["cache_source"]} for r in (chat(s, m) for m in turns2)]
        s.stop()
        print("[demo] the same turns on a server with the cache off, for comparison", flush=True)
        s = Server(model, "-np", "2", "-c", "8192")
        control = [chat(s, m)["timings"] for m in turns2]
        s.stop()
        report(restored, control)
        page(model, flags)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def page(model, flags):
    """The chat page and its cache view on the demo's cache, while a person
    looks (a terminal); otherwise how to start it."""
    port = os.environ.get("THAW_DEMO_PORT", "8080")
    if not sys.stdin.isatty():
        print(f"\nthe chat page, with a live cache view: {os.path.relpath(THAW)} serve -m {model} "
              f"--kv-cache-dir DIR --port {port}, then open http://127.0.0.1:{port}/", flush=True)
        return
    s = Server(model, *flags, "--port", port)
    print(f"\n[demo] the chat page, with a live cache view (Cache tab): {s.url}/  (Ctrl-C stops)", flush=True)
    try:
        s.proc.wait()  # Ctrl-C reaches thaw too (one process group): it shuts down
    except KeyboardInterrupt:
        pass
    finally:
        s.stop()


def report(restored, control):
    rows = []
    for i, (r, c) in enumerate(zip(restored, control)):
        total = r["cache_n"] + r["prompt_n"]
        rows.append([i + 1, total, r["cache_n"], r["cache_source"], f"{r['restore_ms']:.1f}",
                     f"{r['prompt_ms']:.0f}", f"{c['prompt_ms']:.0f}", f"{c['prompt_ms'] / max(r['restore_ms'] + r['prompt_ms'], 0.001):.0f}x"])
    print("\nturn 2 after a server restart (thaw, cache on) vs the same request with the cache off\n")
    table(["conv", "prompt tokens", "from cache", "source", "restore ms", "prefill ms (rest)",
           "prefill ms (cache off)", "speed-up"], rows)
    cached = sum(r["cache_n"] for r in restored)
    total = sum(r["cache_n"] + r["prompt_n"] for r in restored)
    print(f"\n{cached} of {total} turn-2 prompt tokens ({100.0 * cached / total:.1f}%) came from the disk cache.")


if __name__ == "__main__":
    main()
