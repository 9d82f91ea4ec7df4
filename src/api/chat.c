/* chat.c — rendering requests through llama.cpp's chat library, parsing
 * replies and tokenization (the conversation keys are keys.c's).
 *
 * Map:
 *   ---- templates ----  the library handle, request -> inputs JSON
 *   ---- prompt ----     render, tokenize, grammar and stops for generation
 *   ---- replies ----    generated text -> message, canonical next-turn tokens
 */
#include "api/chat.h"

#include "api/grammar.h"
#include "api/template.h"
#include "base/buf.h"
#include "base/error.h"
#include "base/key.h"
#include "base/log.h"
#include "base/utf8.h"
#include "llama/tokens.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Branch points lately computed (thaw_chat_branch_point). Every request
 * of a session presents the same leading messages and tools, whose two
 * renderings cost as much as the prompt's own (Claude Code: 17k tokens of
 * system prompt and tool schemas, rendered and tokenized twice more per
 * request). Keyed by the tenant and the exact rendering input, so a hit
 * returns what the renderings would, and one tenant's timing never tells
 * what another has sent. */
#define BRANCH_MEMO_N 4

struct branch_memo {
    uint8_t ns[THAW_KEY_BYTES];
    char *in;            /* the rendering input: leading messages, tools, options */
    llama_token *tokens; /* their rendering's tokens up to the branch point */
    int n;
    uint64_t used; /* least recently used goes first */
};

struct branch_memos {
    pthread_mutex_t mu;
    struct branch_memo e[BRANCH_MEMO_N];
    uint64_t clock;
};

struct thaw_chat {
    const struct llama_model *model;
    const struct llama_vocab *vocab;
    struct thaw_tmpl *tmpl;
    json_t *default_kwargs;      /* --chat-template-kwargs, an object or NULL */
    char *reasoning_format;
    struct branch_memos *memos; /* mutable behind the const handle the HTTP threads share */
};

/* ---- templates ------------------------------------------------------------------ */

int thaw_chat_new(const struct llama_model *model, const struct thaw_chat_params *p, struct thaw_chat **out)
{
    struct thaw_chat *chat = calloc(1, sizeof *chat);
    char err[512];
    int rc;

    if (!chat)
        return THAW_ENOMEM;
    chat->model = model;
    chat->vocab = llama_model_get_vocab(model);
    chat->reasoning_format = strdup(p->reasoning_format ? p->reasoning_format : "auto");
    chat->memos = calloc(1, sizeof *chat->memos);
    if (!chat->reasoning_format || !chat->memos) {
        free(chat->reasoning_format);
        free(chat->memos);
        free(chat);
        return THAW_ENOMEM;
    }
    pthread_mutex_init(&chat->memos->mu, NULL);
    if (p->default_kwargs) {
        json_error_t jerr;
        chat->default_kwargs = json_loads(p->default_kwargs, 0, &jerr);
        if (!json_is_object(chat->default_kwargs)) {
            LOG_ERR("--chat-template-kwargs must be a JSON object: %s", chat->default_kwargs ? "not an object" : jerr.text);
            thaw_chat_free(chat);
            return THAW_EINVAL;
        }
    }
    if (!p->template_src && !llama_model_chat_template(model, NULL))
        LOG_WRN("the model has no chat template; using chatml (override with --chat-template or --chat-template-file)");
    if ((rc = thaw_tmpl_new(model, p->template_src, p->jinja, &chat->tmpl, err, sizeof err)) != 0) {
        LOG_ERR("%s", rc == THAW_EINVAL ? err : thaw_strerror(rc));
        thaw_chat_free(chat);
        return rc;
    }
    *out = chat;
    return 0;
}

void thaw_chat_free(struct thaw_chat *chat)
{
    if (!chat)
        return;
    thaw_tmpl_free(chat->tmpl);
    json_decref(chat->default_kwargs);
    free(chat->reasoning_format);
    for (int i = 0; i < BRANCH_MEMO_N; i++) {
        free(chat->memos->e[i].in);
        free(chat->memos->e[i].tokens);
    }
    pthread_mutex_destroy(&chat->memos->mu);
    free(chat->memos);
    free(chat);
}

const char *thaw_chat_template(const struct thaw_chat *chat) { return thaw_tmpl_source(chat->tmpl); }

/* A tool call's arguments that are not a JSON object (a call cut short by
 * max_tokens, echoed back as the client got it) made into one, so the
 * history renders instead of failing in the template library, which parses
 * every call's arguments: open strings, arrays and objects are closed, a
 * dangling key or colon gets null, a trailing comma goes; what still does
 * not parse becomes {}. The same repair runs when the reply's canonical
 * next-turn tokens are rendered, so both renderings agree. Returns a new
 * string or NULL (ENOMEM). */
