"""End-to-end tests of `thaw mkmodel`, run against the real binary.

THAW_BIN names the binary (default: <repo>/build/thaw). The vocab GGUFs come
from <repo>/.deps/llama.cpp/models (scripts/setup.sh fetches them). Models
here are tiny (llama-spm vocab, 64 wide) so the whole file runs in seconds.
"""
import os
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THAW = Path(os.environ.get("THAW_BIN", REPO / "build" / "thaw"))
VOCAB_DIR = REPO / ".deps" / "llama.cpp" / "models"
SPM = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"


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
                 "--swa-window", "--ctx-train", "--seed", "--type", "-o"):
        assert flag in r.stdout


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
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
    (["--arch", "gpt2"], "--arch"),
    (["--layers", "0"], "--layers"),
    (["--layers", "513"], "--layers"),
    (["--layers", "2x"], "--layers"),
    (["--layers", "-1"], "--layers"),
    (["--embd", "100", "--heads", "3"], "not a multiple of --heads"),
    (["--embd", "12", "--heads", "4"], "must be even"),
    (["--kv-heads", "3"], "must divide --heads"),
    (["--swa-window", "16"], "gemma3 only"),
    (["--arch", "gemma3", "--swa-window", "9000"], "below --ctx-train"),
    (["--type", "q8_0"], "--type"),
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
