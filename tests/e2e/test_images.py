"""Images in chat (issue #35, DESIGN §15): thaw serve --mmproj with a
generated gemma3 model and its generated vision projector (thaw mkmodel
--mmproj), the source tree's test image (tools/mtmd/test-1.jpeg) sent as a
data: URL. Random weights give gibberish, so what is checked is that an
image reaches the prompt (it adds its positions), greedy determinism, that
a slot's prefix is reused across an image only for the same image bytes,
the refusals (undecodable data, http URLs, file:// outside --media-path, a
server without a projector) in OpenAI's error shape, and that an image
conversation restored from disk after a restart equals the resident one
while another image is never served from it."""
import base64
import json
import os
import re
import struct
import zlib

import pytest

import subprocess

from agent_clis import CLAUDE, CODEX, claude, claude_from_cache, codex
from harness import REPO, THAW, Server, drained, mkmodel, text

TOOLS = os.path.join(REPO, ".deps", "llama.cpp", "tools")
JPEG = os.path.join(TOOLS, "mtmd", "test-1.jpeg")
IMAGE_TOKENS = 16  # mkmodel --mmproj: 64x64 pixels, 4-pixel patches, pooled 4x4


def png(w, h, seed):
    """A w x h RGB PNG, its pixels from `seed`."""
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 13 + seed * 31) % 256) for x in range(w * 3)) for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def data_url(raw, mime="image/jpeg"):
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def jpeg_bytes():
    with open(JPEG, "rb") as f:
        return f.read()


def image_msg(url, text="Describe this image."):
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                          {"type": "image_url", "image_url": {"url": url}}]}]


