"""End-to-end tests of `thaw mkmodel`, run against the real binary.

THAW_BIN names the binary (default: <repo>/build/thaw). The vocab GGUFs and
chat templates come from <repo>/.deps/llama.cpp/models (scripts/setup.sh
fetches them). Models here are tiny (64 wide, 2 layers) so the whole file
runs in seconds; the ones served by `thaw serve` answer a short chat.
"""
import os
import struct
import subprocess
from pathlib import Path

import pytest

from harness import Server

REPO = Path(__file__).resolve().parents[2]
THAW = Path(os.environ.get("THAW_BIN", REPO / "build" / "thaw"))
VOCAB_DIR = REPO / ".deps" / "llama.cpp" / "models"
SPM = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"
TEMPLATES = VOCAB_DIR / "templates"
NEW_ARCHS = ["qwen3", "gemma4", "lfm2", "qwen35"]
# the family template --template auto embeds for each new arch
FAMILY = {"qwen3": "Qwen-Qwen3-0.6B.jinja", "gemma4": "google-gemma-4-31B-it.jinja",
          "lfm2": "LFM2.5-Instruct.jinja", "qwen35": "Qwen3.5-4B.jinja"}


def mkmodel(*args, env=None, timeout=120):
    """Runs `thaw mkmodel ARGS`; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ)
    full_env.pop("THAW_VOCAB_DIR", None)
    if env:
        full_env.update(env)
    return subprocess.run([str(THAW), "mkmodel", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def build(out, *args, **kw):
    r = mkmodel("-o", out, *args, **kw)
    assert r.returncode == 0, r.stderr
    return r


# ---- a minimal GGUF reader: header, KV pairs, tensor infos --------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, t):
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            at, n = self.take("<I"), self.take("<Q")
            if at == _STRING:
                return [self.string() for _ in range(n)]
            fmt = _SCALARS[at]
            size = struct.calcsize(fmt)
            vals = list(struct.unpack_from("<%d%s" % (n, fmt[1]), self.data, self.pos))
            self.pos += n * size
            return vals
        return self.take(_SCALARS[t])


def read_gguf(path):
    """Returns (kv dict, [(name, ne tuple, ggml type)], data offset, file size)."""
    data = Path(path).read_bytes()
    r = _Reader(data)
    assert data[:4] == b"GGUF"
    r.pos = 4
    assert r.take("<I") == 3
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        ne = tuple(r.take("<Q") for _ in range(r.take("<I")))
        ggml_type = r.take("<I")
        r.take("<Q")  # offset
        tensors.append((name, ne, ggml_type))
    align = kv.get("general.alignment", 32)
    return kv, tensors, (r.pos + align - 1) // align * align, len(data)


# ---- tests --------------------------------------------------------------------

def test_binary_and_vocab_present():
    assert THAW.is_file(), f"no thaw binary at {THAW} (set THAW_BIN or build first)"
    assert SPM.is_file(), f"no vocab at {SPM} (run scripts/setup.sh)"


def test_help_exits_zero_and_lists_flags():
    r = mkmodel("--help")
    assert r.returncode == 0
    for flag in ("--arch", "--vocab", "--layers", "--embd", "--heads", "--kv-heads", "--ff",
                 "--swa-window", "--swa-pattern", "--attn-pattern", "--chat-template-file",
                 "--template", "--ctx-train", "--seed", "--type", "-o"):
        assert flag in r.stdout
    for arch in ("llama", "gemma3", *NEW_ARCHS):
        assert f"  {arch} " in r.stdout, arch
    for name in FAMILY.values():
        assert name.split(".jinja")[0] in r.stdout


@pytest.mark.parametrize("arch", ["llama", "gemma3", *NEW_ARCHS, "gpt-oss", "deepseek2"])
def test_same_seed_same_bytes(tmp_path, arch):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    build(a, "--arch", arch, "--vocab", SPM, "--seed", 42)
    build(b, "--arch", arch, "--vocab", SPM, "--seed=42")
    assert a.stat().st_size > 1_000_000
    assert a.read_bytes() == b.read_bytes()


def test_different_seed_different_weights_same_layout(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    build(a, "--vocab", SPM, "--seed", 1)
    build(b, "--vocab", SPM, "--seed", 2)
    da, db = a.read_bytes(), b.read_bytes()
    assert len(da) == len(db)
    assert da != db
    _, _, data_off, _ = read_gguf(a)
    assert da[:data_off] == db[:data_off], "metadata must not depend on the seed"
    assert da[data_off:] != db[data_off:]


def test_seed_accepts_hex(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    build(a, "--vocab", SPM, "--seed", 255)
    build(b, "--vocab", SPM, "--seed", "0xff")
    assert a.read_bytes() == b.read_bytes()


def test_llama_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--vocab", SPM, "--layers", 3, "--embd", 64, "--heads", 4, "--kv-heads", 2,
              "--ff", 96, "--ctx-train", 2048)
    assert "llama" in r.stderr and "MB" in r.stderr  # the one-line summary
    kv, tensors, _, size = read_gguf(out)
    assert size == out.stat().st_size
    assert kv["general.architecture"] == "llama"
    assert kv["llama.block_count"] == 3
    assert kv["llama.embedding_length"] == 64
    assert kv["llama.attention.head_count"] == 4
    assert kv["llama.attention.head_count_kv"] == 2
    assert kv["llama.feed_forward_length"] == 96
    assert kv["llama.context_length"] == 2048
    assert kv["llama.rope.dimension_count"] == 16  # head size, not the vocab model's 128
    n_vocab = len(kv["tokenizer.ggml.tokens"])
    assert n_vocab == 32000
    # only tokenizer.* keys come from the vocab file; spm has no template -> chatml
    assert all(k.startswith(("general.", "llama.", "tokenizer.")) for k in kv)
    assert "<|im_start|>" in kv["tokenizer.chat_template"]
    t = {name: (ne, ty) for name, ne, ty in tensors}
    assert len(t) == 3 + 9 * 3
    assert t["token_embd.weight"] == ((64, n_vocab), 1)  # ggml order, F16
    assert t["output.weight"] == ((64, n_vocab), 1)
    assert t["output_norm.weight"] == ((64,), 0)  # norms are F32
    assert t["blk.2.attn_q.weight"][0] == (64, 64)
    assert t["blk.2.attn_k.weight"][0] == (64, 32)
    assert t["blk.2.attn_v.weight"][0] == (64, 32)
    assert t["blk.2.attn_output.weight"][0] == (64, 64)
    assert t["blk.2.ffn_gate.weight"][0] == (64, 96)
    assert t["blk.2.ffn_up.weight"][0] == (64, 96)
    assert t["blk.2.ffn_down.weight"][0] == (96, 64)


def test_gemma3_layout(tmp_path):
    out = tmp_path / "m.gguf"
    build(out, "--arch", "gemma3", "--vocab", SPM, "--layers", 4, "--swa-window", 16,
          "--swa-pattern", 2, "--type", "f32")
    kv, tensors, _, _ = read_gguf(out)
    assert kv["general.architecture"] == "gemma3"
    assert kv["gemma3.attention.sliding_window"] == 16
    assert kv["gemma3.attention.sliding_window_pattern"] == 2
    assert "<start_of_turn>" in kv["tokenizer.chat_template"]
    t = {name: (ne, ty) for name, ne, ty in tensors}
    assert "output.weight" not in t  # tied to token_embd
    assert len(t) == 2 + 13 * 4
    assert t["token_embd.weight"][1] == 0  # --type f32
    for suffix in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
        assert f"blk.3.{suffix}.weight" in t
    assert t["blk.0.attn_q_norm.weight"][0] == (16,)  # head size


def test_default_vocab_found_from_binary(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out)  # default vocab, found relative to the executable
    assert "ggml-vocab-llama-bpe.gguf" in r.stderr
    kv, _, _, _ = read_gguf(out)
    assert len(kv["tokenizer.ggml.tokens"]) == 128256
    assert "<|start_header_id|>" in kv["tokenizer.chat_template"]  # llama3 default


def test_vocab_dir_env_and_name(tmp_path):
    vdir = tmp_path / "vocabs"
    vdir.mkdir()
    (vdir / "ggml-vocab-tiny.gguf").symlink_to(SPM)
    out = tmp_path / "m.gguf"
    build(out, "--vocab", "tiny", env={"THAW_VOCAB_DIR": str(vdir)})
    kv, _, _, _ = read_gguf(out)
    assert len(kv["tokenizer.ggml.tokens"]) == 32000
    r = mkmodel("-o", tmp_path / "n.gguf", "--vocab", "absent",
                env={"THAW_VOCAB_DIR": str(vdir)})
    assert r.returncode == 2
    assert "THAW_VOCAB_DIR" in r.stderr


BAD_FLAGS = [
    ([], "-o OUT.gguf is required"),
    (["--arch", "gpt2"], "expected llama, gemma3, qwen3, gemma4, lfm2, qwen35, gpt-oss, deepseek2 or bert"),
    (["--layers", "0"], "--layers"),
    (["--layers", "513"], "--layers"),
    (["--layers", "2x"], "--layers"),
    (["--layers", "-1"], "--layers"),
    (["--embd", "100", "--heads", "3"], "not a multiple of --heads"),
    (["--embd", "12", "--heads", "4"], "must be even"),
    (["--kv-heads", "3"], "must divide --heads"),
    (["--swa-window", "16"], "apply to --arch gemma3, gemma4 and gpt-oss only"),
    (["--arch", "qwen3", "--swa-pattern", "2"], "gpt-oss only"),
    (["--moe-experts", "4"], "--moe-experts applies to --arch gpt-oss and deepseek2 only"),
    (["--arch", "deepseek2", "--moe-experts", "1"], "--moe-experts"),
    (["--arch", "deepseek2", "--layers", "1"], "needs --layers 2 or more"),
    (["--arch", "deepseek2", "--kv-heads", "2"], "one KV head"),
    (["--arch", "gpt-oss", "--moe-experts", "1"], "--moe-experts"),
    (["--arch", "gpt-oss", "--moe-experts", "65"], "--moe-experts"),
    (["--arch", "gemma4", "--swa-pattern", "1"], "gemma4 needs an SWA layer"),
    (["--arch", "gemma4", "--layers", "1"], "needs --layers 2 or more"),
    (["--arch", "lfm2", "--layers", "1"], "needs --layers 2 or more"),
    (["--attn-pattern", "2"], "lfm2 and qwen35 only"),
    (["--arch", "lfm2", "--attn-pattern", "1"], "--attn-pattern"),
    (["--arch", "lfm2", "--layers", "4", "--attn-pattern", "5"], "leaves no attention layer"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "No such file"),
    (["--chat-template-file", "/"], "Is a directory"),
    (["--chat-template-file", "/dev/null"], "not a regular file"),
    (["--chat-template-file", str(SPM), "--template", "chatml"], "excludes --template"),
    (["--chat-template-file", str(SPM), "--draft-of", str(SPM)], "excludes --template"),
    (["--arch", "gemma3", "--swa-window", "9000"], "below --ctx-train"),
    (["--arch", "llama", "--rerank"], "--rerank applies to --arch bert and qwen3 only"),
    (["--arch", "bert", "--kv-heads", "2"], "as many KV heads as heads"),
    (["--type", "q3_k_s"], "--type"),
    (["--seed", "abc"], "--seed"),
    (["--seed", "18446744073709551616"], "--seed"),
    (["--template", "nope"], "--template"),
    (["--frobnicate", "1"], "unknown flag"),
    (["-x"], "unknown flag"),
    (["stray"], "unexpected argument"),
    (["--layers"], "needs a value"),
    (["--vocab", "/nonexistent/v.gguf"], "no such file"),
    (["--vocab", str(SPM), "--template", "vocab"], "no tokenizer.chat_template"),
]


@pytest.mark.parametrize("args,message", BAD_FLAGS, ids=[" ".join(a) or "no-o" for a, _ in BAD_FLAGS])
def test_bad_flags_exit_2_with_message(tmp_path, args, message):
    out = tmp_path / "m.gguf"
    r = mkmodel(*(["-o", str(out), *args] if args else []))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_exit_1_and_nothing_left(tmp_path):
    r = mkmodel("-o", tmp_path / "missing" / "m.gguf", "--vocab", SPM)
    assert r.returncode == 1
    assert "No such file or directory" in r.stderr
    r = mkmodel("-o", tmp_path, "--vocab", SPM)
    assert r.returncode == 1
    assert "directory" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_not_a_gguf_vocab_exit_1_and_old_file_kept(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"previous contents")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    r = mkmodel("-o", out, "--vocab", bogus)
    assert r.returncode == 1
    assert out.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bogus.gguf", "m.gguf"]


def test_existing_output_replaced(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    build(out, "--vocab", SPM)
    assert out.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


# ---- quantized weights (--type q8_0 ...) -----------------------------------------

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
LLAMA_FTYPE = {"q8_0": 7, "q4_k_m": 15, "q4_0": 2}


@pytest.mark.parametrize("qtype", sorted(LLAMA_FTYPE))
def test_quantized_layout_and_same_bytes(tmp_path, qtype):
    out, again = tmp_path / "m.gguf", tmp_path / "again.gguf"
    r = build(out, "--vocab", SPM, "--layers", 2, "--embd", 256, "--ff", 512, "--type", qtype)
    assert f", {qtype}, " in r.stderr  # the summary names the type written
    kv, t = tensor_map(out)
    assert kv["general.file_type"] == LLAMA_FTYPE[qtype]
    assert t["output_norm.weight"][1] == GGML_F32  # norms stay f32
    assert t["blk.0.attn_norm.weight"][1] == GGML_F32
    quantized = {name for name, (_, ty) in t.items() if ty not in (GGML_F32, GGML_F16)}
    assert {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output.weight"} <= quantized
    if qtype == "q8_0":
        assert t["blk.1.ffn_up.weight"][1] == GGML_Q8_0
    # the f16 model and the quantizer's output were temp files: only OUT is left
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    build(again, "--vocab", SPM, "--layers", 2, "--embd", 256, "--ff", 512, "--type", qtype)
    assert again.read_bytes() == out.read_bytes()


def test_quantized_served_with_its_cache(tmp_path):
    out = tmp_path / "m.gguf"
    build(out, "--layers", 2, "--embd", 256, "--ff", 512, "--type", "q8_0")
    cache = tmp_path / "kv"
    with Server(out, "-np", "1", "--kv-cache-dir", cache, "--kv-cache-min-tokens", "16") as s:
        first = s.chat(CHAT, max_tokens=12)
        assert first["usage"]["completion_tokens"] >= 6
        assert s.stop() == 0
    with Server(out, "-np", "1", "--kv-cache-dir", cache, "--kv-cache-min-tokens", "16") as s:  # a restart: the prompt from disk
        r = s.chat(CHAT + [{"role": "assistant", "content": text(first)},
                           {"role": "user", "content": "And the harbor?"}], max_tokens=12)
        assert r["usage"]["completion_tokens"] >= 6
        assert r["cache_source"] == "disk" and r["timings"]["cache_n"] > 0, r
        assert s.stop() == 0


def test_quantize_unwritable_output_leaves_nothing(tmp_path):
    r = mkmodel("-o", tmp_path / "missing" / "m.gguf", "--vocab", SPM, "--type", "q8_0")
    assert r.returncode == 1
    assert "No such file or directory" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ---- qwen3, gemma4, lfm2 ------------------------------------------------------

def tensor_map(path):
    kv, tensors, _, _ = read_gguf(path)
    return kv, {name: (ne, ty) for name, ne, ty in tensors}


def test_qwen3_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "qwen3", "--layers", 3, "--embd", 64, "--heads", 4, "--kv-heads", 2,
              "--ff", 96)
    assert "ggml-vocab-qwen2.gguf" in r.stderr  # qwen3's default vocab
    kv, t = tensor_map(out)
    assert kv["general.architecture"] == "qwen3"
    assert kv["qwen3.block_count"] == 3 and kv["qwen3.attention.head_count_kv"] == 2
    assert kv["qwen3.attention.key_length"] == 16 and kv["qwen3.rope.dimension_count"] == 16
    assert all(k.startswith(("general.", "qwen3.", "tokenizer.")) for k in kv)
    assert len(kv["tokenizer.ggml.tokens"]) == 151936
    assert "output.weight" not in t  # tied, as the small Qwen3 models are
    assert len(t) == 2 + 11 * 3
    assert t["blk.2.attn_q_norm.weight"] == ((16,), 0)  # per head, F32
    assert t["blk.2.attn_k_norm.weight"] == ((16,), 0)
    assert t["blk.2.attn_k.weight"][0] == (64, 32)
    assert "blk.0.post_attention_norm.weight" not in t


def test_bert_layout_and_rerank_heads(tmp_path):
    out = tmp_path / "b.gguf"
    r = build(out, "--arch", "bert", "--layers", 2, "--embd", 64, "--heads", 4, "--ctx-train", 512)
    assert "ggml-vocab-bert-bge.gguf" in r.stderr  # bge-small's WordPiece vocab
    kv, t = tensor_map(out)
    assert kv["general.architecture"] == "bert" and kv["bert.attention.causal"] is False
    assert kv["bert.pooling_type"] == 2  # CLS, as bge's
    assert kv["bert.attention.head_count_kv"] == 4
    assert t["position_embd.weight"][0] == (64, 512)
    assert t["token_types.weight"][0] == (64, 2)
    assert t["blk.1.layer_output_norm.bias"] == ((64,), 0)
    assert not any(n.startswith("cls") for n in t)
    assert len(t) == 5 + 16 * 2
    out = tmp_path / "br.gguf"
    build(out, "--arch", "bert", "--rerank")
    kv, t = tensor_map(out)
    assert kv["bert.pooling_type"] == 4  # rank
    # one score: [64, 1], which GGUF stores as 1-D (trailing 1s are not dimensions)
    assert t["cls.weight"][0] == (64, 64) and t["cls.output.weight"][0] == (64,)
    assert t["cls.output.bias"][0] == (1,)
    out = tmp_path / "qr.gguf"
    build(out, "--arch", "qwen3", "--rerank")
    kv, t = tensor_map(out)
    assert kv["qwen3.pooling_type"] == 4 and kv["qwen3.classifier.output_labels"] == ["yes", "no"]
    assert "{query}" in kv["tokenizer.chat_template.rerank"] and "{document}" in kv["tokenizer.chat_template.rerank"]
    assert t["cls.output.weight"][0] == (64, 2)


def test_gemma4_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "gemma4", "--layers", 5, "--swa-window", 24, "--swa-pattern", 3)
    assert "ggml-vocab-gemma-4.gguf" in r.stderr
    kv, t = tensor_map(out)
    assert kv["general.architecture"] == "gemma4"
    # every 3rd layer global: the per-layer bool array llama.cpp reads
    assert kv["gemma4.attention.sliding_window_pattern"] == [True, True, False, True, True]
    assert kv["gemma4.attention.sliding_window"] == 24
    for key in ("attention.key_length", "attention.key_length_swa", "attention.value_length_swa",
                "rope.dimension_count", "rope.dimension_count_swa"):
        assert kv[f"gemma4.{key}"] == 16, key
    assert kv["gemma4.embedding_length_per_layer_input"] == 0
    assert kv["gemma4.attention.shared_kv_layers"] == 0
    assert len(kv["tokenizer.ggml.tokens"]) == 262144
    assert "output.weight" not in t
    assert t["rope_freqs.weight"] == ((8,), 0)  # the global layers' one shared tensor
    assert len(t) == 3 + 13 * 5
    for suffix in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm", "attn_v"):
        assert f"blk.4.{suffix}.weight" in t
    # all-SWA: no global layer, no rope_freqs (libllama rejects unused tensors)
    build(out, "--arch", "gemma4", "--swa-pattern", 0)
    kv, t = tensor_map(out)
    assert kv["gemma4.attention.sliding_window_pattern"] == [True, True]
    assert "rope_freqs.weight" not in t


def test_lfm2_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "lfm2", "--layers", 6, "--heads", 4, "--kv-heads", 2)
    assert "attention every 3" in r.stderr
    kv, t = tensor_map(out)
    assert kv["general.architecture"] == "lfm2"
    # a layer with 0 KV heads is a short-convolution layer
    assert kv["lfm2.attention.head_count_kv"] == [0, 0, 2, 0, 0, 2]
    assert kv["lfm2.shortconv.l_cache"] == 3
    assert "token_embd_norm.weight" in t and "output_norm.weight" not in t
    assert "output.weight" not in t
    for il in (0, 1, 3, 4):
        assert t[f"blk.{il}.shortconv.conv.weight"] == ((3, 64), 0)
        assert t[f"blk.{il}.shortconv.in_proj.weight"][0] == (64, 192)
        assert t[f"blk.{il}.shortconv.out_proj.weight"][0] == (64, 64)
        assert f"blk.{il}.attn_q.weight" not in t
    for il in (2, 5):
        assert t[f"blk.{il}.attn_q_norm.weight"] == ((16,), 0)
        assert t[f"blk.{il}.attn_k.weight"][0] == (64, 32)
        assert f"blk.{il}.shortconv.conv.weight" not in t
    assert len(t) == 2 + 8 * 4 + 11 * 2
    build(out, "--arch", "lfm2", "--layers", 4, "--attn-pattern", 2)
    kv, _ = tensor_map(out)
    assert kv["lfm2.attention.head_count_kv"] == [0, 2, 0, 2]


def test_qwen35_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "qwen35", "--layers", 8, "--heads", 4, "--kv-heads", 2)
    assert "ggml-vocab-qwen35.gguf" in r.stderr and "attention every 4" in r.stderr
    kv, t = tensor_map(out)
    assert kv["general.architecture"] == "qwen35"
    assert all(k.startswith(("general.", "qwen35.", "tokenizer.")) for k in kv)
    # what libllama v0.4.0 requires of qwen35 (src/models/qwen35.cpp)
    assert kv["qwen35.full_attention_interval"] == 4
    assert kv["qwen35.ssm.conv_kernel"] == 4 and kv["qwen35.ssm.state_size"] == 16
    assert kv["qwen35.ssm.group_count"] == 2 and kv["qwen35.ssm.time_step_rank"] == 4
    assert kv["qwen35.ssm.inner_size"] == 64
    assert len(kv["qwen35.rope.dimension_sections"]) == 4
    assert sum(kv["qwen35.rope.dimension_sections"]) == 8  # the rotated half of a 16-wide head
    assert "output.weight" not in t  # tied
    for il in (3, 7):  # gated attention: q and its gate in one projection
        assert t[f"blk.{il}.attn_q.weight"][0] == (64, 128)
        assert t[f"blk.{il}.attn_k.weight"][0] == (64, 32)
        assert t[f"blk.{il}.attn_q_norm.weight"] == ((16,), 0)
        assert f"blk.{il}.ssm_a" not in t
    for il in (0, 1, 2, 4, 5, 6):  # gated delta-net: q, k (2 heads), v (4 heads)
        assert t[f"blk.{il}.attn_qkv.weight"][0] == (64, 2 * 32 + 64)
        assert t[f"blk.{il}.ssm_conv1d.weight"] == ((4, 128), 0)
        assert t[f"blk.{il}.ssm_a"] == ((4,), 0) and t[f"blk.{il}.ssm_dt.bias"] == ((4,), 0)
        assert t[f"blk.{il}.ssm_out.weight"][0] == (64, 64)
        assert f"blk.{il}.attn_q.weight" not in t
    for il in range(8):
        assert f"blk.{il}.post_attention_norm.weight" in t and f"blk.{il}.ffn_norm.weight" not in t
    assert len(t) == 2 + 11 * 2 + 14 * 6
    build(out, "--arch", "qwen35", "--layers", 4, "--attn-pattern", 2)
    kv, t = tensor_map(out)
    assert kv["qwen35.full_attention_interval"] == 2
    assert "blk.1.attn_q.weight" in t and "blk.0.attn_qkv.weight" in t


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_family_template_embedded(tmp_path, arch):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", arch)
    assert f"template {FAMILY[arch]}" in r.stderr
    kv, _, _, _ = read_gguf(out)
    assert kv["tokenizer.chat_template"] == (TEMPLATES / FAMILY[arch]).read_text()
    # gemma4's template is Jinja only: mkmodel says what --no-jinja needs
    assert ("--no-jinja needs --chat-template" in r.stderr) == (arch == "gemma4")


def test_family_template_missing_falls_back_to_the_vocab_one(tmp_path):
    vdir = tmp_path / "vocabs"  # a vocab dir without templates/
    vdir.mkdir()
    (vdir / "ggml-vocab-qwen2.gguf").symlink_to(VOCAB_DIR / "ggml-vocab-qwen2.gguf")
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "qwen3", env={"THAW_VOCAB_DIR": str(vdir)})
    assert "templates/Qwen-Qwen3-0.6B.jinja not found" in r.stderr
    kv, _, _, _ = read_gguf(out)
    vkv, _, _, _ = read_gguf(VOCAB_DIR / "ggml-vocab-qwen2.gguf")
    assert kv["tokenizer.chat_template"] == vkv["tokenizer.chat_template"]


def test_template_vocab_keeps_the_vocab_one_for_new_archs(tmp_path):
    out = tmp_path / "m.gguf"
    build(out, "--arch", "gemma4", "--template", "vocab")
    kv, _, _, _ = read_gguf(out)
    vkv, _, _, _ = read_gguf(VOCAB_DIR / "ggml-vocab-gemma-4.gguf")
    assert kv["tokenizer.chat_template"] == vkv["tokenizer.chat_template"]


@pytest.mark.parametrize("arch", ["llama", "gemma4"])
def test_chat_template_file_overrides(tmp_path, arch):
    tmpl = tmp_path / "t.jinja"
    text = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}" \
           "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}\n"
    tmpl.write_text(text)
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", arch, "--chat-template-file", tmpl)
    assert f"template {tmpl}" in r.stderr
    kv, _, _, _ = read_gguf(out)
    assert kv["tokenizer.chat_template"] == text  # byte for byte, not the vocab's or the family's
    assert "needs --chat-template" not in r.stderr  # a chatml template: the C API renders it too


def test_chat_template_file_empty_or_nul_is_a_usage_error(tmp_path):
    for name, data in (("empty.jinja", b""), ("nul.jinja", b"{{ a }}\0{{ b }}")):
        f = tmp_path / name
        f.write_bytes(data)
        r = mkmodel("-o", tmp_path / "m.gguf", "--chat-template-file", f)
        assert r.returncode == 2, r.stderr
        assert "empty, over 1 MiB or holding a NUL byte" in r.stderr
    assert not (tmp_path / "m.gguf").exists()


# ---- served by thaw -------------------------------------------------------------

@pytest.fixture(scope="module")
def new_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("new_models")
    out = {}
    for arch in NEW_ARCHS:
        out[arch] = str(d / f"{arch}.gguf")
        build(out[arch], "--arch", arch, "--seed", 5)
    return out


CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about rivers, stones and the light on winter mornings."}]


def text(r):
    """The reply; Qwen3.5's template opens a <think> block, so its
    gibberish is all reasoning."""
    m = r["choices"][0]["message"]
    return m.get("content") or m.get("reasoning_content") or ""


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_served_and_greedy_deterministic(new_models, arch):
    replies = []
    for _ in range(2):  # two server processes: the same greedy reply
        with Server(new_models[arch], "-np", "1", "--cache-ram", "0") as s:
            r = s.chat(CHAT, max_tokens=16)
            assert r["usage"]["completion_tokens"] >= 8  # random weights: rarely an end token
            replies.append(text(r))
            # the model line names the architecture llama.cpp loaded
            line = next(l for l in s.lines if f"model {arch}.gguf: " in l)
            assert f"model {arch}.gguf: {arch} " in line, line
            assert ("(sliding window)" in line) == (arch == "gemma4"), line
            again = s.chat(CHAT, max_tokens=16)  # and again from the same server
            assert text(again) == replies[-1]
            assert s.stop() == 0
    assert replies[0] == replies[1]
    assert len(set(replies[0].split())) >= 4, replies[0]  # wanders, not one repeated token


# ---- gpt-oss ----------------------------------------------------------------------

def test_gptoss_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "gpt-oss", "--layers", 4, "--moe-experts", 6, "--ff", 96)
    assert "swa 128 every 2, moe" in r.stderr
    kv, tensors, _, _ = read_gguf(out)
    assert kv["general.architecture"] == "gpt-oss"
    # gpt-oss's window and alternation unless told otherwise
    assert kv["gpt-oss.attention.sliding_window"] == 128
    assert kv["gpt-oss.attention.sliding_window_pattern"] == 2
    assert kv["gpt-oss.expert_count"] == 6
    assert kv["gpt-oss.expert_used_count"] == 2
    assert kv["gpt-oss.expert_feed_forward_length"] == 96
    t = {name: ne for name, ne, _ in tensors}
    assert t["blk.3.attn_sinks.weight"] == (4,)  # one sink per head
    assert t["blk.0.ffn_gate_exps.weight"] == (64, 96, 6)
    assert t["blk.0.ffn_down_exps.weight"] == (96, 64, 6)
    assert t["blk.0.ffn_down_exps.bias"] == (64, 6)
    assert t["blk.1.ffn_gate_inp.weight"] == (64, 6)
    assert "output.weight" in t  # not tied
    assert not any(n.endswith("ffn_norm.weight") for n in t)  # post_attention_norm leads the MoE
    assert len(tensors) == 3 + 4 * 16
    build(out, "--arch", "gpt-oss", "--swa-window", 64, "--swa-pattern", 3)
    kv, _, _, _ = read_gguf(out)
    assert kv["gpt-oss.attention.sliding_window"] == 64
    assert kv["gpt-oss.attention.sliding_window_pattern"] == 3


def test_gptoss_served_and_greedy_deterministic(tmp_path):
    model = tmp_path / "gpt-oss.gguf"
    build(model, "--arch", "gpt-oss", "--layers", 2, "--seed", 5)
    replies = []
    for _ in range(2):
        with Server(str(model), "-np", "1", "--cache-ram", "0") as s:
            r = s.chat(CHAT, max_tokens=16)
            assert r["usage"]["completion_tokens"] >= 8
            replies.append(r["choices"][0]["message"]["content"])
            line = next(l for l in s.lines if "model gpt-oss.gguf: " in l)
            assert "model gpt-oss.gguf: gpt-oss " in line, line
            assert "(sliding window)" in line, line
            assert s.stop() == 0
    assert replies[0] == replies[1]
    assert len(set(replies[0].split())) >= 4, replies[0]


# ---- deepseek2 (MLA) -----------------------------------------------------------------

def test_deepseek2_layout(tmp_path):
    out = tmp_path / "m.gguf"
    r = build(out, "--arch", "deepseek2", "--layers", 3, "--moe-experts", 6, "--ff", 96)
    assert "mla 64+32, moe 6+1 shared" in r.stderr and "ggml-vocab-deepseek-llm.gguf" in r.stderr
    kv, tensors, _, _ = read_gguf(out)
    assert kv["general.architecture"] == "deepseek2"
    assert all(k.startswith(("general.", "deepseek2.", "tokenizer.")) for k in kv)
    # what makes libllama's hparams.is_mla() true: the per-head MLA sizes;
    # the cached head is the latent (64) plus the rope dims (32), one KV head
    assert kv["deepseek2.attention.key_length_mla"] == 64
    assert kv["deepseek2.attention.value_length_mla"] == 32
    assert kv["deepseek2.attention.key_length"] == 96
    assert kv["deepseek2.attention.value_length"] == 64
    assert kv["deepseek2.attention.kv_lora_rank"] == 64
    assert kv["deepseek2.attention.q_lora_rank"] == 0
    assert kv["deepseek2.attention.head_count_kv"] == 1
    assert kv["deepseek2.rope.dimension_count"] == 32
    assert kv["deepseek2.leading_dense_block_count"] == 1
    assert kv["deepseek2.expert_count"] == 6 and kv["deepseek2.expert_used_count"] == 2
    assert kv["deepseek2.expert_shared_count"] == 1
    assert kv["deepseek2.expert_feed_forward_length"] == 96
    t = {name: ne for name, ne, _ in tensors}
    assert t["blk.0.attn_q.weight"] == (64, 4 * 64)
    assert t["blk.0.attn_kv_a_mqa.weight"] == (64, 96)
    assert t["blk.0.attn_k_b.weight"] == (32, 64, 4)
    assert t["blk.0.attn_v_b.weight"] == (64, 32, 4)
    assert t["blk.0.attn_output.weight"] == (4 * 32, 64)
    assert t["blk.0.ffn_gate.weight"] == (64, 96)  # the leading dense layer
    assert "blk.0.ffn_gate_inp.weight" not in t
    assert t["blk.1.ffn_gate_exps.weight"] == (64, 96, 6)
    assert t["blk.2.ffn_down_shexp.weight"] == (96, 64)
    assert "blk.1.ffn_gate.weight" not in t
    assert "output.weight" in t
    assert len(tensors) == 3 + 11 + 2 * 15


def test_deepseek2_served_and_greedy_deterministic(tmp_path):
    model = tmp_path / "deepseek2.gguf"
    build(model, "--arch", "deepseek2", "--layers", 3, "--seed", 5)
    replies = []
    for _ in range(2):
        with Server(str(model), "-np", "1", "--cache-ram", "0") as s:
            r = s.chat(CHAT, max_tokens=16)
            assert r["usage"]["completion_tokens"] >= 8
            replies.append(r["choices"][0]["message"]["content"])
            line = next(l for l in s.lines if "model deepseek2.gguf: " in l)
            assert "model deepseek2.gguf: deepseek2 " in line, line
            assert s.chat(CHAT, max_tokens=16)["choices"][0]["message"]["content"] == replies[-1]
            assert s.stop() == 0
    assert replies[0] == replies[1]
    assert len(set(replies[0].split())) >= 4, replies[0]
