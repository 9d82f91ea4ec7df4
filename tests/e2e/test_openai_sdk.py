"""Compatibility: the official `openai` npm SDK talks to thaw and parses
what it gets (non-streaming, streaming with usage, errors)."""
import json
import os
import shutil
import subprocess

import pytest

from harness import REPO

NODE_MODULES = os.path.join(REPO, ".deps", "npm", "node_modules")


def test_openai_sdk_round_trip(serve):
    if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_MODULES, "openai")):
        pytest.fail("node and the openai SDK are installed by scripts/setup.sh; run it first")
    s = serve("llama", "--api-key", "sekrit", "--alias", "thaw-tiny")
    script = os.path.join(os.path.dirname(__file__), "openai_client.mjs")
    # ESM resolves bare imports from the script's folder upwards: point it at .deps/npm
    link = os.path.join(os.path.dirname(__file__), "node_modules")
    if not os.path.exists(link):
        os.symlink(NODE_MODULES, link)
    p = subprocess.run(["node", script, s.url + "/v1", "sekrit"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["models"] == ["thaw-tiny"]
    c = out["completion"]
    assert c["object"] == "chat.completion" and c["role"] == "assistant" and c["content"]
    assert c["finish_reason"] in ("stop", "length")
    assert c["usage"]["completion_tokens"] >= 1
    st = out["stream"]
    assert st["content"] == c["content"]  # greedy: same text either way
    assert st["finish_reason"] == c["finish_reason"]
    assert st["usage"]["completion_tokens"] == c["usage"]["completion_tokens"]
    assert out["error"]["status"] == 400 and "messages" in out["error"]["message"]
    assert out["auth"]["status"] == 401
