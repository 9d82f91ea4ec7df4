"""pytest fixtures for the end-to-end tests (the harness is in harness.py)."""
import pytest

from harness import S3Store, Server, mkmodel


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {
        "llama": mkmodel(d / "llama.gguf", "--arch", "llama", "--seed", "1"),
        "gemma3": mkmodel(d / "gemma3.gguf", "--arch", "gemma3", "--seed", "2",
                          "--swa-window", "32"),
    }


@pytest.fixture
def serve(models):
    """serve(arch_or_path, *args) -> Server, stopped after the test."""
    started = []

    def start(model="llama", *args, env=None, **kw):
        # every store whose blocks are cut from the KV cache (kvtap.h) is
        # also checked against a whole capture; a difference fails the test
        env = {"THAW_TEST_KVTAP_VERIFY": "1", **(env or {})}
        s = Server(models.get(model, model), *args, env=env, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
    # every store cut from the KV cache was checked against a capture
    # (THAW_TEST_KVTAP_VERIFY, src/base/testhooks.h): none may have differed
    for s in started:
        assert "cut from the KV cache differ" not in s.log(), s.log()


@pytest.fixture(scope="session")
def s3store(tmp_path_factory):
    """A real S3 store (Ceph RGW, scripts/s3store.sh) for the whole session,
    stopped at its end whatever happened."""
    store = S3Store(tmp_path_factory.mktemp("s3store"))
    try:
        yield store
    finally:
        store.stop()
