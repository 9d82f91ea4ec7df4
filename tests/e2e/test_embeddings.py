"""thaw serve --embedding and --rerank: llama-server's embeddings
(/embedding, /embeddings, /v1/embeddings) and rerank (/rerank & co.)
endpoints on generated models (thaw mkmodel --arch bert [--rerank], qwen3
--rerank, and a llama decoder). Random weights give meaningless vectors,
so what is checked is shape, normalisation, determinism, that a batch
equals its inputs alone, the request shapes and the errors."""
import base64
import math
import os
import struct
import subprocess

import pytest

from harness import THAW, Server, mkmodel

TEXTS = ["I believe the meaning of life is", "This is a test", "Write a joke about AI",
         "Paris is a large European city"]


@pytest.fixture(scope="module")
def emodels(tmp_path_factory):
    d = tmp_path_factory.mktemp("embd-models")
    return {
        "bert": mkmodel(d / "bert.gguf", "--arch", "bert", "--seed", "3"),
        "bert-rr": mkmodel(d / "bert-rr.gguf", "--arch", "bert", "--rerank", "--seed", "4"),
        "qwen3-rr": mkmodel(d / "qwen3-rr.gguf", "--arch", "qwen3", "--rerank", "--seed", "5"),
        "llama": mkmodel(d / "llama.gguf", "--arch", "llama", "--seed", "6"),
        "qwen3": mkmodel(d / "qwen3.gguf", "--arch", "qwen3", "--seed", "7"),
    }


@pytest.fixture(scope="module")
def embd(emodels):
    s = Server(emodels["bert"], "--embedding", "-c", "512", "-np", "2", "-b", "128", "-ub", "128")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def rr(emodels):
    s = Server(emodels["bert-rr"], "--rerank", "-c", "1024", "-np", "2")
    yield s
    s.kill()