static char *repair_arguments(const char *args)
{
    size_t n = strlen(args), len = 0, depth = 0;
    char *out = malloc(8 * n + 16), *stack = malloc(n + 1); /* each level closed adds at most 6 bytes */
    bool in_str = false, esc = false;
    json_error_t jerr;

    if (!out || !stack) {
        free(out);
        free(stack);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char c = args[i];
        out[len++] = c;
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            stack[depth++] = c;
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    if (in_str) {
        if (esc)
            len--; /* a cut escape: drop its backslash */
        out[len++] = '"';
    }
    while (depth > 0) {
        while (len > 0 && (out[len - 1] == ' ' || out[len - 1] == '\n' || out[len - 1] == '\t' || out[len - 1] == '\r'))
            len--;
        if (len > 0 && out[len - 1] == ',')
            len--;
        if (len > 0 && out[len - 1] == ':') {
            memcpy(out + len, "null", 4);
            len += 4;
        } else if (stack[depth - 1] == '{' && len > 0 && out[len - 1] == '"') {
            /* a string right after '{' or ',' is a key waiting for its value */
            size_t j = len - 1;
            bool key = false;
            while (j > 0) { /* find the string's opening quote */
                j--;
                if (out[j] == '"') {
                    size_t bs = 0;
                    while (j >= bs + 1 && out[j - bs - 1] == '\\')
                        bs++;
                    if (bs % 2 == 0)
                        break;
                }
            }
            while (j > 0 && (out[j - 1] == ' ' || out[j - 1] == '\n' || out[j - 1] == '\t' || out[j - 1] == '\r'))
                j--;
            key = j > 0 && (out[j - 1] == '{' || out[j - 1] == ',');
            if (key) {
                memcpy(out + len, ":null", 5);
                len += 5;
            }
        }
        out[len++] = stack[--depth] == '{' ? '}' : ']';
    }
    out[len] = '\0';
    free(stack);
    json_t *v = json_loads(out, JSON_DECODE_ANY, &jerr);
    if (!json_is_object(v)) {
        free(out);
        out = strdup("{}");
    }
    json_decref(v);
    return out;
}

/* A message as the template gets it: every tool call's arguments a JSON
 * object's text (repair_arguments). Takes `m`; NULL on ENOMEM. */
static json_t *renderable(json_t *m)
{
    json_t *calls = json_object_get(m, "tool_calls"), *c;
    json_error_t jerr;
    size_t i;

    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_t *v = args ? json_loads(args, JSON_DECODE_ANY, &jerr) : NULL;
        bool ok = json_is_object(v);
        json_decref(v);
        if (!args || ok)
            continue;
        char *fixed = repair_arguments(args);
        if (!fixed) {
            json_decref(m);
            return NULL;
        }
        json_object_set_new(fn, "arguments", json_string(fixed));
        free(fixed);
    }
    return m;
}

/* The inputs JSON for thaw_tmpl_apply: messages[0..n) (+ `extra`, a
 * message JSON), the request's tools, choice, schema and kwargs.
 * `continue_final`: the last message is left open for the reply to go on
 * (assistant prefill). */
static char *inputs_json(const struct thaw_chat *chat, const struct thaw_chat_request *req, size_t n,
                         const char *const *extra, int n_extra, bool add_generation_prompt, bool continue_final)
{
    json_t *in = json_object(), *msgs = json_array(), *kw = json_object();
    json_error_t jerr;
    char *out = NULL;

    if (!in || !msgs || !kw)
        goto done;
    for (size_t i = 0; i < n; i++)
        json_array_append_new(msgs, renderable(json_loads(req->messages[i].render ? req->messages[i].render
                                                                                   : req->messages[i].json,
                                                          0, &jerr)));
    for (int i = 0; i < n_extra; i++)
        json_array_append_new(msgs, renderable(json_loads(extra[i], 0, &jerr)));
    json_object_set(in, "messages", msgs);
    if (req->tools_json) {
        json_t *tools = json_loads(req->tools_json, 0, &jerr);
        if (tools && req->tool_choice_name) {
            /* a named function: that tool alone, required */
            json_t *only = json_array(), *t;
            size_t i;
            json_array_foreach(tools, i, t)
                if (strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                           req->tool_choice_name) == 0)
                    json_array_append(only, t);
            json_decref(tools);
            tools = only;
        }
        json_object_set_new(in, "tools", tools);
    }
    if (req->tool_choice)
        json_object_set_new(in, "tool_choice", json_string(req->tool_choice));
    json_object_set_new(in, "parallel_tool_calls", json_boolean(req->parallel_tool_calls));
    if (req->json_schema)
        json_object_set_new(in, "json_schema", json_loads(req->json_schema, 0, &jerr));
    json_object_set_new(in, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (continue_final)
        json_object_set_new(in, "continue_final_message", json_true());
    if (chat->default_kwargs)
        json_object_update(kw, chat->default_kwargs);
    if (req->template_kwargs) {
        json_t *rk = json_loads(req->template_kwargs, 0, &jerr);
        if (rk)
            json_object_update(kw, rk); /* the request's win */
        json_decref(rk);
    }
    json_object_set(in, "chat_template_kwargs", kw);
    json_object_set_new(in, "reasoning_format", json_string(chat->reasoning_format));
    out = json_dumps(in, JSON_COMPACT);
done:
    json_decref(msgs);
    json_decref(kw);
    json_decref(in);
    return out;
}

/* ---- prompt ---------------------------------------------------------------------- */

int thaw_chat_tokenize(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out)
{
    return thaw_chat_tokenize_text(chat, text, true, out, n_out);
}

/* Tokens of a piece of template text, no BOS. */
static int tokenize_piece(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out)
{
    return thaw_chat_tokenize_text(chat, text, false, out, n_out);
}

void thaw_chat_gen_free(struct thaw_chat_gen *g)
{
    free(g->grammar);
    for (int i = 0; i < g->n_triggers; i++)
        free(g->triggers[i]);
    free(g->triggers);
    free(g->trigger_tokens);
    free(g->prefill);
    free(g->preserved);
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    free(g->stops);
    free(g->parser);
    free(g->think_start);
    for (int i = 0; i < g->n_think_ends; i++)
        free(g->think_ends[i]);
    free(g->think_ends);
    free(g->think_forced);
    free(g->gen_prompt);
    memset(g, 0, sizeof *g);
}

/* Escapes a literal word for the lazy grammar's regex triggers. */
static char *regex_escape(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(2 * n + 1), *p = o;

    if (!o)
        return NULL;
    for (; *s; s++) {
        if (strchr("\\^$.|?*+()[]{}", *s))
            *p++ = '\\';
        *p++ = *s;
    }
    *p = '\0';
    return o;
}

