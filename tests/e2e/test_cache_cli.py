"""`thaw cache ls|stats|verify|gc|rm` on a directory a real server filled."""
import glob
import hashlib
import os
import subprocess
import time

from harness import THAW, chat, conversation, kv_flags


def cli(*args):
    return subprocess.run([THAW, "cache", *args], capture_output=True, text=True, timeout=60)


def fill(serve, d, n=3):
    # whole-state entries: one per turn (blocks: test_blocks.py)
    s = serve("llama", "-np", "1", *kv_flags(d, "--kv-cache-min-tokens", "16", "--kv-cache-block", "0"))
    for i in range(n):
        chat(s, conversation(i, 200), 4)
    s.stop()
    return sorted(glob.glob(str(d / "*.idx")))


def snapshot(d):
    """Everything a change to directory d would show (atime aside: reading
    moves it): per file inode, mode, size, mtime, ctime and content hash; the
    directory's own mode, mtime and ctime (a create or unlink moves them)."""
    st = os.stat(d)
    files = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        f = os.lstat(p)
        with open(p, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
        files[name] = (f.st_ino, f.st_mode, f.st_size, f.st_mtime_ns, f.st_ctime_ns, digest)
    return (st.st_mode, st.st_mtime_ns, st.st_ctime_ns), files


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

    # damage one entry, and leave what an interrupted run would (a *.tmp, an
    # orphan part): verify, plain or --dry-run, reports the entry and changes
    # nothing at all; only --fix removes
    kv = idx[0][:-4] + ".kv"
    with open(kv, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    tmp = tmp_path / (keys[1] + ".kv.tmp")
    tmp.write_bytes(b"interrupted")
    orphan = tmp_path / ("e" * 64 + ".ckpt")
    orphan.write_bytes(b"orphan")
    before = snapshot(tmp_path)
    for extra in ([], ["--dry-run"]):
        p = cli("verify", str(tmp_path), *extra)
        assert p.returncode == 1 and keys[0][:12] in p.stdout + p.stderr, p.stdout + p.stderr
        assert snapshot(tmp_path) == before, extra
    assert cli("verify", str(tmp_path), "--fix", "--dry-run").returncode == 2
    assert snapshot(tmp_path) == before
    p = cli("verify", str(tmp_path), "--fix")
    assert p.returncode == 1
    assert not os.path.exists(idx[0]) and not os.path.exists(kv)
    assert not tmp.exists() and not orphan.exists()
    assert os.path.exists(idx[1]) and os.path.exists(idx[2])
    assert cli("verify", str(tmp_path)).returncode == 0

    # an entry the open cannot read (a truncated part): ls and stats print
    # the rest and exit 1, change nothing; verify --repair (= --fix) clears it
    with open(idx[1][:-4] + ".kv", "r+b") as f:
        f.truncate(10)
    before = snapshot(tmp_path)
    p = cli("ls", str(tmp_path))
    assert p.returncode == 1 and keys[2][:12] in p.stdout and "unreadable" in p.stdout
    p = cli("stats", str(tmp_path))
    assert p.returncode == 1 and "unreadable        1" in p.stdout
    assert snapshot(tmp_path) == before
    assert cli("verify", str(tmp_path), "--repair").returncode == 1
    assert not os.path.exists(idx[1]) and os.path.exists(idx[2])
    assert cli("ls", str(tmp_path)).returncode == 0
    assert cli("stats", str(tmp_path)).returncode == 0

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