@pytest.fixture
def servers():
    started = []

    def start(model, *args):
        s = Server(model, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def embed(s, inp, path="/v1/embeddings", **kw):
    r = s.post(path, {"input": inp, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def vec(s, text, **kw):
    return embed(s, text, **kw)["data"][0]["embedding"]


def norm2(v):
    return math.sqrt(sum(x * x for x in v))


def maxdiff(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def tokens(s, text, add_special=True):
    r = s.post("/tokenize", {"content": text, "add_special": add_special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def error(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert e["code"] == status and e["message"]
    return e["message"]


# ---- embeddings ----------------------------------------------------------------------

def test_openai_shape_normalised_and_counted(embd):
    body = embed(embd, TEXTS[0], model="my-name")
    assert body["object"] == "list" and body["model"] == "my-name"
    assert len(body["data"]) == 1
    d = body["data"][0]
    assert d["object"] == "embedding" and d["index"] == 0 and len(d["embedding"]) == 64  # the model's width
    assert abs(norm2(d["embedding"]) - 1) < 1e-4  # euclidean by default
    # bge's WordPiece: [CLS] i believe the meaning of life is [SEP]
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert embed(embd, TEXTS[0])["model"] == os.path.basename(embd.args[3])  # no "model": the server's


def test_llama_server_shape_on_embeddings_and_content(embd):
    for path, body in (("/embeddings", {"input": TEXTS[1]}), ("/embedding", {"content": TEXTS[1]}),
                       ("/v1/embeddings", {"content": TEXTS[1]})):  # "content": llama-server's shape anywhere
        r = embd.post(path, body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert isinstance(out, list) and out[0]["index"] == 0
        rows = out[0]["embedding"]
        assert len(rows) == 1 and len(rows[0]) == 64  # pooled: one vector, as a list of vectors
        assert maxdiff(rows[0], vec(embd, TEXTS[1])) < 1e-6


def test_same_input_same_vector_different_inputs_differ(embd):
    a = vec(embd, TEXTS[0])
    vec(embd, TEXTS[2])  # another prompt in between: nothing of it may stay in the slot
    assert maxdiff(a, vec(embd, TEXTS[0])) < 1e-6
    assert maxdiff(a, vec(embd, TEXTS[2])) > 1e-2


def test_a_batch_equals_each_input_alone(embd):
    body = embed(embd, TEXTS)
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    for i, t in enumerate(TEXTS):
        assert maxdiff(body["data"][i]["embedding"], vec(embd, t)) < 1e-3, t
    alone = sum(embed(embd, t)["usage"]["prompt_tokens"] for t in TEXTS)
    assert body["usage"]["prompt_tokens"] == alone


def test_token_ids_and_mixed_input(embd):
    ids = tokens(embd, TEXTS[1])  # [CLS] ... [SEP]
    assert ids[0] == 101 and ids[-1] == 102
    v = vec(embd, TEXTS[1])
    assert maxdiff(embed(embd, ids)["data"][0]["embedding"], v) < 1e-6  # one prompt of ids
    two = embed(embd, [ids, TEXTS[1]])["data"]  # a list of prompts: ids, and a string
    assert len(two) == 2 and maxdiff(two[0]["embedding"], two[1]["embedding"]) < 1e-3
    # ids and text in one prompt: the text tokenized in place, without [CLS]/[SEP]
    plain = tokens(embd, "a test", add_special=False)
    mixed = embed(embd, [101, "a test", 102])
    assert mixed["usage"]["prompt_tokens"] == len(plain) + 2
    assert maxdiff(mixed["data"][0]["embedding"], embed(embd, [101, *plain, 102])["data"][0]["embedding"]) < 1e-6


def test_base64_is_the_float32_vector(embd):
    floats = vec(embd, TEXTS[3])
    d = embed(embd, TEXTS[3], encoding_format="base64")["data"][0]
    assert d["encoding_format"] == "base64" and isinstance(d["embedding"], str)
    raw = base64.b64decode(d["embedding"])
    got = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(got) == len(floats)
    assert all(struct.pack("<f", x) == struct.pack("<f", y) for x, y in zip(got, floats))  # bit for bit
    assert vec(embd, TEXTS[3], encoding_format="float") == floats


def test_embd_normalize_per_request(embd):
    raw = vec(embd, TEXTS[0], embd_normalize=-1)
    n = norm2(raw)
    assert abs(n - 1) > 1e-2  # not normalised
    assert maxdiff([x / n for x in raw], vec(embd, TEXTS[0])) < 1e-5
    taxi = vec(embd, TEXTS[0], embd_normalize=1)
    assert abs(sum(abs(x) for x in taxi) - 1) < 1e-4
    i16 = vec(embd, TEXTS[0], embd_normalize=0)
    assert abs(max(abs(x) for x in i16) - 32760) < 1e-2
    p3 = vec(embd, TEXTS[0], embd_normalize=3)
    assert abs(sum(abs(x) ** 3 for x in p3) - 1) < 1e-4


def test_embd_normalize_flag(servers, emodels):
    s = servers(emodels["bert"], "--embedding", "--embd-normalize", "1")
    assert abs(sum(abs(x) for x in vec(s, TEXTS[0])) - 1) < 1e-4
    assert s.get("/props").json()["embd_normalize"] == 1


def test_pooling_none_gives_a_vector_per_token(servers, emodels):
    s = servers(emodels["bert"], "--embedding", "--pooling", "none")
    r = s.post("/embeddings", {"input": "hello hello hello"})
    assert r.status_code == 200, r.text
    rows = r.json()[0]["embedding"]
    assert len(rows) == 5 and all(len(x) == 64 for x in rows)  # 3 words + [CLS] + [SEP]
    assert all(abs(norm2(x) - 1) > 1e-3 for x in rows)  # per-token vectors are not normalised
    assert "not OAI compatible" in error(s.post("/v1/embeddings", {"input": "hello"}), 400)
    assert s.get("/props").json()["pooling"] == "none"


def test_json_prompts_and_a_vision_models_command_line(servers, emodels, tmp_path):
    # llama-server's JSON prompt ({"prompt_string"}) embeds as its text; a
    # vision model's command line with --embedding starts (the projector is
    # not loaded: text only, said at start), and an image is a clear 400
    model = mkmodel(tmp_path / "g3.gguf", "--arch", "gemma3", "--seed", "9", "--mmproj", str(tmp_path / "mm.gguf"))
    s = servers(model, "--embedding", "--mmproj", str(tmp_path / "mm.gguf"), "-b", "256", "-ub", "256")
    assert "--embedding embeds text only: --mmproj" in s.log()
    r = s.post("/embeddings", {"content": [{"prompt_string": TEXTS[0]}, TEXTS[0], {"prompt_string": TEXTS[1],
                                                                                    "multimodal_data": []}]})
    assert r.status_code == 200, r.text
    rows = [d["embedding"] for d in r.json()]
    assert rows[0] == rows[1] and rows[0] != rows[2]
    img = base64.b64encode(b"not an image").decode()
    for content in ([{"prompt_string": "What is this: <__media__>\n", "multimodal_data": [img]}],
                    {"prompt_string": "What is this:\n", "multimodal_data": [img]}):
        assert "embeds text only" in error(s.post("/embeddings", {"content": content}), 400)
    assert s.post("/embeddings", {"content": TEXTS[2]}).status_code == 200  # and it keeps serving


def test_a_decoder_model_serves_embeddings(servers, emodels):
    # a llama: KV memory, causal; the slot's cells are emptied after each prompt
    for pooling in ("mean", "last"):
        s = servers(emodels["llama"], "--embedding", "--pooling", pooling, "-np", "2")
        a = vec(s, TEXTS[0])
        assert len(a) == 64 and abs(norm2(a) - 1) < 1e-4
        body = embed(s, TEXTS)
        for i, t in enumerate(TEXTS):
            assert maxdiff(body["data"][i]["embedding"], vec(s, t)) < 1e-3
        assert maxdiff(a, vec(s, TEXTS[0])) < 1e-6
        s.kill()


def test_no_kv_cache_is_kept_for_embeddings(servers, emodels, tmp_path):
    cache = tmp_path / "kv"
    s = servers(emodels["bert"], "--embedding", "--kv-cache-dir", str(cache))
    for t in TEXTS:
        vec(s, t)
    props = s.get("/props").json()
    assert props["embedding"] is True and props["kv_cache"] is False
    assert "not used" in props["kv_cache_embeddings"]
    log = s.log()
    assert "the KV cache is not used for embeddings" in log
    assert "--kv-cache-dir / --kv-shared: no effect with --embedding" in log
    assert not cache.exists() or not any(cache.rglob("*"))  # nothing stored


def test_many_inputs_pass_a_small_queue(servers, emodels):
    # at most -np of a request's inputs are in the engine at a time
    s = servers(emodels["bert"], "--embedding", "-np", "1", "--max-queue", "1")
    body = embed(s, [f"input number {i}" for i in range(20)])
    assert [d["index"] for d in body["data"]] == list(range(20))


def test_bad_input_is_answered_and_the_server_keeps_serving(embd):
    cases = [
        ({"input": []}, "must not be empty"),
        ({"input": 123}, "must be a string"),
        ({"input": [{"a": 1}]}, "input 0"),
        ({"input": [[1, 2], 3.5]}, "input 1"),
        ({"input": [101, 999999999]}, "not in the vocabulary"),
        ({"input": [-1]}, "not in the vocabulary"),
        ({}, "\"input\" or \"content\" must be provided"),
        ({"input": "x", "encoding_format": "hex"}, "float or base64"),
        ({"input": "x", "embd_normalize": "2"}, "embd_normalize"),
        ({"input": "This is a test " * 512}, "too large"),  # over -ub 128
    ]
    for body, words in cases:
        assert words in error(embd.post("/v1/embeddings", body), 400), body
    assert "not valid JSON" in error(embd.post("/v1/embeddings", "{nope"), 400)
    assert abs(norm2(vec(embd, TEXTS[0])) - 1) < 1e-4  # still serving


def test_over_the_context(servers, emodels):
    # one KV stream for every slot (params.c): a prompt may use all of -c
    s = servers(emodels["bert"], "--embedding", "-c", "256", "-np", "2", "-ub", "512")
    assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 256
    msg = error(s.post("/v1/embeddings", {"input": "word " * 300}), 400)
    assert "input (302 tokens) is larger than the max context size (256 tokens)" in msg
    assert len(vec(s, "word " * 250)) == 64


def test_an_empty_prompt_is_refused_where_the_vocab_adds_nothing(servers, emodels):
    # qwen3's vocab adds no BOS: "" is no prompt (bert's gets [CLS] [SEP])
    s = servers(emodels["qwen3"], "--embedding", "--pooling", "last")
    assert "cannot be empty" in error(s.post("/v1/embeddings", {"input": ""}), 400)
    assert len(vec(s, "hi")) == 64


# ---- what the server was started for -------------------------------------------------

def test_chat_routes_answer_501_on_an_embedding_server(embd):
    r = embd.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert "serves embeddings only" in error(r, 501)
    assert r.json()["error"]["type"] == "not_supported_error"
    r = embd.post("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 501 and r.json()["type"] == "error"  # Anthropic's shape
    assert "serves embeddings only" in r.json()["error"]["message"]
    assert embd.post("/completion", {"prompt": "hi"}).status_code == 501
    assert "--reranking" in error(embd.post("/rerank", {"query": "q", "documents": ["d"]}), 501)


def test_a_chat_server_refuses_embeddings(servers, emodels):
    s = servers(emodels["llama"])
    assert "--embeddings" in error(s.post("/v1/embeddings", {"input": "x"}), 501)
    assert "--reranking" in error(s.post("/v1/rerank", {"query": "q", "documents": ["d"]}), 501)
    assert "embedding" not in s.get("/props").json()


def test_flags():
    def run(*args):
        p = subprocess.run([THAW, "serve", "-m", "/nonexistent.gguf", *args], capture_output=True, text=True,
                           timeout=60)
        return p.returncode, p.stderr

    rc, err = run("--rerank", "--pooling", "mean")
    assert rc == 2 and "--rerank pools with the model's rank head" in err
    rc, err = run("--embedding", "--pooling", "sum")
    assert rc == 2 and "--pooling expects none, mean, cls, last or rank" in err
    out = subprocess.run([THAW, "serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--embedding,--embeddings", "--rerank,--reranking", "--pooling", "--embd-normalize"):
        assert flag in out


# ---- rerank ----------------------------------------------------------------------------

DOCS = ["A machine is a physical system", "Learning is the process of acquiring understanding",
        "Machine learning is a field of study", "Paris est une grande ville"]


def rerank(s, path="/rerank", **body):
    r = s.post(path, {"query": "Machine learning is", "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_rerank_orders_and_cuts(rr):
    full = rerank(rr)
    assert full["object"] == "list"
    res = full["results"]
    assert sorted(x["index"] for x in res) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in res]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    top = rerank(rr, path="/v1/rerank", top_n=2)["results"]
    assert top == res[:2]
    assert rerank(rr, path="/reranking", top_n=99)["results"] == res
    assert rerank(rr, path="/v1/reranking", top_n=0)["results"] == []


def test_rerank_scores_are_each_documents_own(rr):
    res = rerank(rr)["results"]
    for x in res:
        alone = rr.post("/rerank", {"query": "Machine learning is", "documents": [DOCS[x["index"]]]}).json()
        assert abs(alone["results"][0]["relevance_score"] - x["relevance_score"]) < 1e-4


def test_rerank_usage_counts_the_pairs(rr):
    q = len(tokens(rr, "Machine learning is", add_special=False))
    docs = ["A machine", "Learning is"]
    d = [len(tokens(rr, x, add_special=False)) for x in docs]
    body = rr.post("/rerank", {"query": "Machine learning is", "documents": docs}).json()
    # [CLS] query [SEP] document, as the bge vocab adds its markers
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(1 + q + 1 + x for x in d)


def test_rerank_tei_shape(rr):
    r = rr.post("/rerank", {"query": "Machine learning is", "texts": DOCS, "return_text": True, "top_n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 3
    jina = rerank(rr)["results"]
    for a, b in zip(out, jina):
        assert a["index"] == b["index"] and abs(a["score"] - b["relevance_score"]) < 1e-6
        assert a["text"] == DOCS[a["index"]]
    assert "text" not in rerank(rr, return_text=True)["results"][0]  # TEI's field only


def test_rerank_errors(rr):
    for body, words in (({"query": "q", "documents": []}, "non-empty string array"),
                        ({"query": "q", "documents": None}, "non-empty string array"),
                        ({"query": "q", "documents": 123}, "non-empty string array"),
                        ({"query": "q", "documents": [1, 2]}, "non-empty string array"),
                        ({"documents": ["d"]}, "\"query\" must be provided"),
                        ({"query": 5, "documents": ["d"]}, "\"query\" must be a string"),
                        ({"query": "q", "documents": ["d"], "top_n": -1}, "top_n"),
                        ({"query": "q", "documents": ["word " * 2000]}, "too large")):
        assert words in error(rr.post("/rerank", body), 400), body
    assert len(rerank(rr)["results"]) == 4


def test_a_qwen3_reranker(servers, emodels):
    s = servers(emodels["qwen3-rr"], "--rerank")
    res = rerank(s)["results"]
    scores = [x["relevance_score"] for x in res]
    assert all(0 < x < 1 for x in scores)  # p("yes"): softmax over yes / no
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    assert "pooling rank" in s.log()
