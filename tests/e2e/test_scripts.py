"""The repository's own scripts: they must report failure honestly."""
import os
import subprocess

from harness import REPO


def test_build_script_fails_when_the_build_fails(tmp_path):
    # a cmake that configures for real but whose build step fails, as a
    # compile error would: build.sh used to swallow that status (a stale
    # build/thaw then passed its existence check and the tests ran on it)
    real = subprocess.run(["bash", "-c", "command -v cmake"], capture_output=True, text=True).stdout.strip()
    fake = tmp_path / "cmake"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "--build" ]; then echo "error: boom" >&2; exit 3; fi\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    assert os.path.exists(os.path.join(REPO, "build", "thaw"))  # the stale binary the old check accepted
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "build.sh")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "build failed" in p.stderr and "boom" in p.stdout + p.stderr