/* The apply result's grammar, triggers, stops and parser -> gen. */
static int take_gen(const struct thaw_chat *chat, json_t *res, struct thaw_chat_gen *g)
{
    json_t *v;
    size_t i;

    const char *grammar = json_string_value(json_object_get(res, "grammar"));
    if (grammar && *grammar && !(g->grammar = strdup(grammar)))
        return THAW_ENOMEM;
    g->grammar_lazy = json_is_true(json_object_get(res, "grammar_lazy"));
    json_t *trig = json_object_get(res, "triggers");
    g->triggers = calloc(json_array_size(trig) + 1, sizeof *g->triggers);
    g->trigger_tokens = calloc(json_array_size(trig) + 1, sizeof *g->trigger_tokens);
    if (!g->triggers || !g->trigger_tokens)
        return THAW_ENOMEM;
    json_array_foreach(trig, i, v) {
        int type = (int)json_integer_value(json_object_get(v, "type"));
        const char *value = json_string_value(json_object_get(v, "value"));
        if (type == 0) { /* token */
            g->trigger_tokens[g->n_trigger_tokens++] = (llama_token)json_integer_value(json_object_get(v, "token"));
            continue;
        }
        char *pat = NULL;
        if (type == 1) {
            pat = regex_escape(value ? value : "");
        } else if (type == 3) { /* a full-match pattern: anchored */
            size_t n = value ? strlen(value) : 0;
            pat = malloc(n + 3);
            if (pat)
                snprintf(pat, n + 3, "%s%s%s", n && value[0] == '^' ? "" : "^", value ? value : "",
                         n && value[n - 1] == '$' ? "" : "$");
        } else {
            pat = strdup(value ? value : "");
        }
        if (!pat)
            return THAW_ENOMEM;
        g->triggers[g->n_triggers++] = pat;
    }
    json_t *pres = json_object_get(res, "preserved_tokens");
    g->preserved = calloc(json_array_size(pres) + 1, sizeof *g->preserved);
    if (!g->preserved)
        return THAW_ENOMEM;
    json_array_foreach(pres, i, v) {
        llama_token *t = NULL;
        int n = 0;
        if (tokenize_piece(chat, json_string_value(v), &t, &n) == 0 && n == 1)
            g->preserved[g->n_preserved++] = t[0];
        free(t);
    }
    json_t *stops = json_object_get(res, "additional_stops");
    g->stops = calloc(json_array_size(stops) + 1, sizeof *g->stops);
    if (!g->stops)
        return THAW_ENOMEM;
    json_array_foreach(stops, i, v) {
        if (json_string_length(v) == 0)
            continue;
        if (!(g->stops[g->n_stops] = strdup(json_string_value(v))))
            return THAW_ENOMEM;
        g->n_stops++;
    }
    json_t *parser = json_object_get(res, "parser");
    /* a parser is needed whenever the reply may carry more than text */
    if (parser && !(g->parser = json_dumps(parser, JSON_COMPACT)))
        return THAW_ENOMEM;
    /* a grammar that is on from the first token starts after the generation
     * prompt the template already put in the prompt: it accepts that first */
    const char *gp = json_string_value(json_object_get(parser, "generation_prompt"));
    if (g->grammar && !g->grammar_lazy && gp && *gp && tokenize_piece(chat, gp, &g->prefill, &g->n_prefill) != 0)
        return THAW_ENOMEM;
    return 0;
}

/* The library's grammar made to keep the request's promises (grammar.h):
 * each tool's own argument schema where the family's rules are generic,
 * and with tool_choice "required" a straight, bounded road to the call. */
static int reshape_grammar(const struct thaw_chat_request *req, struct thaw_chat_gen *gen)
{
    char *g;

    if (req->tools_json && (g = thaw_grammar_gemma4_args(gen->grammar, req->tools_json))) {
        free(gen->grammar);
        gen->grammar = g;
    }
    if (gen->grammar_lazy || !req->tool_choice || strcmp(req->tool_choice, "required") != 0)
        return 0;
    if ((g = thaw_grammar_force_call(gen->grammar, req->parallel_tool_calls))) {
        free(gen->grammar);
        gen->grammar = g;
    }
    if (!(g = thaw_grammar_bound_repeats(gen->grammar)))
        return THAW_ENOMEM;
    free(gen->grammar);
    gen->grammar = g;
    return 0;
}

/* Renders a request: the apply result (JSON, parsed) or NULL with err. */
static json_t *apply_request(const struct thaw_chat *chat, const struct thaw_chat_request *req, char *err,
                             size_t errlen, int *rc)
{
    char *in = NULL, *out = NULL;
    json_t *res = NULL;
    json_error_t jerr;

    *rc = THAW_ENOMEM;
    if (req->tools_json && !thaw_tmpl_jinja(chat->tmpl)) {
        snprintf(err, errlen, "'tools' need the Jinja renderer: the server runs with --no-jinja");
        *rc = THAW_EINVAL;
        return NULL;
    }
    if (!(in = inputs_json(chat, req, req->n_messages, NULL, 0, req->add_generation_prompt, req->continue_final)))
        return NULL;
    if (!(out = thaw_tmpl_apply(chat->tmpl, in, err, errlen)))
        *rc = THAW_EINVAL;
    else if ((res = json_loads(out, 0, &jerr)))
        *rc = 0;
    free(out);
    free(in);
    return res;
}

int thaw_chat_render_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, char **text, char *err,
                            size_t errlen)
{
    int rc;
    json_t *res = apply_request(chat, req, err, errlen, &rc);

    if (!res)
        return rc;
    *text = strdup(json_string_value(json_object_get(res, "prompt")));
    json_decref(res);
    return *text ? 0 : THAW_ENOMEM;
}

/* A grammar the request gives itself ('grammar', or a JSON schema no
 * template rendered): it replaces the template's, from the first token. */
