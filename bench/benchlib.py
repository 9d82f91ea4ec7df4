"""Shared by the bench/ scripts: the benchmark-shaped model and table printing.
The server harness itself is the end-to-end tests' (tests/e2e/harness.py)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from harness import REPO, THAW, Server, mkmodel  # noqa: E402,F401

# 12 layers x 1024 wide, 16 heads, GQA 4, llama3 vocab: ~400M params, shaped
# like a small real model so prefill/decode/state sizes are honest.
BENCH_SHAPE = ["--layers", "12", "--embd", "1024", "--heads", "16", "--kv-heads", "4", "--ff", "2816"]
MODEL_DIR = os.path.join(REPO, ".deps", "bench-models")


def bench_model(arch="llama", extra=()):
    """Generates (once; cached under .deps/) and returns a benchmark model."""
    os.makedirs(MODEL_DIR, exist_ok=True)
    name = f"{arch}-12x1024{''.join(extra).replace('-', '_')}.gguf"
    path = os.path.join(MODEL_DIR, name)
    if not os.path.exists(path):
        print(f"generating {name} ...", file=sys.stderr, flush=True)
        mkmodel(path, "--arch", arch, *BENCH_SHAPE, *extra)
    return path


def words(n, seed=0):
    """Roughly n tokens of varied English-ish text."""
    vocab = ("river stone light garden window paper engine market silver winter "
             "question number village morning harbor letter forest season").split()
    return " ".join(vocab[(i * 7 + seed * 13 + i // 5) % len(vocab)] for i in range(n))


def table(headers, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def tmpdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)
