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