static int own_grammar(const struct thaw_chat_request *req, bool schema, struct thaw_chat_gen *gen, char *err,
                       size_t errlen)
{
    char *g = NULL;

    if (req->grammar)
        g = strdup(req->grammar);
    else if (schema && req->json_schema && !(g = thaw_tmpl_schema_grammar(req->json_schema, err, errlen)))
        return THAW_EINVAL;
    else if (!schema || !req->json_schema)
        return 0;
    if (!g)
        return THAW_ENOMEM;
    free(gen->grammar);
    gen->grammar = g;
    gen->grammar_lazy = false;
    free(gen->prefill);
    gen->prefill = NULL;
    gen->n_prefill = 0;
    return 0;
}

/* The reasoning budget's tags and forced tokens (thaw_chat_gen), when the
 * template has a thinking block and req a budget (resolved by the engine
 * from --reasoning-budget: thaw_chat_request.reasoning_budget). The forced
 * run is the budget message then the first end tag, tokenized with special
 * tokens parsed (llama-server's reasoning_budget_forced). 0 or THAW_ENOMEM. */
static int take_budget(const struct thaw_chat *chat, const struct thaw_chat_request *req, json_t *res,
                       struct thaw_chat_gen *g)
{
    json_t *th = json_object_get(res, "thinking"), *ends = json_object_get(th, "ends"), *v;
    const char *start = json_string_value(json_object_get(th, "start"));
    const char *gp = json_string_value(json_object_get(json_object_get(res, "parser"), "generation_prompt"));
    size_t i;
    int rc;

    g->reasoning_budget = -1;
    if (req->reasoning_budget < 0 || !start || !*start || json_array_size(ends) == 0)
        return 0;
    if (!(g->think_start = strdup(start)) || !(g->think_ends = calloc(json_array_size(ends), sizeof *g->think_ends)) ||
        !(g->gen_prompt = strdup(gp ? gp : "")))
        return THAW_ENOMEM;
    json_array_foreach(ends, i, v) {
        if (json_string_length(v) == 0)
            continue;
        if (!(g->think_ends[g->n_think_ends] = strdup(json_string_value(v))))
            return THAW_ENOMEM;
        g->n_think_ends++;
    }
    if (g->n_think_ends == 0)
        return 0;
    const char *msg = req->reasoning_budget_message ? req->reasoning_budget_message : "";
    size_t n = strlen(msg) + strlen(g->think_ends[0]) + 1;
    char *text = malloc(n);
    if (!text)
        return THAW_ENOMEM;
    snprintf(text, n, "%s%s", msg, g->think_ends[0]);
    rc = tokenize_piece(chat, text, &g->think_forced, &g->n_think_forced);
    free(text);
    if (rc != 0)
        return rc;
    g->reasoning_budget = g->n_think_forced > 0 ? req->reasoning_budget : -1;
    return 0;
}

int thaw_chat_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **tokens,
                     int *n_tokens, char **text, struct thaw_chat_gen *gen, char *err, size_t errlen)
{
    int rc;
    json_t *res;
    /* the built-in renderer takes no schema: it becomes the grammar here */
    bool schema_here = req->json_schema && !thaw_tmpl_jinja(chat->tmpl);
    struct thaw_chat_request shown = *req;

    memset(gen, 0, sizeof *gen);
    if (schema_here)
        shown.json_schema = NULL;
    if (!(res = apply_request(chat, &shown, err, errlen, &rc)))
        return rc;
    *tokens = NULL;
    *n_tokens = 0;
    if (text) {
        if (!(*text = strdup(json_string_value(json_object_get(res, "prompt"))))) {
            rc = THAW_ENOMEM;
            goto done;
        }
    } else if ((rc = thaw_chat_tokenize(chat, json_string_value(json_object_get(res, "prompt")), tokens,
                                        n_tokens)) != 0) {
        goto done;
    }
    if ((rc = take_gen(chat, res, gen)) == 0 && gen->grammar)
        rc = reshape_grammar(req, gen);
    if (rc == 0)
        rc = take_budget(chat, req, res, gen);
    if (rc == 0)
        rc = own_grammar(req, schema_here, gen, err, errlen);
    if (rc == 0 && gen->grammar)
        LOG_DBG("chat: grammar (%s, %d triggers, %d trigger tokens):\n%s", gen->grammar_lazy ? "lazy" : "from the start",
                gen->n_triggers, gen->n_trigger_tokens, gen->grammar);
    if (rc != 0) {
        free(*tokens);
        *tokens = NULL;
        if (text) {
            free(*text);
            *text = NULL;
        }
        thaw_chat_gen_free(gen);
    }
done:
    json_decref(res);
    return rc;
}

static int append_tokens(llama_token **dst, int *n_dst, int *cap, const llama_token *src, int n);

/* raw_tokens as the prompt: each id checked against the vocabulary, each
 * text piece tokenized in place (BOS as the vocab wants only when it is
 * first, as llama-server's mixed prompts). 0, THAW_ENOMEM, or THAW_EINVAL
 * with err; *tokens (malloc'd, room for one more) set only on 0. */
static int raw_token_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, int n_vocab,
                            llama_token **tokens, int *n_tokens, char *err, size_t errlen)
{
    llama_token *out = NULL, *piece = NULL;
    int n = 0, cap = 0, n_piece = 0, rc = 0;

    for (int i = 0; rc == 0 && i < req->n_raw_tokens; i++) {
        int32_t id = req->raw_tokens[i];
        if (id < 0) {
            rc = thaw_chat_tokenize_text(chat, req->raw_pieces[-id - 1], i == 0, &piece, &n_piece);
            if (rc == 0)
                rc = append_tokens(&out, &n, &cap, piece, n_piece);
            free(piece);
            piece = NULL;
            if (rc != 0)
                snprintf(err, errlen, "prompt[%d] could not be tokenized: %s", i, thaw_strerror(rc));
        } else if (id >= n_vocab) {
            snprintf(err, errlen, "prompt[%d] must be a token id between 0 and %d", i, n_vocab - 1);
            rc = THAW_EINVAL;
        } else {
            rc = append_tokens(&out, &n, &cap, &id, 1);
        }
    }
    if (rc != 0) { /* else cap > n: append_tokens leaves room, the spare one */
        free(out);
        return rc;
    }
    *tokens = out;
    *n_tokens = n;
    return 0;
}

