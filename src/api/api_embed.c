/* api_embed.c — llama-server's embeddings and rerank endpoints
 * (api_embed.h): requests into prompts, vectors and scores into replies.
 *
 * Map:
 *   ---- inputs ----     one input (string, ids, or both mixed) -> tokens
 *   ---- embeddings ---- the request, the reply in either shape
 *   ---- rerank ----     the request, the reply in Jina's or TEI's shape
 */
#include "api/api_embed.h"

#include "api/api_wire.h"
#include "base/error.h"

#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define fail thaw_api_fail /* the short name this file's checks use */

/* float32 round-trips through 9 significant digits */
static char *dump(json_t *root)
{
    char *s = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;

    json_decref(root);
    return s;
}

/* "model" as sent: a string, else none */
static char *model_of(json_t *root)
{
    json_t *m = json_object_get(root, "model");

    return json_is_string(m) ? strdup(json_string_value(m)) : NULL;
}

/* ---- inputs ------------------------------------------------------------------------ */

/* An array holding a number somewhere: one prompt (ids, or ids and strings) */
static bool has_number(json_t *a)
{
    size_t i;
    json_t *v;

    json_array_foreach(a, i, v)
        if (json_is_integer(v))
            return true;
    return false;
}

/* Appends n tokens to p (*n of *cap). 0 or THAW_ENOMEM. */
static int push(llama_token **p, int *n, int *cap, const llama_token *toks, int k)
{
    if (*n + k > *cap) {
        int nc = 2 * (*n + k) + 16;
        llama_token *np = realloc(*p, (size_t)nc * sizeof *np);
        if (!np)
            return THAW_ENOMEM;
        *p = np;
        *cap = nc;
    }
    memcpy(*p + *n, toks, (size_t)k * sizeof *toks);
    *n += k;
    return 0;
}

/* One prompt from `in`: a string (special tokens added, their spellings
 * parsed), or an array of ids and strings (a leading string gets the
 * special tokens, later ones none; ids as given). Ids outside the
 * vocabulary are refused. Returns 0, THAW_EINVAL or THAW_ENOMEM. */
static int tokenize_input(const struct thaw_chat *chat, json_t *in, const char *what, llama_token **out, int *n_out,
                          char *err, size_t errlen)
{
    llama_token *p = NULL, *t = NULL;
    int n = 0, cap = 0, nt = 0, rc = 0, n_vocab = thaw_chat_n_vocab(chat);
    json_t *items = json_is_string(in) ? json_pack("[O]", in) : json_incref(in);
    size_t i;
    json_t *v;

    if (!items)
        return THAW_ENOMEM;
    if (!json_is_array(items)) {
        rc = fail(err, errlen,
                  "%s must be a string, a list of token ids, a list of strings and token ids, or a list of those",
                  what);
        goto out;
    }
    json_array_foreach(items, i, v) {
        if (json_is_string(v)) {
            rc = thaw_chat_tokenize_text(chat, json_string_value(v), i == 0, &t, &nt);
            if (rc == THAW_EINVAL || rc == THAW_ETOOBIG)
                rc = fail(err, errlen, "%s: a text could not be tokenized", what);
            if (rc == 0)
                rc = push(&p, &n, &cap, t, nt);
            free(t);
            t = NULL;
        } else if (json_is_integer(v)) {
            json_int_t id = json_integer_value(v);
            if (id < 0 || id >= n_vocab) {
                rc = fail(err, errlen, "%s: token %lld is not in the vocabulary (%d tokens)", what, (long long)id,
                          n_vocab);
            } else {
                llama_token tok = (llama_token)id;
                rc = push(&p, &n, &cap, &tok, 1);
            }
        } else {
            rc = fail(err, errlen, "%s: a list's elements must be strings or token ids (integers)", what);
        }
        if (rc != 0)
            goto out;
    }
    if (n == 0) {
        /* a vocab that adds no BOS tokenizes "" to nothing */
        rc = fail(err, errlen, "Input content cannot be empty");
        goto out;
    }
    *out = p;
    *n_out = n;
    p = NULL;
out:
    free(p);
    json_decref(items);
    return rc;
}

