"""llama-server's command line on thaw: every option llama.cpp's
common/arg.cpp gives the server is accepted or refused with one line that
says why (never "unknown flag"), --help explains each, and the implemented
ones change what they should. A new llama.cpp version with a new option
fails test_every_llama_server_option_is_accounted_for until thaw knows it."""
import os
import re
import subprocess

import pytest

import argcpp
from harness import REPO, THAW, mkmodel

ARG_CPP = os.environ.get("THAW_LLAMA_ARG_CPP", os.path.join(REPO, ".deps", "llama.cpp", "common", "arg.cpp"))
NO_MODEL = "thaw: no model given"


def value_for(opt, name, tmp):
    """A value llama-server would accept for this option."""
    special = {
        "-fa": "auto", "-ctk": "q8_0", "-ctv": "q8_0", "--rope-scaling": "yarn", "-sm": "layer", "-ngl": "all",
        "-ts": "3,1", "-fit": "on", "-fitt": "512", "-ot": "exps=CPU", "-dev": "none", "--numa": "distribute",
        "--override-kv": "tokenizer.ggml.add_bos_token=bool:false", "-lm": "mmap", "-lzm": "off",
        "--samplers": "top_k;temperature", "--sampler-seq": "kt", "-s": "42", "--log-colors": "off",
        "--chat-template": "chatml", "--chat-template-kwargs": "{}", "--reasoning-format": "none",
        "--host": "127.0.0.1", "-c": "4096", "--api-key": "k", "-a": "name", "-m": str(tmp / "absent.gguf"),
        "--log-file": str(tmp / "log.txt"), "--dry-sequence-breaker": "none", "--cors-origins": "http://a",
        "-l": "15+1", "--spec-draft-type-k": "q8_0", "--spec-draft-type-v": "q8_0", "--spec-draft-ngl": "0", "--spec-draft-device": "none", "--spec-draft-override-tensor": "exps=CPU",
        "--spec-type": "ngram-simple",
        "-C": "3", "-Cr": "0-1", "-Cb": "3", "-Crb": "0-1", "--pooling": "mean",
    }
    first = opt["args"][0]
    if first in special:
        return special[first]
    hint = opt["hint"] or ""
    if "FNAME" in hint or "FILE" in hint.upper() or first in ("--api-key-file", "--chat-template-file"):
        f = tmp / "value.txt"
        f.write_text("key1\n")
        return str(f)
    if opt["int"]:
        return "1"
    return "0.5" if re.search(r"(prob|thold|threshold|top-p|min-p|typical|temp|factor|beta|scale|base|"
                              r"penalty|multiplier|lr|ent|decay|target|range|exp|similarity|p-min|p-split)",
                              first + " " + " ".join(opt["args"])) else "1"


def run(*args):
    p = subprocess.run([THAW, "serve", *args], capture_output=True, text=True, timeout=60)
    return p.returncode, [l for l in p.stderr.splitlines() if not l.startswith("load_backend:")], p.stdout


def test_every_llama_server_option_is_accounted_for(tmp_path):
    opts = argcpp.server_options(ARG_CPP)
    assert len(opts) > 200, "the arg.cpp parser found too few options: has arg.cpp's shape changed?"
    helptext = run("--help")[2]
    problems, counts = [], {"accepted": 0, "refused": 0, "exits": 0}
    for opt in opts:
        for name in opt["args"] + opt["neg"]:
            if not re.search(r"(^|[\s,])%s([\s,]|$)" % re.escape(name), helptext, re.M):
                problems.append(f"{name}: not in thaw serve --help")
            value = [value_for(opt, name, tmp_path)] if opt["value"] and name not in opt["neg"] else []
            rc, err, out = run(name, *value)
            if name in ("-h", "--help", "--usage", "--version", "--list-devices"):
                ok = rc == 0 and out.strip()
                counts["exits"] += 1
            elif err and re.fullmatch(r"thaw: %s: .+" % re.escape(name), err[0]) and len(err) == 1:
                ok = rc == 2 and "unknown" not in err[0]
                counts["refused"] += 1
            elif name == "-m" or name == "--model":
                ok = rc != 0 and any("absent.gguf" in l for l in err)  # accepted: it tried to open the file
                counts["accepted"] += 1
            else:
                ok = rc == 2 and err and err[-1].startswith(NO_MODEL) and not any("unknown flag" in l for l in err)
                counts["accepted"] += 1
            if not ok:
                problems.append(f"{name} {' '.join(value)}: rc {rc}: {err}")
    print(counts)
    assert not problems, "\n".join(problems)


