"""The options llama-server takes, read from llama.cpp's common/arg.cpp.

Every `add_opt(common_arg(...))` is one option: its names (and negated
names), whether it takes a value, and the examples it belongs to. An option
is llama-server's when its examples include LLAMA_EXAMPLE_SERVER or
LLAMA_EXAMPLE_COMMON (every example inherits those) and its excludes do not
name the server, exactly as common_params_parser_init's add_opt filters
them. Preset-only options (set_preset_only) are not on the command line."""
import re

ARG_CPP_DEFAULT = "common/arg.cpp"


def _skip_literal(src, i):
    q = src[i]
    i += 1
    while src[i] != q:
        i += 2 if src[i] == "\\" else 1
    return i + 1


def _close(src, i, open_ch, close_ch):
    """Index just past the bracket that closes the one at src[i]."""
    depth = 0
    while i < len(src):
        c = src[i]
        if c in "\"'":
            i = _skip_literal(src, i)
            continue
        if src.startswith("//", i):
            i = src.index("\n", i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets in arg.cpp")


def _strings(s):
    return re.findall(r'"((?:[^"\\]|\\.)*)"', s)


def server_options(path):
    """[{"args": [...], "neg": [...], "value": bool, "hint": str|None, "int": bool}], one per option
    ("int": its handler takes an int)."""
    src = open(path, encoding="utf-8").read()
    out, seen = [], set()
    for m in re.finditer(r"add_opt\(common_arg\(", src):
        call = src[m.start() + len("add_opt"):_close(src, m.start() + len("add_opt"), "(", ")")]
        ctor_end = _close(call, len("("), "(", ")")
        ctor, chain = call[len("("):ctor_end], call[ctor_end:]
        b = ctor.index("{")
        b_end = _close(ctor, b, "{", "}")
        args = _strings(ctor[b:b_end])
        rest = ctor[b_end:].lstrip(" \n,")
        neg = []
        if rest.startswith("{"):
            neg = _strings(rest[:_close(rest, 0, "{", "}")])
        lam = re.search(r"\[\]\s*\(([^)]*)\)", ctor)
        takes_value = bool(lam) and lam.group(1).count(",") >= 1 and "bool" not in lam.group(1)
        hint = None
        if takes_value:
            h = re.match(r'\s*"((?:[^"\\]|\\.)*)"', rest)
            hint = h.group(1) if h else None
        examples = {"LLAMA_EXAMPLE_COMMON"}
        ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", chain)
        var = re.search(r"\.set_examples\((\w+)\)", chain)
        if ex:
            examples = set(re.findall(r"LLAMA_EXAMPLE_\w+", ex.group(1)))
        elif var:
            vm = re.search(r"\b%s\s*=\s*\{([^}]*)\}" % re.escape(var.group(1)), src)
            examples = set(re.findall(r"LLAMA_EXAMPLE_\w+", vm.group(1)))
        exc = re.search(r"\.set_excludes\(\{([^}]*)\}\)", chain)
        excludes = set(re.findall(r"LLAMA_EXAMPLE_\w+", exc.group(1))) if exc else set()
        if ".set_preset_only()" in chain:
            continue
        if not (examples & {"LLAMA_EXAMPLE_SERVER", "LLAMA_EXAMPLE_COMMON"}) or "LLAMA_EXAMPLE_SERVER" in excludes:
            continue
        key = tuple(args)
        if key in seen:  # -np is defined twice, for the server and for the rest
            continue
        seen.add(key)
        is_int = bool(lam) and re.search(r",\s*int\b", lam.group(1)) is not None
        out.append({"args": args, "neg": neg, "value": takes_value, "hint": hint, "int": is_int})
    return out


def _help_sections(helptext):
    """{flag name: (section, help text)} from `thaw serve --help`."""
    out, section = {}, None
    for line in helptext.splitlines():
        if line and not line.startswith(" "):
            section = "refused" if "refuses" in line else "no effect" if "no effect" in line else "flags"
            continue
        m = re.match(r"  (\S+)(?: \S+)?\s{2,}(.*)", line)
        if m and m.group(1).startswith("-"):
            for n in m.group(1).split(","):
                out[n] = (section, m.group(2))
    return out


GPU_ONLY = {"-ngl", "-dev", "-ot", "-cmoe", "-ncmoe", "-ncffn", "-sm", "-ts", "-mg", "-kvo", "--op-offload",
            "-fit", "-fitt", "-fitc", "--spec-draft-ngl", "--spec-draft-device", "--spec-draft-override-tensor",
            "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe"}


def readme_table(arg_cpp, helptext):
    """The README's table: each arg.cpp server option, what thaw does with it."""
    sec = _help_sections(helptext)
    rows = {"implemented": [], "implemented (no effect without a GPU)": [], "accepted, no effect": [],
            "refused": []}
    mixed = []
    for o in server_options(arg_cpp):
        names = o["args"] + o["neg"]
        kinds = [sec.get(n, ("?", ""))[0] for n in names]
        first = o["args"][0]
        if "flags" in kinds or first in ("-h", "--help"):
            rows["implemented (no effect without a GPU)" if first in GPU_ONLY else "implemented"].append(
                "`%s`" % first)
        elif "no effect" in kinds:
            rows["accepted, no effect"].append("`%s` (%s)" % (names[kinds.index("no effect")],
                                                             sec[names[kinds.index("no effect")]][1]))
        else:
            rows["refused"].append((sec.get(first, ("", "?"))[1], "`%s`" % first))
        if kinds[0] == "refused" and "refused" in kinds and kinds.count("refused") < len(kinds) and \
                "flags" not in kinds:
            mixed.append((sec[first][1], "`%s`" % first))  # its --no- form is accepted
    lines = ["| what thaw does | n | options |", "|---|---|---|"]
    for k in ("implemented", "implemented (no effect without a GPU)", "accepted, no effect"):
        lines.append("| %s | %d | %s |" % (k, len(rows[k]), " ".join(rows[k])))
    by_reason = {}
    for why, name in rows["refused"] + mixed:
        by_reason.setdefault(why, []).append(name)
    lines.append("| refused | %d | (by reason, below; with %d whose `--no-` form is accepted) |"
                 % (len(rows["refused"]), len(mixed)))
    lines += ["", "| refused because | options |", "|---|---|"]
    for why, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append("| %s | %s |" % (why, " ".join(names)))
    return "\n".join(lines)


if __name__ == "__main__":
    import subprocess
    import sys
    arg_cpp = sys.argv[1] if len(sys.argv) > 1 else ".deps/llama.cpp/common/arg.cpp"
    thaw = sys.argv[2] if len(sys.argv) > 2 else "build/thaw"
    print(readme_table(arg_cpp, subprocess.run([thaw, "serve", "--help"], capture_output=True, text=True).stdout))