/* ---- embeddings --------------------------------------------------------------------- */

void thaw_api_embed_request_free(struct thaw_embed_request *r)
{
    for (int i = 0; r->prompts && i < r->n_prompts; i++)
        free(r->prompts[i]);
    free(r->prompts);
    free(r->n_prompt);
    free(r->model);
    memset(r, 0, sizeof *r);
}

int thaw_api_parse_embed(const char *body, size_t len, bool oai_route, const struct thaw_chat *chat,
                         int default_normalize, struct thaw_embed_request *out, char *err, size_t errlen)
{
    json_t *root, *in, *v;
    int rc = 0;

    memset(out, 0, sizeof *out);
    out->embd_normalize = default_normalize;
    if (!(root = thaw_api_load_object(body, len, err, errlen)))
        return THAW_EINVAL;
    out->oai = oai_route;
    if (!(in = json_object_get(root, "input"))) {
        in = json_object_get(root, "content");
        out->oai = false; /* "content" is llama-server's own field: its own shape */
    }
    if (!in) {
        rc = fail(err, errlen, "\"input\" or \"content\" must be provided");
        goto out;
    }
    if ((v = json_object_get(root, "encoding_format")) && !json_is_null(v)) {
        const char *f = json_string_value(v);
        if (!f || (strcmp(f, "float") != 0 && strcmp(f, "base64") != 0)) {
            rc = fail(err, errlen, "The format to return the embeddings in. Can be either float or base64");
            goto out;
        }
        out->base64 = strcmp(f, "base64") == 0;
    }
    if ((v = json_object_get(root, "embd_normalize")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > (1 << 20)) {
            rc = fail(err, errlen, "\"embd_normalize\" must be an integer from -1 to %d", 1 << 20);
            goto out;
        }
        out->embd_normalize = (int)json_integer_value(v);
    }
    out->model = model_of(root);

    /* a list of prompts, unless it is one prompt made of ids (and strings) */
    bool many = json_is_array(in) && !has_number(in);
    size_t n = many ? json_array_size(in) : 1;
    if (n == 0) {
        rc = fail(err, errlen, "\"input\" must not be empty");
        goto out;
    }
    if (n > THAW_API_MAX_EMBED_INPUTS) {
        rc = fail(err, errlen, "at most %d inputs per request, got %zu", THAW_API_MAX_EMBED_INPUTS, n);
        goto out;
    }
    out->prompts = calloc(n, sizeof *out->prompts);
    out->n_prompt = calloc(n, sizeof *out->n_prompt);
    if (!out->prompts || !out->n_prompt) {
        rc = THAW_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char what[48];
        json_t *one = many ? json_array_get(in, i) : in;
        if (many)
            snprintf(what, sizeof what, "input %zu", i);
        else
            snprintf(what, sizeof what, "input");
        if (json_is_object(one)) { /* llama-server's JSON prompt: {"prompt_string", "multimodal_data"?} */
            json_t *media = json_object_get(one, "multimodal_data");
            if (media && !(json_is_array(media) && json_array_size(media) == 0)) {
                rc = fail(err, errlen, "%s: multimodal_data: this server embeds text only (images are read by the "
                          "chat routes)", what);
                goto out;
            }
            one = json_object_get(one, "prompt_string"); /* json_is_string evaluates its argument twice */
            if (!json_is_string(one)) {
                rc = fail(err, errlen, "%s as an object needs a string 'prompt_string'", what);
                goto out;
            }
        }
        if (many && !json_is_string(one) && !json_is_array(one)) {
            rc = fail(err, errlen, "%s must be a string, a list of token ids (and strings) or a JSON prompt", what);
            goto out;
        }
        if ((rc = tokenize_input(chat, one, what, &out->prompts[i], &out->n_prompt[i], err, errlen)) != 0)
            goto out;
        out->n_prompts++;
    }
out:
    json_decref(root);
    return rc;
}