def test_a_refusal_is_one_line_naming_the_flag():
    rc, err, _ = run("--spm-infill")
    assert rc == 2 and err == ["thaw: --spm-infill: thaw has no /infill endpoint"]
    rc, err, _ = run("-hf", "org/model")
    assert rc == 2 and len(err) == 1 and err[0].startswith("thaw: -hf: thaw downloads nothing")
    rc, err, _ = run("--no-such-flag")
    assert rc == 2 and "unknown flag" in err[0]


def test_list_devices_and_version():
    rc, _, out = run("--list-devices")
    assert rc == 0 and out.startswith("Available devices:")
    rc, _, out = run("--version")
    assert rc == 0 and "llama.cpp" in out


# ---- flags that reach llama.cpp ---------------------------------------------------

@pytest.fixture(scope="module")
def q8model(tmp_path_factory):
    # head size 32 (embd 128 / 4 heads): q8_0's block of 32 divides it, so
    # -ctk/-ctv q8_0 can hold its K and V rows
    d = tmp_path_factory.mktemp("q8")
    return mkmodel(d / "q8.gguf", "--arch", "llama", "--seed", "5", "--embd", "128", "--heads", "4",
                   "--ctx-train", "1024")


def test_ctx_0_is_the_models_training_context(serve, q8model):
    s = serve(q8model, "-c", "0", "-np", "1")
    assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 1024
    s.stop()
    s = serve(q8model, "-c", "0", "-np", "2")  # split across the slots, like any -c
    assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 512


def test_mlock_and_no_mmap_reach_the_loader(serve):
    assert "loading the model: load mode none" in serve("llama", "--no-mmap").log()
    assert "loading the model: load mode mlock" in serve("llama", "--mlock").log()
    assert "loading the model: load mode mmap+mlock" in serve("llama", "--load-mode", "mmap+mlock").log()


def test_placement_flags_on_the_cpu_are_accepted_and_logged(serve):
    s = serve("llama", "-ngl", "999", "-sm", "row", "-ts", "1,1", "-mg", "1", "-cmoe", "-ncmoe", "2", "-ot",
              "ffn=CPU", "-nkvo", "--no-warmup", "-dev", "none", "--check-tensors", "--override-kv",
              "general.name=str:renamed")
    log = s.log()
    if "no GPU device" in log:
        line = next(l for l in log.splitlines() if "no GPU device" in l)
        for f in ("-ngl", "-sm", "-ts", "-mg", "-dev", "-nkvo", "-cmoe", "-ncmoe"):
            assert f in line, line
    assert "--no-warmup: no effect on thaw" in log
    assert "checking tensors" in log
    assert s.chat([{"role": "user", "content": "hi"}])["usage"]["completion_tokens"] > 0


def test_unknown_buffer_type_or_device_is_a_clear_error(models):
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "-ot", "exps=NOPE"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "no buffer type 'NOPE'" in p.stderr, p.stderr
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "-dev", "NOPE0"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "no device 'NOPE0'" in p.stderr, p.stderr


def test_the_seed_users_command_line_starts_and_serves(serve, q8model, tmp_path):
    s = serve(q8model, "-ngl", "999", "-fa", "on", "-c", "8192", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0",
              "--jinja", "--temp", "0.7", "--top-k", "40", "--kv-cache-dir", str(tmp_path / "kv"))
    r = content(s)  # no temperature: --temp 0.7, --top-k 40
    assert r["choices"][0]["finish_reason"] in ("length", "stop") and r["usage"]["completion_tokens"] > 0
    assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 4096


# ---- sampling defaults -------------------------------------------------------------

