"""`thaw cache ls|stats|verify|gc|rm` on a directory a real server filled."""
import glob
import os
import subprocess
import time

from conftest import THAW
from test_kv_cache import chat, conversation, kv_flags


def cli(*args):
    return subprocess.run([THAW, "cache", *args], capture_output=True, text=True, timeout=60)


def fill(serve, d, n=3):
    s = serve("llama", "-np", "1", *kv_flags(d, "--kv-cache-min-tokens", "16"))
    for i in range(n):
        chat(s, conversation(i, 200), 4)
    s.stop()
    return sorted(glob.glob(str(d / "*.idx")))


def test_ls_stats_verify_gc_rm(serve, tmp_path):
    idx = fill(serve, tmp_path)
    assert len(idx) == 3
    keys = [os.path.basename(f)[:-4] for f in idx]

    p = cli("ls", str(tmp_path))
    assert p.returncode == 0, p.stderr
    for k in keys:
        assert k[:12] in p.stdout
    p = cli("stats", str(tmp_path))
    assert p.returncode == 0 and "3" in p.stdout

    # damage one entry: verify --dry-run reports it, verify removes it
    kv = idx[0][:-4] + ".kv"
    with open(kv, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    p = cli("verify", str(tmp_path), "--dry-run")
    assert p.returncode == 1 and keys[0][:12] in p.stdout + p.stderr
    assert os.path.exists(idx[0])
    p = cli("verify", str(tmp_path))
    assert p.returncode == 1
    assert not os.path.exists(idx[0]) and not os.path.exists(kv)
    assert cli("verify", str(tmp_path)).returncode == 0

    # gc by age: everything has been unused for more than 1 s by now
    time.sleep(2.2)
    p = cli("gc", str(tmp_path), "--ttl", "1")
    assert p.returncode == 0, p.stderr
    assert not glob.glob(str(tmp_path / "*.idx"))

    idx = fill(serve, tmp_path, 2)
    k = os.path.basename(idx[0])[:-4]
    assert cli("rm", str(tmp_path), k[:10]).returncode == 0
    assert not os.path.exists(idx[0]) and os.path.exists(idx[1])
    assert cli("rm", str(tmp_path), "ffff" * 16).returncode == 1
    assert cli("rm", str(tmp_path), "--all").returncode == 0
    assert not glob.glob(str(tmp_path / "*.idx"))


def test_usage_errors():
    assert cli().returncode == 2
    assert cli("frobnicate", "/tmp").returncode == 2
    assert cli("ls", "/nonexistent/dir").returncode == 2