int thaw_chat_raw_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **tokens,
                         int *n_tokens, struct thaw_chat_gen *gen, char *err, size_t errlen)
{
    int rc, n_vocab = thaw_chat_n_vocab(chat);

    memset(gen, 0, sizeof *gen);
    *tokens = NULL;
    *n_tokens = 0;
    if (req->raw_text) {
        if ((rc = thaw_chat_tokenize(chat, req->raw_text, tokens, n_tokens)) != 0) {
            snprintf(err, errlen, "'prompt' could not be tokenized: %s", thaw_strerror(rc));
            return rc;
        }
    } else if ((rc = raw_token_prompt(chat, req, n_vocab, tokens, n_tokens, err, errlen)) != 0) {
        return rc;
    }
    if (*n_tokens == 0) {
        snprintf(err, errlen, "'prompt' is empty");
        rc = THAW_EINVAL;
    } else {
        rc = own_grammar(req, true, gen, err, errlen);
    }
    if (rc != 0) {
        free(*tokens);
        *tokens = NULL;
        *n_tokens = 0;
    }
    return rc;
}

/* text's tokens, special-token text parsed as special tokens or not */
static int tokenize(const struct thaw_chat *chat, const char *text, bool add_special, bool parse_special,
                    llama_token **out, int *n_out)
{
    size_t len = strlen(text);
    llama_token *toks;
    int n;

    if (len > INT32_MAX / 2)
        return THAW_ETOOBIG;
    if (!(toks = malloc((len + 16) * sizeof *toks)))
        return THAW_ENOMEM;
    n = llama_tokenize(chat->vocab, text, (int32_t)len, toks, (int32_t)(len + 16), add_special, parse_special);
    if (n < 0) {
        free(toks);
        return THAW_EINVAL;
    }
    *out = toks;
    *n_out = n;
    return 0;
}

int thaw_chat_tokenize_text(const struct thaw_chat *chat, const char *text, bool add_special, llama_token **out,
                            int *n_out)
{
    return tokenize(chat, text, add_special, true, out, n_out);
}

/* Appends src[0..n) to *dst (n_dst of cap). 0 or THAW_ENOMEM. */
static int append_tokens(llama_token **dst, int *n_dst, int *cap, const llama_token *src, int n)
{
    if (*n_dst + n > *cap) {
        int nc = 2 * (*n_dst + n) + 8;
        llama_token *nt = realloc(*dst, (size_t)nc * sizeof *nt);
        if (!nt)
            return THAW_ENOMEM;
        *dst = nt;
        *cap = nc;
    }
    memcpy(*dst + *n_dst, src, (size_t)n * sizeof *src);
    *n_dst += n;
    return 0;
}

