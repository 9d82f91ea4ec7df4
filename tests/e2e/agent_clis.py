"""The real coding-agent CLIs (installed by scripts/setup.sh into
.deps/agents), run offline against a thaw server, one turn a call:
Claude Code (`claude -p`, the Anthropic Messages API) and Codex (`codex
exec`, the Responses API). Used by test_anthropic.py, test_responses.py and
test_images.py."""
import json
import os
import subprocess

from harness import REPO

AGENTS = os.path.join(REPO, ".deps", "agents", "node_modules")
CLAUDE = os.path.join(AGENTS, "@anthropic-ai", "claude-code", "bin", "claude.exe")
CODEX = os.path.join(AGENTS, "@openai", "codex", "bin", "codex.js")


def claude(home, cwd, url, *args, stdin=None):
    """One offline `claude -p` turn; its result (--output-format json, or
    the last line of stream-json when args ask for it). stdin: what to write
    to its standard input (stream-json messages with --input-format)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(HOME=str(home), ANTHROPIC_BASE_URL=url, ANTHROPIC_AUTH_TOKEN="k", ANTHROPIC_MODEL="thaw",
               ANTHROPIC_SMALL_FAST_MODEL="thaw", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1",
               CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1", CLAUDE_CODE_MAX_OUTPUT_TOKENS="24",
               API_TIMEOUT_MS="600000")
    fmt = [] if "--output-format" in args else ["--output-format", "json"]
    p = subprocess.run([CLAUDE, "-p", *args, *fmt, "--max-turns", "1"], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=900)
    assert p.stdout.strip(), p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def claude_from_cache(result):
    """A `claude -p` result's share of prompt tokens read from cache, and its prompt tokens."""
    u = result["usage"]
    total = u["input_tokens"] + u.get("cache_read_input_tokens", 0) + u.get("cache_creation_input_tokens", 0)
    return u.get("cache_read_input_tokens", 0) / total, total


def codex(home, cwd, url, *args):
    """One offline `codex exec --json` turn: its turn.completed usage."""
    conf = home / ".codex"
    conf.mkdir(exist_ok=True)
    (conf / "config.toml").write_text(f'''model = "thaw"
model_provider = "thaw"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.thaw]
name = "thaw"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "THAW_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
''')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(conf), THAW_TEST_KEY="k")
    p = subprocess.run(["node", CODEX, "exec", *args, "--json", "--skip-git-repo-check"], cwd=cwd, env=env,
                       stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=900)
    evs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    done = [e for e in evs if e.get("type") == "turn.completed"]
    assert done, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return done[-1]["usage"]
