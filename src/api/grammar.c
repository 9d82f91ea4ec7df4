/* grammar.c — reshaping the chat library's grammar (grammar.h).
 *
 * Map:
 *   ---- tool_choice required ----   root to the call, bounded repeats
 *   ---- Gemma 4 arguments ----      JSON schema -> Gemma 4 argument rules
 */
#include "api/grammar.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tool_choice required ----
 * The template's grammar lets a reply say anything before its tool calls
 * (`until-N?`, an optional thinking block, `message*`). A trained model
 * calls at once; a stubborn or random one can ramble inside that freedom
 * until max_tokens, and "required" must mean a call. So the root rule
 * loses every element that can match nothing (optional, repeated, or an
 * until-rule, directly or through a rule that is only one), and what is
 * left leads straight to the call. A root with alternatives is left alone. */

static bool is_until_rule(const char *grammar, const char *name, size_t n)
{
    if (n > 6 && memcmp(name, "until-", 6) == 0)
        return true;
    /* `name ::= until-N` on a line of its own */
    for (const char *line = grammar; line && *line;) {
        if (strncmp(line, name, n) == 0 && strncmp(line + n, " ::= until-", 11) == 0) {
            const char *e = line + n + 11;
            while (*e >= '0' && *e <= '9')
                e++;
            if (*e == '\n' || *e == '\0')
                return true;
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return false;
}

/* With parallel_tool_calls false, the calls rule `name ::= (...)+` loses
 * its `+`: one call, then the grammar is complete and only an end of turn
 * can follow. In place; a rule of another shape is left alone. */
static void single_call(char *grammar, const char *name, size_t n)
{
    for (char *line = grammar; line && *line;) {
        char *eol = strchr(line, '\n');
        if (strncmp(line, name, n) == 0 && strncmp(line + n, " ::= (", 6) == 0) {
            char *end = eol ? eol : line + strlen(line);
            if (end - line > 2 && end[-1] == '+' && end[-2] == ')') {
                memmove(end - 1, end, strlen(end) + 1);
                return;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
}

/* An until-rule's definition, `until-N ::= | [C] until-N-01 | [^C] until-N`
 * (any text that does not contain the delimiter that follows it, Mistral's
 * call id before "[ARGS]"): the length of its name, with *cls at its last
 * alternative's class `[^...]`; 0 for any other line. */
static size_t until_definition(const char *line, const char *eol, const char **cls)
{
    const char *sep;
    if (strncmp(line, "until-", 6) != 0 || !(sep = strstr(line, " ::= ")) || sep > eol)
        return 0;
    size_t n = (size_t)(sep - line);
    for (size_t k = 6; k < n; k++)
        if (line[k] < '0' || line[k] > '9')
            return 0; /* a helper (until-N-01): unreachable once its root is bounded */
    /* the line ends with ` | [^...] until-N` */
    const char *tail = eol - n;
    if (tail <= sep + 5 || strncmp(tail, line, n) != 0 || tail[-1] != ' ' || tail[-2] != ']')
        return 0;
    for (const char *c = tail - 2; c > sep + 5; c--)
        if (c[0] == '[' && c[1] == '^' && c[-1] == ' ' && c[-2] == '|') {
            *cls = c;
            return n;
        }
    return 0;
}

/* A character class repeated without bound (`[A-Za-z0-9_-]+`, gpt-oss's
 * constraint name) or an until-rule (Mistral's call id) lets a model that
 * never picks the closing symbol write forever inside a required call.
 * Classes get 64 in place of `+`/`*`; an until-rule becomes at most 64
 * characters that are not its delimiter's first (the delimiter follows it
 * wherever it is used): more than any name, id or number a trained model
 * writes there. Returns a new grammar (malloc'd) or NULL. */
char *thaw_grammar_bound_repeats(const char *g)
{
    static const char plus[] = "{1,64}", star[] = "{0,64}";
    char *out = malloc(strlen(g) * 7 + 1), *o = out;
    bool quoted = false, in_class = false;

    if (!out)
        return NULL;
    for (const char *p = g; *p; p++) {
        const char *eol = NULL, *cls = NULL;
        size_t n = 0;
        if (p == g || p[-1] == '\n') {
            eol = p + strcspn(p, "\n");
            n = until_definition(p, eol, &cls);
        }
        if (n > 0) { /* `until-N ::= [^C]{0,64}` */
            size_t n_cls = (size_t)(eol - n - 1 - cls);
            memcpy(o, p, n);
            memcpy(o + n, " ::= ", 5);
            memcpy(o + n + 5, cls, n_cls);
            memcpy(o + n + 5 + n_cls, star, 6);
            o += n + 5 + n_cls + 6;
            p = eol - 1;
            continue;
        }
        *o++ = *p;
        if (*p == '\\' && (quoted || in_class) && p[1]) {
            *o++ = *++p;
        } else if (quoted) {
            quoted = *p != '"';
        } else if (in_class) {
            if (*p == ']') {
                in_class = false;
                if (p[1] == '+' || p[1] == '*') {
                    const char *b = *++p == '+' ? plus : star;
                    memcpy(o, b, 6);
                    o += 6;
                }
            }
        } else if (*p == '"') {
            quoted = true;
        } else if (*p == '[') {
            in_class = true;
        }
    }
    *o = '\0';
    return out;
}

char *thaw_grammar_force_call(const char *grammar, bool parallel)
{
    const char *root = strncmp(grammar, "root ::= ", 9) == 0 ? grammar : strstr(grammar, "\nroot ::= ");
    if (!root)
        return NULL;
    if (*root == '\n')
        root++;
    const char *rhs = root + 9, *end = strchr(rhs, '\n');
    if (!end)
        end = rhs + strlen(rhs);
    size_t cap = strlen(grammar) * 2 + 64; /* an until-rule may become a longer class */
    char *out = malloc(cap), *o;
    if (!out)
        return NULL;
    memcpy(out, grammar, (size_t)(rhs - grammar));
    o = out + (rhs - grammar);
    const char *p = rhs;
    bool kept_any = false;
    while (p < end) {
        while (p < end && *p == ' ')
            p++;
        if (p >= end)
            break;
        const char *e = p;
        int depth = 0;
        bool quoted = false;
        for (; e < end; e++) {
            if (quoted) {
                if (*e == '\\' && e + 1 < end)
                    e++;
                else if (*e == '"')
                    quoted = false;
                continue;
            }
            if (*e == '"') {
                quoted = true;
            } else if (*e == '(' || *e == '[') {
                depth++;
            } else if (*e == ')' || *e == ']') {
                depth--;
            } else if (*e == '|' && depth == 0) {
                free(out); /* alternatives at the top: not ours to reshape */
                return NULL;
            } else if (*e == ' ' && depth == 0) {
                break;
            }
        }
        size_t n = (size_t)(e - p);
        char last = p[n - 1];
        size_t base = last == '?' || last == '*' ? n - 1 : n; /* the element without its suffix */
        bool group = p[0] == '(';
        /* an optional group stays (the generation prompt may open it, as
         * DeepSeek R1's does with <think>), emptied of its until-rules */
        bool droppable = last == '*' || (!group && last == '?') || is_until_rule(grammar, p, base);
        if (!droppable) {
            if (kept_any)
                *o++ = ' ';
            for (size_t k = 0; k < n;) {
                if (group && strncmp(p + k, "until-", 6) == 0 && (k == 0 || p[k - 1] == ' ' || p[k - 1] == '(')) {
                    /* a few blanks instead: enough for the newline a
                     * generation prompt may end with */
                    static const char blanks[] = "[ \\t\\n]{0,8}";
                    k += 6;
                    while (k < n && p[k] >= '0' && p[k] <= '9')
                        k++;
                    if (k < n && (p[k] == '?' || p[k] == '*'))
                        k++;
                    memcpy(o, blanks, sizeof blanks - 1);
                    o += sizeof blanks - 1;
                    continue;
                }
                *o++ = p[k++];
            }
            kept_any = true;
        }
        p = e;
    }
    size_t tail = strlen(end);
    memcpy(o, end, tail + 1);
    if (!parallel && kept_any) {
        /* the last element of the new root names the calls rule */
        char *root_end = strchr(out + (rhs - grammar), '\n'), *last;
        size_t rlen = root_end ? (size_t)(root_end - out) : strlen(out);
        for (last = out + rlen; last > out && last[-1] != ' '; last--)
            ;
        char name[128];
        size_t n = (size_t)(out + rlen - last);
        if (n > 0 && n < sizeof name) {
            memcpy(name, last, n);
            single_call(out, name, n);
        }
    }
    return out;
}

/* ---- Gemma 4 arguments ----
 * Gemma 4 writes a call as `call:NAME{key:value,...}` with bare keys and
 * strings between <|"|> (the template's format_argument). The library's
 * grammar takes any such dict for every tool (its TODO: the schema
 * compiler only speaks JSON), so a model may call get_weather with no city,
 * or with one not in the enum. Here each tool's schema becomes its own
 * rule in that syntax; the library's parser still reads the result, since
 * it is a subset of the generic dict. */

struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* A GBNF string literal: "..." with its escapes. */
static void put_literal(struct sbuf *b, const char *s)
{
    puts_(b, "\"");
    for (; *s; s++) {
        char esc[8];
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c == '\n') {
            puts_(b, "\\n");
        } else if (c == '\r') {
            puts_(b, "\\r");
        } else if (c == '\t') {
            puts_(b, "\\t");
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\x%02X", c);
            puts_(b, esc);
        } else {
            put(b, s, 1);
        }
    }
    puts_(b, "\"");
}

#define GEMMA4_QUOTE "\"<|\\\"|>\"" /* the GBNF literal "<|\"|>" */

static void gemma4_value(struct sbuf *b, json_t *schema, int depth);

/* One enum or const value; false for one this cannot spell. */
static bool gemma4_constant(struct sbuf *b, json_t *v)
{
    if (json_is_string(v)) {
        puts_(b, GEMMA4_QUOTE " ");
        put_literal(b, json_string_value(v));
        puts_(b, " " GEMMA4_QUOTE);
        return true;
    }
    if (json_is_number(v) || json_is_boolean(v) || json_is_null(v)) {
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!t) {
            b->oom = true;
            return false;
        }
        put_literal(b, t);
        free(t);
        return true;
    }
    return false;
}

/* A key the library's parser reads back: `[^:}]+`, and no quote games. */
static bool gemma4_key_ok(const char *k)
{
    return *k && !strpbrk(k, ":}{,<\"\\ \t\n");
}

/* Whether the schema's `required` array names key k. */
static bool is_required(json_t *req, const char *k)
{
    size_t i;
    json_t *r;

    json_array_foreach(req, i, r)
    {
        if (json_is_string(r) && strcmp(json_string_value(r), k) == 0)
            return true;
    }
    return false;
}

static void gemma4_object(struct sbuf *b, json_t *schema, int depth)
{
    json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required"), *v;
    const char *k;
    size_t n_req = 0, n_opt = 0;

    if (!json_is_object(props) || json_object_size(props) == 0) {
        puts_(b, "gemma4-dict");
        return;
    }
    json_object_foreach(props, k, v)
    {
        if (!gemma4_key_ok(k)) {
            puts_(b, "gemma4-dict");
            return;
        }
    }
    /* required keys in the order the schema declares them, then any of the
     * optional ones, each at most once in number */
    puts_(b, "(\"{\" space ");
    json_object_foreach(props, k, v)
    {
        if (!is_required(req, k)) {
            n_opt++;
            continue;
        }
        if (n_req++)
            puts_(b, " \",\" space ");
        char key[512];
        snprintf(key, sizeof key, "%s:", k);
        put_literal(b, key);
        puts_(b, " space ");
        gemma4_value(b, v, depth + 1);
    }
    if (n_opt) {
        struct sbuf alt = {0};
        size_t j = 0;
        puts_(&alt, "(");
        json_object_foreach(props, k, v)
        {
            if (is_required(req, k))
                continue;
            if (j++)
                puts_(&alt, " | ");
            char key[512];
            snprintf(key, sizeof key, "%s:", k);
            put_literal(&alt, key);
            puts_(&alt, " space ");
            gemma4_value(&alt, v, depth + 1);
        }
        puts_(&alt, ")");
        if (alt.oom) {
            b->oom = true;
        } else if (n_req) {
            char rep[64];
            snprintf(rep, sizeof rep, "){0,%zu}", n_opt);
            puts_(b, " (\",\" space ");
            puts_(b, alt.s);
            puts_(b, rep);
        } else {
            char rep[64];
            snprintf(rep, sizeof rep, "){0,%zu}", n_opt - 1);
            puts_(b, "(\"}\" | ");
            puts_(b, alt.s);
            puts_(b, " (\",\" space ");
            puts_(b, alt.s);
            puts_(b, rep);
            puts_(b, " space \"}\")");
            free(alt.s);
            puts_(b, ")");
            return;
        }
        free(alt.s);
    }
    puts_(b, " space \"}\")");
}

static void gemma4_typed(struct sbuf *b, json_t *schema, const char *type, int depth)
{
    if (strcmp(type, "string") == 0) {
        puts_(b, "gemma4-string");
    } else if (strcmp(type, "integer") == 0) {
        puts_(b, "(\"-\"? (\"0\" | [1-9] [0-9]{0,15}))");
    } else if (strcmp(type, "number") == 0) {
        puts_(b, "gemma4-number");
    } else if (strcmp(type, "boolean") == 0) {
        puts_(b, "gemma4-bool");
    } else if (strcmp(type, "null") == 0) {
        puts_(b, "gemma4-null");
    } else if (strcmp(type, "object") == 0) {
        gemma4_object(b, schema, depth);
    } else if (strcmp(type, "array") == 0) {
        json_t *items = json_object_get(schema, "items");
        json_int_t max = json_integer_value(json_object_get(schema, "maxItems"));
        struct sbuf item = {0};
        gemma4_value(&item, json_is_object(items) ? items : NULL, depth + 1);
        if (item.oom) {
            b->oom = true;
            return;
        }
        puts_(b, "(\"[\" space (\"]\" | ");
        puts_(b, item.s);
        puts_(b, " (\",\" space ");
        puts_(b, item.s);
        if (max >= 1) {
            char rep[64];
            snprintf(rep, sizeof rep, "){0,%lld}", (long long)max - 1);
            puts_(b, rep);
        } else {
            puts_(b, ")*");
        }
        puts_(b, " space \"]\"))");
        free(item.s);
    } else {
        puts_(b, "gemma4-value");
    }
}

/* What was written since mark gives way to the generic value (a constant
 * this cannot spell). */
static void rewind_to_value(struct sbuf *b, size_t mark)
{
    b->n = mark;
    if (b->s)
        b->s[mark] = '\0';
    puts_(b, "gemma4-value");
}

static void gemma4_value(struct sbuf *b, json_t *schema, int depth)
{
    json_t *t, *e, *v;
    size_t i;

    if (!json_is_object(schema) || depth > 8) {
        puts_(b, "gemma4-value");
        return;
    }
    if ((v = json_object_get(schema, "const"))) {
        size_t mark = b->n;
        if (!gemma4_constant(b, v))
            rewind_to_value(b, mark);
        return;
    }
    if (json_is_array(e = json_object_get(schema, "enum")) && json_array_size(e) > 0) {
        size_t mark = b->n;
        puts_(b, "(");
        json_array_foreach(e, i, v)
        {
            if (i)
                puts_(b, " | ");
            if (!gemma4_constant(b, v)) {
                rewind_to_value(b, mark);
                return;
            }
        }
        puts_(b, ")");
        return;
    }
    t = json_object_get(schema, "type");
    if (json_is_string(t)) {
        gemma4_typed(b, schema, json_string_value(t), depth);
    } else if (json_is_array(t) && json_array_size(t) > 0) {
        puts_(b, "(");
        json_array_foreach(t, i, v)
        {
            if (i)
                puts_(b, " | ");
            gemma4_typed(b, schema, json_is_string(v) ? json_string_value(v) : "", depth);
        }
        puts_(b, ")");
    } else if (json_object_get(schema, "properties")) {
        gemma4_object(b, schema, depth);
    } else {
        puts_(b, "gemma4-value");
    }
}

char *thaw_grammar_gemma4_args(const char *grammar, const char *tools_json)
{
    json_t *tools, *tool;
    size_t i;
    struct sbuf out = {0}, rules = {0};

    if (!strstr(grammar, "\ngemma4-dict ::= ") || !tools_json || !(tools = json_loads(tools_json, 0, NULL)))
        return NULL;
    puts_(&out, grammar);
    json_array_foreach(tools, i, tool)
    {
        json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name)
            continue;
        /* the library's line for this tool, as it writes it */
        struct sbuf line = {0};
        puts_(&line, "\ntool-");
        for (const char *c = name; *c; c++) /* a rule name keeps [A-Za-z0-9-] */
            put(&line, (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ? c : "-", 1);
        puts_(&line, " ::= (");
        put_literal(&line, name);
        puts_(&line, ") gemma4-dict\n");
        char *at = line.oom ? NULL : strstr(out.s ? out.s : "", line.s);
        if (at) {
            char rule[32];
            snprintf(rule, sizeof rule, "thaw-args-%zu", i);
            /* `gemma4-dict\n` -> `thaw-args-N\n`, then the rule at the end */
            size_t off = (size_t)(at - out.s) + line.n - strlen("gemma4-dict\n");
            struct sbuf t = {0};
            put(&t, out.s, off);
            puts_(&t, rule);
            puts_(&t, out.s + off + strlen("gemma4-dict"));
            free(out.s);
            out = t;
            puts_(&rules, rule);
            puts_(&rules, " ::= ");
            gemma4_value(&rules, json_object_get(fn, "parameters"), 0);
            puts_(&rules, "\n");
        }
        free(line.s);
    }
    json_decref(tools);
    if (rules.n) {
        if (out.n && out.s[out.n - 1] != '\n')
            puts_(&out, "\n");
        puts_(&out, rules.s);
    }
    free(rules.s);
    if (out.oom || rules.oom || !rules.n) {
        free(out.s);
        return NULL;
    }
    return out.s;
}