int thaw_chat_rerank_prompt(const struct thaw_chat *chat, const char *query, const char *doc, llama_token **out,
                            int *n_out)
{
    const char *tmpl = llama_model_chat_template(chat->model, "rerank");
    llama_token *q = NULL, *d = NULL, *res = NULL, eos = llama_vocab_eos(chat->vocab);
    int nq = 0, nd = 0, n = 0, cap = 0, rc;

    if (tmpl) {
        /* the model's own layout: {query} and {document} replaced, special
         * tokens in the template parsed */
        struct thaw_buf b = {0};
        for (const char *p = tmpl; *p;) {
            const char *next = strchr(p, '{');
            if (!next) {
                thaw_buf_append(&b, p, strlen(p));
                break;
            }
            thaw_buf_append(&b, p, (size_t)(next - p));
            if (strncmp(next, "{query}", 7) == 0) {
                thaw_buf_append(&b, query, strlen(query));
                p = next + 7;
            } else if (strncmp(next, "{document}", 10) == 0) {
                thaw_buf_append(&b, doc, strlen(doc));
                p = next + 10;
            } else {
                thaw_buf_append(&b, "{", 1);
                p = next + 1;
            }
        }
        rc = b.oom ? THAW_ENOMEM : tokenize(chat, b.data ? b.data : "", false, true, out, n_out);
        thaw_buf_free(&b);
        return rc;
    }
    /* [BOS] query [EOS] [SEP] document [EOS], each marker as the vocab adds
     * it (a BERT vocab: [CLS] query [SEP] [SEP] document [SEP]); the texts'
     * own special-token spellings are text */
    if (eos == LLAMA_TOKEN_NULL)
        eos = llama_vocab_sep(chat->vocab);
    llama_token bos = llama_vocab_bos(chat->vocab), sep = llama_vocab_sep(chat->vocab);
    bool add_eos = llama_vocab_get_add_eos(chat->vocab);
    if ((rc = tokenize(chat, query, false, false, &q, &nq)) != 0 || (rc = tokenize(chat, doc, false, false, &d, &nd)) != 0)
        goto out;
    if ((llama_vocab_get_add_bos(chat->vocab) && (rc = append_tokens(&res, &n, &cap, &bos, 1)) != 0) ||
        (rc = append_tokens(&res, &n, &cap, q, nq)) != 0 || (add_eos && (rc = append_tokens(&res, &n, &cap, &eos, 1)) != 0) ||
        (llama_vocab_get_add_sep(chat->vocab) && (rc = append_tokens(&res, &n, &cap, &sep, 1)) != 0) ||
        (rc = append_tokens(&res, &n, &cap, d, nd)) != 0 || (add_eos && (rc = append_tokens(&res, &n, &cap, &eos, 1)) != 0))
        goto out;
    if (!res && !(res = malloc(sizeof *res))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    *out = res;
    *n_out = n;
    res = NULL;
out:
    free(res);
    free(d);
    free(q);
    return rc;
}

int thaw_chat_tokenize_plain(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out)
{
    return tokenize(chat, text, false, false, out, n_out);
}

int thaw_chat_resolve_bias(const struct thaw_chat *chat, struct thaw_chat_request *req, char *err, size_t errlen)
{
    int n_vocab = thaw_chat_n_vocab(chat), cap = 0;

    for (int i = 0; i < req->n_bias; i++) {
        llama_token *toks = NULL;
        int n = 1;
        /* a text: each of its tokens as it reads inside a reply */
        if (req->bias[i].text && thaw_chat_tokenize_plain(chat, req->bias[i].text, &toks, &n) != 0)
            return THAW_ENOMEM;
        if (!req->bias[i].text && req->bias[i].token >= n_vocab) {
            snprintf(err, errlen, "logit_bias: token %d is not in the vocabulary (%d tokens)", req->bias[i].token,
                     n_vocab);
            return THAW_EINVAL;
        }
        if (req->n_bias_tok + n > cap) {
            int nc = 2 * (req->n_bias_tok + n);
            int32_t *nt = realloc(req->bias_tok, (size_t)nc * sizeof *nt);
            if (nt)
                req->bias_tok = nt;
            float *nv = nt ? realloc(req->bias_val, (size_t)nc * sizeof *nv) : NULL;
            if (!nt || !nv) {
                free(toks);
                return THAW_ENOMEM;
            }
            req->bias_val = nv;
            cap = nc;
        }
        for (int j = 0; j < n; j++) {
            req->bias_tok[req->n_bias_tok] = toks ? toks[j] : req->bias[i].token;
            req->bias_val[req->n_bias_tok++] = req->bias[i].bias;
        }
        free(toks);
    }
    return 0;
}

char *thaw_chat_token_piece(const struct thaw_chat *chat, llama_token tok)
{
    /* an image's placeholder (vision.h): no vocabulary piece */
    if (tok < 0 || tok >= llama_vocab_n_tokens(chat->vocab))
        return strdup("");
    char *buf = malloc(256);
    int got = buf ? llama_token_to_piece(chat->vocab, tok, buf, 255, 0, true) : -1;

    if (buf && got < 0) {
        char *nb = realloc(buf, (size_t)-got + 1);
        got = nb ? llama_token_to_piece(chat->vocab, tok, nb, -got, 0, true) : -1;
        buf = nb ? nb : (free(buf), NULL);
    }
    if (!buf || got < 0) {
        free(buf);
        return NULL;
    }
    buf[got] = '\0';
    return buf;
}

char *thaw_chat_prompt_text(const struct thaw_chat *chat, const llama_token *toks, int n)
{
    struct thaw_buf text = {0};
    char *out = NULL;

    thaw_buf_reserve(&text, 1);
    for (int i = 0; i < n && !text.oom; i++) {
        char *piece = thaw_chat_token_piece(chat, toks[i]);
        if (!piece || thaw_buf_puts(&text, piece) != 0) {
            free(piece);
            thaw_buf_free(&text);
            return NULL;
        }
        free(piece);
    }
    if (!text.oom)
        out = thaw_utf8_sanitize(text.data ? text.data : "", text.len);
    thaw_buf_free(&text);
    return out;
}

char *thaw_chat_detokenize(const struct thaw_chat *chat, const llama_token *toks, int n)
{
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= llama_vocab_n_tokens(chat->vocab))
            return NULL;
    int cap = n * 8 + 16;
    char *buf = malloc((size_t)cap);
    if (!buf)
        return NULL;
    int got = llama_detokenize(chat->vocab, toks, n, buf, cap, false, false);
    if (got < 0) {
        cap = -got + 1;
        char *nb = realloc(buf, (size_t)cap);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        got = llama_detokenize(chat->vocab, toks, n, buf, cap, false, false);
    }
    if (got < 0) {
        free(buf);
        return NULL;
    }
    buf[got] = '\0';
    return buf;
}

int thaw_chat_n_vocab(const struct thaw_chat *chat) { return llama_vocab_n_tokens(chat->vocab); }

/* ---- replies ---------------------------------------------------------------------- */

/* The inputs JSON `in` rendered and tokenized. */
static int render_input(const struct thaw_chat *chat, const char *in, llama_token **tokens, int *n_tokens)
{
    char err[256];
    char *out = thaw_tmpl_apply(chat->tmpl, in, err, sizeof err);
    json_t *res = NULL;
    json_error_t jerr;
    int rc = THAW_ENOMEM;

    if (!out)
        return THAW_EINVAL;
    if ((res = json_loads(out, 0, &jerr)))
        rc = thaw_chat_tokenize(chat, json_string_value(json_object_get(res, "prompt")), tokens, n_tokens);
    json_decref(res);
    free(out);
    return rc;
}

static char *history_input(const struct thaw_chat *chat, const struct thaw_chat_request *req, const char *const *extra,
                           int n_extra)
{
    /* the history the reply joins: without a message rendered for its request only */
    return inputs_json(chat, req, thaw_chat_request_n_history(req), extra, n_extra, false, false);
}

static int render_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req, const char *const *extra,
                         int n_extra, llama_token **tokens, int *n_tokens)
{
    char *in = history_input(chat, req, extra, n_extra);
    int rc = in ? render_input(chat, in, tokens, n_tokens) : THAW_ENOMEM;

    free(in);
    return rc;
}