/* rows x n floats as a list of numbers (non-finite ones as 0) */
static json_t *floats(const float *v, int n)
{
    json_t *a = json_array();

    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real(isfinite(v[i]) ? (double)v[i] : 0.0)) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* the float32 bytes, base64 (OpenAI's encoding_format base64) */
static json_t *floats_base64(const float *v, int n)
{
    size_t len = sodium_base64_encoded_len((size_t)n * sizeof *v, sodium_base64_VARIANT_ORIGINAL);
    char *b = malloc(len);
    json_t *s = NULL;

    if (b) {
        sodium_bin2base64(b, len, (const unsigned char *)v, (size_t)n * sizeof *v, sodium_base64_VARIANT_ORIGINAL);
        s = json_string(b);
    }
    free(b);
    return s;
}

char *thaw_api_embed_reply(const struct thaw_embed_request *r, const char *model, const struct thaw_embed_vec *vecs)
{
    json_t *data = json_array();
    long long n_tokens = 0;

    for (int i = 0; data && i < r->n_prompts; i++) {
        const struct thaw_embed_vec *e = &vecs[i];
        json_t *item = NULL;
        n_tokens += e->n_tokens;
        if (r->oai) {
            /* one vector (pooled) */
            json_t *emb = r->base64 ? floats_base64(e->v, e->n) : floats(e->v, e->n);
            item = r->base64 ? json_pack("{s:o?, s:i, s:s, s:s}", "embedding", emb, "index", i, "object", "embedding",
                                         "encoding_format", "base64")
                             : json_pack("{s:o?, s:i, s:s}", "embedding", emb, "index", i, "object", "embedding");
            if (item && !emb) {
                json_decref(item);
                item = NULL;
            }
        } else {
            /* llama-server's: a list of vectors (one pooled, or one per token) */
            json_t *rows = json_array();
            for (int k = 0; rows && k < e->rows; k++)
                if (json_array_append_new(rows, floats(e->v + (size_t)k * (size_t)e->n, e->n)) != 0) {
                    json_decref(rows);
                    rows = NULL;
                }
            item = rows ? json_pack("{s:i, s:o}", "index", i, "embedding", rows) : NULL;
        }
        if (!item || json_array_append_new(data, item) != 0) {
            json_decref(data);
            data = NULL;
        }
    }
    if (!data || !r->oai)
        return dump(data);
    return dump(json_pack("{s:s, s:s, s:{s:I, s:I}, s:o}", "model", r->model ? r->model : model, "object", "list",
                          "usage", "prompt_tokens", (json_int_t)n_tokens, "total_tokens", (json_int_t)n_tokens,
                          "data", data));
}

/* ---- rerank ------------------------------------------------------------------------- */

void thaw_api_rerank_request_free(struct thaw_rerank_request *r)
{
    for (int i = 0; i < r->n_docs; i++) {
        if (r->prompts)
            free(r->prompts[i]);
        if (r->docs)
            free(r->docs[i]);
    }
    free(r->prompts);
    free(r->n_prompt);
    free(r->docs);
    free(r->model);
    memset(r, 0, sizeof *r);
}

int thaw_api_parse_rerank(const char *body, size_t len, const struct thaw_chat *chat, struct thaw_rerank_request *out,
                          char *err, size_t errlen)
{
    json_t *root, *q, *docs, *v;
    size_t i;
    int rc = 0;

    memset(out, 0, sizeof *out);
    if (!(root = thaw_api_load_object(body, len, err, errlen)))
        return THAW_EINVAL;
    out->tei = json_object_get(root, "texts") != NULL;
    if (!(q = json_object_get(root, "query"))) {
        rc = fail(err, errlen, "\"query\" must be provided");
        goto out;
    }
    if (!json_is_string(q)) {
        rc = fail(err, errlen, "\"query\" must be a string");
        goto out;
    }
    docs = json_object_get(root, "documents");
    if (!docs)
        docs = json_object_get(root, "texts");
    size_t n = json_is_array(docs) ? json_array_size(docs) : 0;
    json_array_foreach(docs, i, v)
        if (!json_is_string(v))
            n = 0;
    if (n == 0) {
        rc = fail(err, errlen, "\"documents\" must be a non-empty string array");
        goto out;
    }
    if (n > THAW_API_MAX_EMBED_INPUTS) {
        rc = fail(err, errlen, "at most %d documents per request, got %zu", THAW_API_MAX_EMBED_INPUTS, n);
        goto out;
    }
    out->top_n = (int)n;
    if ((v = json_object_get(root, "top_n")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            rc = fail(err, errlen, "\"top_n\" must be an integer >= 0");
            goto out;
        }
        if (json_integer_value(v) < (json_int_t)n)
            out->top_n = (int)json_integer_value(v);
    }
    if ((rc = thaw_api_get_bool(root, "return_text", &out->return_text, err, errlen)) != 0)
        goto out;
    out->return_text = out->return_text && out->tei; /* TEI's field: Jina's results carry no text */
    out->model = model_of(root);
    out->docs = calloc(n, sizeof *out->docs);
    out->prompts = calloc(n, sizeof *out->prompts);
    out->n_prompt = calloc(n, sizeof *out->n_prompt);
    if (!out->docs || !out->prompts || !out->n_prompt) {
        rc = THAW_ENOMEM;
        goto out;
    }
    for (i = 0; i < n; i++) {
        out->n_docs++;
        if (!(out->docs[i] = strdup(json_string_value(json_array_get(docs, i))))) {
            rc = THAW_ENOMEM;
            goto out;
        }
        rc = thaw_chat_rerank_prompt(chat, json_string_value(q), out->docs[i], &out->prompts[i], &out->n_prompt[i]);
        if (rc == THAW_EINVAL || rc == THAW_ETOOBIG)
            rc = fail(err, errlen, "document %zu: the query and document could not be tokenized", i);
        if (rc != 0)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

struct ranked {
    int index;
    float score;
};

/* best first; equal scores in document order */
static int by_score(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;

    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->index - y->index;
}

char *thaw_api_rerank_reply(const struct thaw_rerank_request *r, const char *model, const float *scores,
                            const int *n_tokens)
{
    struct ranked *rk = malloc((size_t)r->n_docs * sizeof *rk);
    json_t *results = json_array();
    long long total = 0;

    if (!rk || !results) {
        free(rk);
        json_decref(results);
        return NULL;
    }
    for (int i = 0; i < r->n_docs; i++) {
        rk[i] = (struct ranked){i, isfinite(scores[i]) ? scores[i] : -1e6f};
        total += n_tokens[i];
    }
    qsort(rk, (size_t)r->n_docs, sizeof *rk, by_score);
    for (int k = 0; results && k < r->top_n; k++) {
        json_t *item = json_pack("{s:i, s:f}", "index", rk[k].index, r->tei ? "score" : "relevance_score",
                                 (double)rk[k].score);
        if (item && r->return_text && json_object_set_new(item, "text", json_string(r->docs[rk[k].index])) != 0) {
            json_decref(item);
            item = NULL;
        }
        if (!item || json_array_append_new(results, item) != 0) {
            json_decref(results);
            results = NULL;
        }
    }
    free(rk);
    if (!results || r->tei)
        return dump(results);
    return dump(json_pack("{s:s, s:s, s:{s:I, s:I}, s:o}", "model", r->model ? r->model : model, "object", "list",
                          "usage", "prompt_tokens", (json_int_t)total, "total_tokens", (json_int_t)total, "results",
                          results));
}