CONV = [{"role": "user", "content": "Tell me about rivers and stones and light."}]


def content(s, **kw):
    body = {"messages": CONV, "max_tokens": 24, **kw}
    r = s.post("/v1/chat/completions", {k: v for k, v in body.items() if v is not None})
    assert r.status_code == 200, r.text
    return r.json()


def test_sampling_defaults_apply_to_requests_that_do_not_set_them(serve):
    greedy = content(serve("llama"), temperature=0)["choices"][0]["message"]["content"]
    # --temp 0: a request without a temperature is greedy
    s = serve("llama", "--temp", "0")
    assert content(s)["choices"][0]["message"]["content"] == greedy
    # a request's own temperature wins over --temp; top-k 1 keeps only the
    # most likely token, so any temperature samples the greedy reply
    s = serve("llama", "--temp", "0", "--top-k", "1")
    assert content(s, temperature=1.5)["choices"][0]["message"]["content"] == greedy
    s = serve("llama", "--top-k", "1", "--temp", "2")
    assert content(s)["choices"][0]["message"]["content"] == greedy
    # --samplers without top_k: the same --top-k 1 no longer applies
    # (nothing asserted about the text: only that it is served)
    s = serve("llama", "--top-k", "1", "--samplers", "temperature", "-s", "7")
    a = content(s)["choices"][0]["message"]["content"]
    assert a == content(s)["choices"][0]["message"]["content"]  # -s: a fixed seed for requests without one


def test_ignore_eos_generates_max_tokens(serve):
    s = serve("llama", "--ignore-eos", "--temp", "0")
    r = content(s, max_tokens=40)
    assert r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length"