/* A remembered branch point for (ns, in): its tokens copied out, or -1. */
static int memo_find(struct branch_memos *m, const uint8_t *ns, const char *in, llama_token **tokens)
{
    int n = -1;

    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < BRANCH_MEMO_N; i++) {
        struct branch_memo *e = &m->e[i];
        if (!e->in || memcmp(e->ns, ns, THAW_KEY_BYTES) != 0 || strcmp(e->in, in) != 0)
            continue;
        if ((*tokens = malloc(((size_t)e->n + 1) * sizeof **tokens))) {
            memcpy(*tokens, e->tokens, (size_t)e->n * sizeof **tokens);
            n = e->n;
            e->used = ++m->clock;
        }
        break;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* Remembers (ns, in) -> tokens[0, n), taking `in`, over the least recently used. */
static void memo_put(struct branch_memos *m, const uint8_t *ns, char *in, const llama_token *tokens, int n)
{
    llama_token *copy = malloc(((size_t)n + 1) * sizeof *copy);

    if (!copy) {
        free(in);
        return;
    }
    memcpy(copy, tokens, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&m->mu);
    struct branch_memo *e = &m->e[0];
    for (int i = 1; i < BRANCH_MEMO_N; i++)
        if (m->e[i].used < e->used)
            e = &m->e[i];
    free(e->in);
    free(e->tokens);
    *e = (struct branch_memo){.in = in, .tokens = copy, .n = n, .used = ++m->clock};
    memcpy(e->ns, ns, THAW_KEY_BYTES);
    pthread_mutex_unlock(&m->mu);
}

int thaw_chat_branch_point(const struct thaw_chat *chat, const uint8_t *ns, const struct thaw_chat_request *req,
                           const llama_token *prompt, int n_prompt, bool *remembered)
{
    /* [lead..., user "a"] and [lead..., user "b"] agree up to the user's
     * text: the leading messages as the template renders them, with the
     * user turn's opening glue, whatever the conversation goes on with */
    static const char *const a[1] = {"{\"role\":\"user\",\"content\":\"a\"}"};
    static const char *const b[1] = {"{\"role\":\"user\",\"content\":\"b\"}"};
    struct thaw_chat_request lead = *req;
    llama_token *ta = NULL, *tb = NULL;
    int na = 0, nb = 0, n = -1;
    char *in;

    *remembered = false;
    lead.last_transient = false; /* the lead is history whatever the request's last message is */
    lead.n_messages = 0;
    while (lead.n_messages < req->n_messages && req->messages[lead.n_messages].role &&
           (strcmp(req->messages[lead.n_messages].role, "system") == 0 ||
            strcmp(req->messages[lead.n_messages].role, "developer") == 0 ||
            strcmp(req->messages[lead.n_messages].role, "tool") == 0))
        lead.n_messages++;
    if (lead.n_messages == 0 || lead.n_messages == req->n_messages || !(in = history_input(chat, &lead, a, 1)))
        return 0;
    if ((n = memo_find(chat->memos, ns, in, &ta)) >= 0) {
        *remembered = true;
        free(in);
    } else if (render_input(chat, in, &ta, &na) == 0 && render_tokens(chat, &lead, b, 1, &tb, &nb) == 0) {
        n = thaw_lcp(ta, na, tb, nb);
        memo_put(chat->memos, ns, in, ta, n);
    } else {
        free(in);
    }
    if (n > 0)
        n = thaw_lcp(ta, n, prompt, n_prompt); /* as this prompt tokenised it */
    free(ta);
    free(tb);
    return n > 0 && n < n_prompt ? n : 0;
}

int thaw_chat_prefix_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req, int n_msgs,
                            const llama_token *prompt, int n_prompt)
{
    /* [first n_msgs..., user "a"]: those messages as every conversation
     * going on from them renders them (tools included), as far as this
     * prompt agrees with it */
    static const char *const a[1] = {"{\"role\":\"user\",\"content\":\"a\"}"};
    struct thaw_chat_request lead = *req;
    llama_token *ta = NULL;
    int na = 0, n = 0;

    if (req->raw || n_msgs < 0 || (size_t)n_msgs > req->n_messages)
        return 0;
    lead.n_messages = (size_t)n_msgs;
    lead.last_transient = false;
    if (render_tokens(chat, &lead, a, 1, &ta, &na) == 0)
        n = thaw_lcp(ta, na, prompt, n_prompt);
    free(ta);
    return n;
}

int thaw_chat_canonical(const struct thaw_chat *chat, const struct thaw_chat_request *req, const char *reply_json,
                        llama_token **tokens, int *n_tokens)
{
    if (req->raw) /* a raw prompt has no template: the next request presents the tokens as they are */
        return THAW_EINVAL;
    /* The next turn renders [..., reply, next]. Two such renderings with
     * different next messages agree up to the next message's text: that
     * common prefix is what the next turn will present, with whatever the
     * template does to the reply once it is history (end-of-turn markers,
     * reasoning stripped) and the next turn's opening glue. */
    const char *a[2] = {reply_json, "{\"role\":\"user\",\"content\":\"a\"}"};
    const char *b[2] = {reply_json, "{\"role\":\"user\",\"content\":\"b\"}"};
    llama_token *ta = NULL, *tb = NULL;
    int na = 0, nb = 0, rc;

    if ((rc = render_tokens(chat, req, a, 2, &ta, &na)) != 0 || (rc = render_tokens(chat, req, b, 2, &tb, &nb)) != 0) {
        free(ta);
        return rc;
    }
    int n = 0;
    while (n < na && n < nb && ta[n] == tb[n])
        n++;
    free(tb);
    *tokens = ta;
    *n_tokens = n;
    return 0;
}

/* The text the template renders for the history, the reply and `next`
 * (render_tokens without the tokenizer), or NULL. */
static char *render_text(const struct thaw_chat *chat, const struct thaw_chat_request *req, const char *const *extra,
                         int n_extra)
{
    char err[256], *in = history_input(chat, req, extra, n_extra), *out = in ? thaw_tmpl_apply(chat->tmpl, in, err,
                                                                                               sizeof err)
                                                                              : NULL;
    json_t *res = NULL;
    json_error_t jerr;
    char *text = NULL;

    if (out && (res = json_loads(out, 0, &jerr)) && json_is_string(json_object_get(res, "prompt")))
        text = strdup(json_string_value(json_object_get(res, "prompt")));
    json_decref(res);
    free(out);
    free(in);
    return text;
}