def ask(s, messages, **kw):
    return s.post("/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 8, **kw})


def assert_openai_error(r, status=400):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    return err["message"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("img-models")
    model = mkmodel(d / "gemma3.gguf", "--arch", "gemma3", "--seed", "11", "--mmproj", str(d / "mmproj.gguf"))
    return model, str(d / "mmproj.gguf")


@pytest.fixture(scope="module")
def srv(models, tmp_path_factory):
    model, mmproj = models
    cache = tmp_path_factory.mktemp("img-cache")
    s = Server(model, "--mmproj", mmproj, "--media-path", TOOLS, "-c", "2048", "-np", "1",
               "--kv-cache-dir", str(cache), "--kv-cache-min-tokens", "1", "--cache-ram", "0")
    yield s
    s.kill()


def test_mkmodel_mmproj_needs_gemma3(tmp_path):
    r = subprocess.run([THAW, "mkmodel", "-o", str(tmp_path / "m.gguf"), "--arch", "llama",
                        "--mmproj", str(tmp_path / "p.gguf")], capture_output=True, text=True)
    assert r.returncode == 2 and "--arch gemma3" in r.stderr
    assert not (tmp_path / "p.gguf").exists()


def test_props_and_models_say_vision(srv):
    props = srv.get("/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["media_marker"]
    caps = srv.get("/v1/models").json()["models"][0]["capabilities"]
    assert "multimodal" in caps


def test_image_reply(srv):
    text_only = ask(srv, [{"role": "user", "content": "Describe this image."}])
    assert text_only.status_code == 200, text_only.text
    r = ask(srv, image_msg(data_url(jpeg_bytes())))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] is not None
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    # the image's positions (and gemma3's <start_of_image> / <end_of_image> text) are in the prompt
    assert body["usage"]["prompt_tokens"] >= text_only.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS


def test_same_request_is_deterministic_and_reuses_the_image(srv):
    msgs = image_msg(data_url(jpeg_bytes()), "What is in the picture?")
    a = ask(srv, msgs).json()
    b = ask(srv, msgs).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    # the second time the slot holds the same image: its prefix (image included) is reused
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > IMAGE_TOKENS


def test_another_image_never_reuses_the_first(srv):
    msgs_a = image_msg(data_url(png(32, 32, 1), "image/png"), "Compare.")
    msgs_b = image_msg(data_url(png(32, 32, 2), "image/png"), "Compare.")
    a = ask(srv, msgs_a).json()
    again = ask(srv, msgs_a).json()
    b = ask(srv, msgs_b).json()
    n = a["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    # B differs from A only in the image's pixels: the reuse stops at the image's start
    cached_b = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached_b < n - IMAGE_TOKENS - 1, (cached_b, n)
    # and B served twice is B's own reply
    b2 = ask(srv, msgs_b).json()
    assert b2["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def two_turns(url, question="And the colours?"):
    """A first turn with an image, and the second turn built on its reply."""
    t1 = image_msg(url, "Describe this image in detail, please.")

    def second(r1):
        return t1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                     {"role": "user", "content": question}]
    return t1, second


def test_image_conversation_restored_after_restart_equals_the_resident_one(models, tmp_path):
    model, mmproj = models
    args = ["--mmproj", mmproj, "-c", "2048", "-np", "1"]
    t1, second = two_turns(data_url(jpeg_bytes()))
    # the reference: the same conversation served back to back from a resident slot
    with Server(model, *args) as ref:
        r1 = ask(ref, t1, max_tokens=12).json()
        ref2 = ask(ref, second(r1), max_tokens=12).json()
    d = tmp_path / "kv"
    cache = ["--kv-cache-dir", str(d), "--kv-cache-min-tokens", "1", "--cache-ram", "0"]
    with Server(model, *args, *cache) as s:
        assert ask(s, t1, max_tokens=12).json()["choices"] == r1["choices"]
        drained(s)
        s.stop()
    # `thaw cache ls` counts the stored conversation's image
    assert "1" in ls_images(d) and set(ls_images(d)) <= {"1", "-"}
    with Server(model, *args, *cache) as s:
        got = ask(s, second(r1), max_tokens=12).json()
        assert got["cache_source"] in ("disk", "blocks"), got["timings"]
        # the first turn's prompt, its image included, came from disk
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"] - 1
        assert got["choices"][0]["message"]["content"] == ref2["choices"][0]["message"]["content"]
        # the same text with another image after the restart: reused up to that image's start only
        other = second(r1)
        other[0]["content"][1]["image_url"]["url"] = data_url(png(32, 32, 9), "image/png")
        b = ask(s, other, max_tokens=2).json()
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] < r1["usage"]["prompt_tokens"] - IMAGE_TOKENS


def ls_images(cache):
    """`thaw cache ls`'s IMAGES column, an entry a row: the images a stored
    conversation holds (runs of placeholder tokens); "-" for a block, which
    holds no token list."""
    ls = subprocess.run([THAW, "cache", "ls", str(cache)], capture_output=True, text=True)
    assert ls.returncode == 0 and ls.stdout.split("\n")[0].split()[:3] == ["KEY", "TOKENS", "IMAGES"], ls.stdout
    return [row.split()[2] for row in ls.stdout.splitlines()[1:-1]]


def test_new_conversation_on_the_same_system_and_image_restores_their_blocks(models, tmp_path):
    """A new conversation whose system prompt and first image are a stored
    one's, while the slot holds that stored one restored from disk after a
    restart (its blocks: no checkpoints), far past where they part (further
    than gemma3's sliding window reaches back): the stored blocks serve the
    shared part, where the slot cannot resume (it served nothing before).
    Its reply equals the one served without a cache."""
    model, mmproj = models
    args = ["--mmproj", mmproj, "-c", "4096", "-np", "1"]
    system = {"role": "system", "content": "You look at pictures. " + text(300, 5)}
    img = {"type": "image_url", "image_url": {"url": data_url(jpeg_bytes())}}

    def conv(seed):
        return [system, {"role": "user", "content": [img, {"type": "text", "text": text(300, seed)}]}]
    with Server(model, *args) as ref:
        want = ask(ref, conv(2), max_tokens=4).json()
        shared = ask(ref, [system, {"role": "user", "content": [img]}], max_tokens=1).json()["usage"]["prompt_tokens"]
    cache = ["--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-min-tokens", "1", "--cache-ram", "0",
             "--kv-cache-block", "32"]
    with Server(model, *args, *cache) as s:
        r1 = ask(s, conv(1), max_tokens=4).json()
        drained(s)
        s.stop()
    with Server(model, *args, *cache) as s:
        turn2 = conv(1) + [r1["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        r2 = ask(s, turn2, max_tokens=4).json()
        assert r2["cache_source"] in ("disk", "blocks"), r2["timings"]
        got = ask(s, conv(2), max_tokens=4).json()
    assert got["cache_source"] == "blocks", (got["timings"], shared)
    # the shared part (less the generation prompt) in whole blocks, backed off to the image's start at worst
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= shared - 8 - 32 - IMAGE_TOKENS, (got, shared)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]


# ---- a hybrid's images: LFM2 and LFM2-VL's projector ---------------------------

@pytest.fixture(scope="module")
def hybrid_models(tmp_path_factory):
    """A generated LFM2 (attention and short-convolution layers: recurrent
    state, snapshots instead of a cut) and its LFM2-VL projector."""
    d = tmp_path_factory.mktemp("img-hybrid")
    model = mkmodel(d / "lfm2.gguf", "--arch", "lfm2", "--seed", "12", "--mmproj", str(d / "mmproj.gguf"))
    return model, str(d / "mmproj.gguf")


HYBRID_IMAGE_TOKENS = 64  # lfm2 projector: a 64x64 image in 4-pixel patches, 2x2 patches a token


def test_hybrid_image_conversation_restored_after_restart_equals_the_resident_one(hybrid_models, tmp_path):
    """On a hybrid (whose recurrent state is stored as snapshots, not cut):
    an image conversation's turn 2 after a restart comes from disk under its
    key, the whole first turn with it, and equals the resident one. That
    takes the reply's canonical form (a random model's reply is rarely what
    the tokenizer makes of its text, and a hybrid cannot cut its state
    where the next turn parts from it): the prompt's tokens up to the image,
    the canonical text after it. The same words with another image are
    served from its tiers only up to the image's start."""
    model, mmproj = hybrid_models
    args = ["--mmproj", mmproj, "-c", "4096", "-np", "1"]
    t1, second = two_turns(data_url(png(64, 64, 4), "image/png"))
    with Server(model, *args) as ref:
        r1 = ask(ref, t1, max_tokens=12).json()
        ref2 = ask(ref, second(r1), max_tokens=12).json()
    assert r1["usage"]["prompt_tokens"] > HYBRID_IMAGE_TOKENS
    cache = ["--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-min-tokens", "1", "--cache-ram", "0"]
    with Server(model, *args, *cache) as s:
        assert ask(s, t1, max_tokens=12).json()["choices"] == r1["choices"]
        drained(s)
        s.stop()
    with Server(model, *args, *cache) as s:
        got = ask(s, second(r1), max_tokens=12).json()
        assert got["cache_source"] in ("disk", "blocks"), got["timings"]
        assert got["cache_source"] == "disk", got["timings"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"] - 1, got
        assert got["choices"][0]["message"]["content"] == ref2["choices"][0]["message"]["content"]
        other = second(r1)
        other[0]["content"][1]["image_url"]["url"] = data_url(png(64, 64, 5), "image/png")
        b = ask(s, other, max_tokens=2).json()
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] < r1["usage"]["prompt_tokens"] - HYBRID_IMAGE_TOKENS


def test_hybrid_new_conversation_on_the_same_system_and_image_resumes_past_the_image(hybrid_models, tmp_path):
    """A hybrid keeps a snapshot of its state right after each image of a
    prompt (and at the end of the system prompt): a new conversation sending
    the same system prompt and image with other words, after a restart,
    resumes past the image from the stored blocks and that snapshot, and
    answers as a server without a cache does. With another image it resumes
    at the system prompt's end, before the image."""
    model, mmproj = hybrid_models
    args = ["--mmproj", mmproj, "-c", "4096", "-np", "1"]
    system = {"role": "system", "content": "You look at pictures. " + text(200, 5)}

    def conv(seed, image_seed=3):
        img = {"type": "image_url", "image_url": {"url": data_url(png(64, 64, image_seed), "image/png")}}
        return [system, {"role": "user", "content": [img, {"type": "text", "text": text(60, seed)}]}]
    with Server(model, *args) as ref:
        want = ask(ref, conv(2), max_tokens=4).json()
        other_want = ask(ref, conv(2, image_seed=6), max_tokens=4).json()
        lead = ask(ref, [system, {"role": "user", "content": "a"}], max_tokens=1).json()["usage"]["prompt_tokens"]
    cache = ["--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-min-tokens", "1", "--cache-ram", "0",
             "--kv-cache-block", "32"]
    with Server(model, *args, *cache) as s:
        ask(s, conv(1), max_tokens=4).json()
        drained(s)
        s.stop()
    with Server(model, *args, *cache) as s:
        got = ask(s, conv(2), max_tokens=4).json()
        other = ask(s, conv(2, image_seed=6), max_tokens=4).json()
    assert got["cache_source"] == "blocks", got["timings"]
    cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the system prompt (the branch point) and the whole image after it
    assert cached >= lead - 8 + HYBRID_IMAGE_TOKENS, (cached, lead)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    # another image: the system prompt's snapshot only
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < lead, (other["usage"], lead)
    assert other["choices"][0]["message"] == other_want["choices"][0]["message"]


def test_garbage_image_is_a_400_and_the_server_keeps_serving(srv):
    # (a truncated JPEG is not among them: stb decodes what it has, as llama-server does)
    garbage = (b"this is not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, png(32, 32, 1)[:60],
               png(32, 32, 1)[:-20], b"GIF89a" + b"\0" * 20, b"BM" + b"\xff" * 60)
    for raw in garbage:
        msg = assert_openai_error(ask(srv, image_msg(data_url(raw))))
        assert "image" in msg
    assert_openai_error(ask(srv, image_msg("data:image/png;base64,@@@not-base64@@@")))
    assert_openai_error(ask(srv, image_msg("data:image/png,rawbytes")))
    ok = ask(srv, image_msg(data_url(jpeg_bytes())))
    assert ok.status_code == 200, ok.text


def test_http_url_is_refused(srv):
    for url in ("http://127.0.0.1:1/cat.png", "https://example.com/cat.png"):
        msg = assert_openai_error(ask(srv, image_msg(url)))
        assert "data:" in msg and "fetches no" in msg


@pytest.mark.parametrize("url, why", [  # llama-server's test_local_media_file, and one more traversal
    ("file://mtmd/test-1.jpeg", None),
    ("file:////mtmd//test-1.jpeg", None),
    ("file://mtmd/notfound.jpeg", "no such file under --media-path"),
    ("file://../mtmd/test-1.jpeg", "'..'"),
    ("file://mtmd/../../tools/mtmd/test-1.jpeg", "'..'"),
])
def test_media_path(srv, url, why):
    r = ask(srv, image_msg(url), max_tokens=1)
    if why is None:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > IMAGE_TOKENS
    else:
        assert why in assert_openai_error(r)


def test_media_path_link_out_is_refused(models, tmp_path):
    model, mmproj = models
    media = tmp_path / "media"
    media.mkdir()
    os.symlink(JPEG, media / "escape.jpeg")
    with Server(model, "--mmproj", mmproj, "--media-path", str(media), "-c", "1024") as s:
        assert "no such file under --media-path" in assert_openai_error(ask(s, image_msg("file://escape.jpeg"),
                                                                            max_tokens=1))


def test_without_mmproj_images_are_refused(models):
    model, _ = models
    with Server(model, "-c", "1024") as s:
        msg = assert_openai_error(ask(s, image_msg(data_url(jpeg_bytes()))))
        assert "--mmproj" in msg
        assert "--mmproj" in assert_openai_error(ask(s, image_msg("file://mtmd/test-1.jpeg")))
        assert s.get("/props").json()["modalities"]["vision"] is False


def prompt_tokens(usage):
    """An Anthropic reply's prompt: new, read from the cache, and to be stored."""
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)


def test_anthropic_image_block(srv):
    b64 = base64.b64encode(jpeg_bytes()).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64}}
    body = {"model": "m", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]}
    r = srv.post("/v1/messages", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert prompt_tokens(out["usage"]) > IMAGE_TOKENS
    # the same as a chat completion with the image as a data: URL
    oai = ask(srv, image_msg(data_url(jpeg_bytes()), "What is this?"), max_tokens=4).json()
    assert out["content"][0]["text"] == oai["choices"][0]["message"]["content"]
    # inside a tool_result too (Claude Code's screenshots)
    tool_turn = {"model": "m", "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "here"}, image]}]}],
        "tools": [{"name": "shot", "description": "screenshot", "input_schema": {"type": "object"}}]}
    r = srv.post("/v1/messages", tool_turn)
    assert r.status_code == 200, r.text
    assert prompt_tokens(r.json()["usage"]) > IMAGE_TOKENS
    bad = dict(body, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    r = srv.post("/v1/messages", bad)
    assert r.status_code == 400 and "base64" in r.text


def test_responses_input_image(srv):
    url = data_url(jpeg_bytes())
    body = {"model": "m", "max_output_tokens": 4, "temperature": 0, "store": False,
            "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": url}]}]}
    r = srv.post("/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > IMAGE_TOKENS
    bad = dict(body, input=[{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    r = srv.post("/v1/responses", bad)
    assert r.status_code == 400 and "fetches no" in r.text


def test_browser_attach_an_image(models, tmp_path):
    """The chat page: an image attached with the file picker goes with the
    message (as an image_url part), is shown in the conversation and kept
    with it (headless Chromium driven by webui_driver.mjs, as test_webui)."""
    import json
    chromium = os.environ.get("THAW_CHROMIUM", "/usr/bin/chromium")
    npm = os.path.join(REPO, ".deps", "webui", "node_modules")
    try:
        p = subprocess.run([chromium, "--headless", "--no-sandbox", "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"chromium cannot run here: {e}")
    if p.returncode != 0:
        pytest.skip("chromium cannot run here")
    model, mmproj = models
    with Server(model, "--mmproj", mmproj, "-c", "4096", "-v") as s:
        driver = os.path.join(os.path.dirname(__file__), "webui_driver.mjs")
        r = subprocess.run(["node", driver, "image", s.url + "/", str(tmp_path / "profile"), str(tmp_path), JPEG],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "THAW_WEBUI_NPM": npm, "THAW_CHROMIUM": chromium})
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert "failure" not in res, res["failure"]
        assert res["blocked"] == [] and res["console_errors"] == [] and res["page_errors"] == [], res
        assert res["reply"].strip() and res["n_messages"] == 2, res
        assert res["images_shown"] == 1 and res["thumbs_left"] == 0 and res["kept_images"] == 1, res
        assert (tmp_path / "image.png").stat().st_size > 10_000
        assert "a prompt with 1 images" in s.log()  # it reached the server as an image


# ---- the real coding-agent CLIs carry an image through a session ----------------

# as conftest's serve: every store cut from the KV cache is checked against a whole capture
KVTAP = {"THAW_TEST_KVTAP_VERIFY": "1"}


@pytest.fixture(scope="module")
def agent_models(tmp_path_factory):
    """gemma3 and its projector with a context for an agent's system prompt and tools."""
    d = tmp_path_factory.mktemp("img-agents")
    model = mkmodel(d / "gemma3.gguf", "--arch", "gemma3", "--seed", "11", "--ctx-train", "16384",
                    "--mmproj", str(d / "mmproj.gguf"))
    return model, str(d / "mmproj.gguf")


def first_prompt(log):
    """The prompt tokens of a server's first request, all of them new."""
    return int(re.search(r"done \(\w+\): prompt (\d+) \(0 cached", log).group(1))


def restored_after_restart(log):
    """What the first request after a restart reused, from where: (source, reused, prompt)."""
    m = re.search(r"restored \S+ from (\w+) in [\d.]+ ms: (\d+) of (\d+) prompt tokens reused", log)
    assert m, log
    return m.group(1), int(m.group(2)), int(m.group(3))


def test_claude_code_carries_an_image_across_a_restart(agent_models, tmp_path):
    """A screenshot pasted into Claude Code (an image block in its first
    message; `claude -p --input-format stream-json`, as its SDK sends one),
    then two turns with --continue, a restart between them: every turn
    sends the image again and is served from the cache, the turn after the
    restart from disk beyond the whole first request, image and all."""
    if not os.access(CLAUDE, os.X_OK):
        pytest.fail("@anthropic-ai/claude-code is installed by scripts/setup.sh; run it first")
    model, mmproj = agent_models
    home, cwd, cache = tmp_path / "home", tmp_path / "project", tmp_path / "kv"
    home.mkdir()
    cwd.mkdir()
    args = ("--mmproj", mmproj, "-np", "1", "-c", "16384", "--kv-cache-dir", str(cache))
    with Server(model, *args, env=KVTAP) as s:
        pasted = {"type": "user", "message": {"role": "user", "content": [
            {"type": "text", "text": "What is in this screenshot?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": base64.b64encode(jpeg_bytes()).decode()}}]}}
        t1 = claude(home, cwd, s.url, "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
                    stdin=json.dumps(pasted) + "\n")
        assert t1["type"] == "result", t1
        first = first_prompt(s.log())
        # the stored turns hold the image (its placeholder tokens), and only one
        drained(s)
        assert "1" in ls_images(cache) and set(ls_images(cache)) <= {"1", "-"}
        t2 = claude(home, cwd, s.url, "--continue", "And goodbye.")
        share2, n2 = claude_from_cache(t2)
        assert share2 >= 0.9, t2["usage"]
        assert s.stop() == 0
    with Server(model, *args, env=KVTAP) as s:
        t3 = claude(home, cwd, s.url, "--continue", "Once more.")
        log = s.log()
    share3, n3 = claude_from_cache(t3)
    assert n3 > n2 and share3 >= 0.9, (t2["usage"], t3["usage"])
    source, reused, prompt = restored_after_restart(log)
    assert source in ("disk", "blocks") and reused > first, (source, reused, prompt, first)
    print(f"claude code with an image: first request {first} tokens; from cache {share2:.3f}, {share3:.3f}; "
          f"after the restart {reused} of {prompt} from {source}")


def test_codex_carries_an_image_across_a_restart(agent_models, tmp_path):
    """`codex exec -i IMAGE` (an input_image in its first message), then
    `codex exec resume --last` twice, a restart between them: the image is
    sent with every turn and the turn after the restart is restored from
    disk beyond the whole first request."""
    if not os.path.isfile(CODEX):
        pytest.fail("@openai/codex is installed by scripts/setup.sh; run it first")
    model, mmproj = agent_models
    home, cwd, cache = tmp_path / "home", tmp_path / "project", tmp_path / "kv"
    home.mkdir()
    cwd.mkdir()
    args = ("--mmproj", mmproj, "-np", "1", "-c", "16384", "-n", "24",
            "--kv-cache-dir", str(cache))
    with Server(model, *args, env=KVTAP) as s:
        u1 = codex(home, cwd, s.url, "What is in this picture?", "-i", JPEG)
        assert u1["input_tokens"] > 2000, u1  # Codex's instructions and tools were rendered
        first = first_prompt(s.log())
        drained(s)
        assert "1" in ls_images(cache) and set(ls_images(cache)) <= {"1", "-"}
        codex(home, cwd, s.url, "resume", "--last", "And goodbye.")
        assert s.stop() == 0
    with Server(model, *args, env=KVTAP) as s:
        codex(home, cwd, s.url, "resume", "--last", "Once more.")
        log = s.log()
    source, reused, prompt = restored_after_restart(log)
    assert source in ("disk", "blocks") and reused > first, (source, reused, prompt, first)
    print(f"codex with an image: first request {first} tokens; after the restart {reused} of {prompt} "
          f"from {source}")