def test_penalties_dry_mirostat_and_friends_serve(serve):
    # every stage of the chain builds and samples (values llama-server accepts)
    s = serve("llama", "--repeat-penalty", "1.3", "--repeat-last-n", "-1", "--presence-penalty", "0.5",
              "--frequency-penalty", "0.5", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "\\n",
              "--xtc-probability", "0.5", "--typical", "0.9", "--top-nsigma", "1.5", "--dynatemp-range", "0.5",
              "--samplers", "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature;adaptive_p",
              "--adaptive-target", "0.5")
    assert content(s)["usage"]["completion_tokens"] > 0
    s = serve("llama", "--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "3")
    assert content(s)["usage"]["completion_tokens"] > 0


def test_a_requests_own_sampling_fields_act_as_the_flags_do(serve):
    # llama-server's per-request names for the penalties, DRY, typical,
    # mirostat...: a request that sends them samples what a server started
    # with the same flags samples (same seed, same machine); before, the
    # penalties were a 400 and the rest were ignored
    flags = {"--repeat-penalty": ("repeat_penalty", 1.6), "--repeat-last-n": ("repeat_last_n", 32),
             "--presence-penalty": ("presence_penalty", 1.2), "--frequency-penalty": ("frequency_penalty", 0.7),
             "--dry-multiplier": ("dry_multiplier", 0.8), "--typical": ("typical_p", 0.9)}
    args = [x for k, (_, v) in flags.items() for x in (k, str(v))]
    fields = {name: v for name, v in flags.values()}
    by_flags = serve("llama", *args)
    plain = serve("llama")
    for seed in (3, 11):
        want = content(by_flags, temperature=0.9, seed=seed)["choices"][0]["message"]["content"]
        got = content(plain, temperature=0.9, seed=seed, **fields)["choices"][0]["message"]["content"]
        assert got == want, (seed, got, want)
    m = content(serve("llama", "--mirostat", "2", "--mirostat-ent", "3"), temperature=0.9, seed=5)
    assert content(plain, temperature=0.9, seed=5, mirostat=2, mirostat_tau=3)["choices"] == m["choices"]
    for bad in ({"mirostat": 3}, {"typical_p": 2}, {"repeat_penalty": "high"}, {"ignore_eos": 1},
                {"repeat_last_n": 1.5}, {"samplers": ["top_k"]}, {"dry_sequence_breakers": ["\\n"]}):
        r = plain.post("/v1/chat/completions", {"messages": CONV, "max_tokens": 4, **bad})
        assert r.status_code == 400 and next(iter(bad)) in r.json()["error"]["message"], (bad, r.text)
    r = content(plain, temperature=0, ignore_eos=True, max_tokens=40)
    assert r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length"


# ---- KV cache types ------------------------------------------------------------------

def reply(r):
    return r["choices"][0]["message"]["content"]


@pytest.mark.parametrize("store", [[], ["--no-kv-tap"], ["--kv-cache-block", "0"]],
                         ids=["blocks-cut-from-the-cache", "blocks-from-whole-captures", "whole-states"])
def test_q8_0_conversation_restores_exactly_and_types_are_bound_into_the_keys(serve, q8model, tmp_path, store):
    conv = [{"role": "system", "content": "q8 persona. " + " ".join(["river stone light garden"] * 60)},
            {"role": "user", "content": "What about the river?"}]
    q8 = ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]

    def greedy(s, m):
        r = s.post("/v1/chat/completions", {"messages": m, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()

    ref = serve(q8model, "-np", "1", "-c", "4096", "--cache-ram", "0", *q8)  # resident slot, no store
    r1 = greedy(ref, conv)
    turn2 = conv + [{"role": "assistant", "content": reply(r1)}, {"role": "user", "content": "And the stone?"}]
    ref2 = greedy(ref, turn2)
    ref.stop()

    flags = ["-np", "2", "-c", "4096", "--cache-ram", "0", "--kv-cache-dir", str(tmp_path / "kv"),
             "--kv-cache-min-tokens", "16", *store]
    s = serve(q8model, *flags, *q8)
    assert reply(greedy(s, conv)) == reply(r1)
    assert s.stop() == 0
    s = serve(q8model, *flags, *q8)
    got = greedy(s, turn2)
    assert reply(got) == reply(ref2), s.log()
    assert got["cache_source"] in ("disk", "blocks") and got["timings"]["cache_n"] > 0, got["timings"]
    assert s.stop() == 0
    # f16 KV: the q8_0 entries are another context's state and never read
    s = serve(q8model, *flags)
    got = greedy(s, turn2)
    assert got["cache_source"] == "none" and got["timings"]["cache_n"] == 0, got["timings"]


def test_logit_bias_applies_to_every_request(serve):
    s = serve("llama")
    tok = s.post("/tokenize", {"content": "river", "add_special": False}).json()["tokens"][0]
    piece = s.post("/detokenize", {"tokens": [tok]}).json()["content"].strip()
    s.stop()
    # +1000 outweighs any logit random weights give: every token is that one
    s = serve("llama", "-l", f"{tok}+1000", "--temp", "0")
    r = content(s, max_tokens=4)
    assert r["usage"]["completion_tokens"] == 4 and reply(r).count(piece) == 4, reply(r)
    # and -inf bans it, even when it is the only token left
    s = serve("llama", "-l", f"{tok}+1000", "-l", f"{tok}-inf", "--temp", "0")
    assert piece not in reply(content(s, max_tokens=4))


def test_draft_placement_flags_reach_the_draft(serve, models):
    # the target as its own draft: every draft is accepted whatever the weights
    s = serve("llama", "-md", models["llama"], "--draft-p-min", "0", "-ngld", "0", "-devd", "none", "-cmoed",
              "-otd", "ffn=CPU", "--spec-draft-n-max", "8", "-ctkd", "f32", "-ctvd", "f32", "-td", "1")
    log = s.log()
    if "no GPU device" in log:
        line = next(l for l in log.splitlines() if "no GPU device" in l)
        assert "-ngld" in line and "-devd" in line and "-cmoed" in line, line
    r = content(s, temperature=0, max_tokens=32)
    assert r["timings"]["draft_n"] > 0 and r["timings"]["draft_n_accepted"] >= 0.95 * r["timings"]["draft_n"]
    s.stop()
    p = subprocess.run([THAW, "serve", "-m", models["llama"], "-md", models["llama"], "-otd", "x=NOPE"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "no buffer type 'NOPE'" in p.stderr, p.stderr