/* Where the text after s's last `marker` starts, or NULL when s has none. */
static const char *after_last(const char *s, const char *marker)
{
    const char *at = NULL;

    for (const char *p = s; (p = strstr(p, marker)) != NULL; p++)
        at = p;
    return at ? at + strlen(marker) : NULL;
}

int thaw_chat_canonical_spliced(const struct thaw_chat *chat, const struct thaw_chat_request *req,
                                const char *reply_json, const char *rendered, const char *marker,
                                const llama_token *prompt, int n_prompt, llama_token **tokens, int *n_tokens)
{
    const char *a[2] = {reply_json, "{\"role\":\"user\",\"content\":\"a\"}"};
    const char *b[2] = {reply_json, "{\"role\":\"user\",\"content\":\"b\"}"};
    char *ra = NULL, *rb = NULL;
    llama_token *tp = NULL, *ta = NULL, *tb = NULL, *out = NULL;
    int np = 0, na = 0, nb = 0, rc = THAW_EINVAL;
    const char *tail = after_last(rendered, marker);

    if (req->raw || !tail)
        return THAW_EINVAL;
    size_t head = (size_t)(tail - rendered);
    if (!(ra = render_text(chat, req, a, 2)) || !(rb = render_text(chat, req, b, 2))) {
        rc = THAW_ENOMEM;
        goto done;
    }
    /* the same text, images and all, up to the last image's marker */
    if (after_last(ra, marker) != ra + head || after_last(rb, marker) != rb + head || memcmp(ra, rendered, head) != 0 ||
        memcmp(rb, rendered, head) != 0)
        goto done;
    /* the prompt's own tail is that text tokenized alone: what precedes it
     * in the prompt is the vision tokenizer's, kept as it is */
    if ((rc = tokenize_piece(chat, tail, &tp, &np)) != 0 || (rc = tokenize_piece(chat, ra + head, &ta, &na)) != 0 ||
        (rc = tokenize_piece(chat, rb + head, &tb, &nb)) != 0)
        goto done;
    rc = THAW_EINVAL;
    if (np > n_prompt || memcmp(prompt + n_prompt - np, tp, (size_t)np * sizeof *tp) != 0)
        goto done;
    int m = thaw_lcp(ta, na, tb, nb), keep = n_prompt - np;
    if (!(out = malloc(((size_t)keep + (size_t)m + 1) * sizeof *out))) {
        rc = THAW_ENOMEM;
        goto done;
    }
    memcpy(out, prompt, (size_t)keep * sizeof *out);
    memcpy(out + keep, ta, (size_t)m * sizeof *out);
    *tokens = out;
    *n_tokens = keep + m;
    rc = 0;
done:
    free(ra);
    free(rb);
    free(tp);
    free(ta);
    free(tb);
    return rc;
}

int thaw_chat_gen_prompt_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req)
{
    static const char *const one[1] = {"{\"role\":\"user\",\"content\":\"a\"}"};
    /* without the tools, choice and schema: they render before the
     * messages, and the generation prompt does not depend on them */
    struct thaw_chat_request bare = *req;
    llama_token *tg = NULL, *th = NULL;
    int ng = 0, nh = 0, n = 0;
    char *ing = NULL, *inh = NULL;

    if (req->raw || !req->add_generation_prompt || req->continue_final)
        return 0;
    bare.tools_json = NULL;
    bare.tool_choice = NULL;
    bare.tool_choice_name = NULL;
    bare.json_schema = NULL;
    if ((ing = inputs_json(chat, &bare, 0, one, 1, true, false)) &&
        (inh = inputs_json(chat, &bare, 0, one, 1, false, false)) && render_input(chat, ing, &tg, &ng) == 0 &&
        render_input(chat, inh, &th, &nh) == 0)
        n = ng - thaw_lcp(tg, ng, th, nh);
    free(ing);
    free(inh);
    free(tg);
    free(th);
    return n > 0 ? n : 0;
}

int thaw_chat_parse_reply(const char *parser, const char *text, bool partial, const char *id_prefix, char **msg_json,
                          char **norm_json, char *err, size_t errlen)
{
    json_t *msg = NULL;
    json_error_t jerr;
    char *raw = NULL;
    int rc = THAW_ENOMEM;

    *msg_json = NULL;
    if (norm_json)
        *norm_json = NULL;
    if (parser) {
        if (!(raw = thaw_tmpl_parse(parser, text, partial, err, errlen)))
            return THAW_EINVAL;
        msg = json_loads(raw, 0, &jerr);
    } else {
        msg = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    }
    if (!msg)
        goto done;
    json_t *calls = json_object_get(msg, "tool_calls"), *c;
    size_t i;
    json_array_foreach(calls, i, c) {
        char id[64];
        snprintf(id, sizeof id, "call_%s%zu", id_prefix, i);
        json_object_set_new(c, "id", json_string(id));
    }
    json_t *content = json_object_get(msg, "content");
    if (json_array_size(calls) > 0 && (!json_is_string(content) || json_string_length(content) == 0))
        json_object_set_new(msg, "content", json_null());
    else if (!json_is_string(content))
        json_object_set_new(msg, "content", json_string(""));
    json_t *rc_ = json_object_get(msg, "reasoning_content");
    if (rc_ && (!json_is_string(rc_) || json_string_length(rc_) == 0))
        json_object_del(msg, "reasoning_content");
    if (json_array_size(calls) == 0)
        json_object_del(msg, "tool_calls");
    if (!(*msg_json = json_dumps(msg, JSON_COMPACT)))
        goto done;
    rc = norm_json ? thaw_api_normalize_message(*msg_json, norm_json, err, errlen) : 0;
    if (rc != 0) {
        free(*msg_json);
        *msg_json = NULL;
    }
done:
    json_decref(msg);
    free(raw);
    return rc;
}
