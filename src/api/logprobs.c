/* logprobs.c — a reply's per-token probabilities (logprobs.h). */
#include "api/logprobs.h"

#include "base/error.h"
#include "base/utf8.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *nb = realloc(*p, c * size);
    if (!nb)
        return THAW_ENOMEM;
    *p = nb;
    *cap = c;
    return 0;
}

static size_t piece_bytes(const struct thaw_logprob_in *sampled, const struct thaw_logprob_in *top, int n_top)
{
    size_t n = sampled->n_piece;
    for (int i = 0; i < n_top; i++)
        n += top[i].n_piece;
    return n;
}

static uint32_t put_piece(struct thaw_logprobs *lp, const struct thaw_logprob_in *in)
{
    uint32_t off = (uint32_t)lp->n_bytes;
    memcpy(lp->bytes + lp->n_bytes, in->piece, in->n_piece);
    lp->n_bytes += in->n_piece;
    return off;
}

int thaw_logprobs_add(struct thaw_logprobs *lp, const struct thaw_logprob_in *sampled,
                      const struct thaw_logprob_in *top, int n_top, uint32_t start, uint32_t end)
{
    /* room for everything first, so a failure leaves the list as it was */
    if (grow((void **)&lp->v, &lp->cap, lp->n + 1, sizeof *lp->v) != 0 ||
        grow((void **)&lp->top, &lp->cap_top, lp->n_top + (size_t)n_top + 1, sizeof *lp->top) != 0 ||
        grow((void **)&lp->bytes, &lp->cap_bytes, lp->n_bytes + piece_bytes(sampled, top, n_top) + 1, 1) != 0)
        return THAW_ENOMEM;
    struct thaw_logprob_entry *e = &lp->v[lp->n++];
    e->tok = sampled->tok;
    e->p = sampled->p;
    e->start = start;
    e->end = end;
    e->n_piece = (uint32_t)sampled->n_piece;
    e->piece_off = put_piece(lp, sampled);
    e->top_off = (uint32_t)lp->n_top;
    e->n_top = (uint32_t)n_top;
    for (int i = 0; i < n_top; i++) {
        struct thaw_logprob_top *t = &lp->top[lp->n_top++];
        t->tok = top[i].tok;
        t->p = top[i].p;
        t->n_piece = (uint32_t)top[i].n_piece;
        t->piece_off = put_piece(lp, &top[i]);
    }
    return 0;
}

void thaw_logprobs_free(struct thaw_logprobs *lp)
{
    free(lp->v);
    free(lp->top);
    free(lp->bytes);
    memset(lp, 0, sizeof *lp);
}

size_t thaw_logprobs_upto(const struct thaw_logprobs *lp, size_t from, size_t n_text, bool done)
{
    size_t k = from;

    while (k < lp->n && (lp->v[k].end <= n_text || (done && lp->v[k].start < n_text)))
        k++;
    return k;
}

/* log(p) as llama-server writes it: JSON has no -inf, so p == 0 is the
 * lowest float */
static double logarithm(float p) { return p == 0.0f ? -FLT_MAX : log(p); }

/* "token" (valid UTF-8, cut before a character the piece cuts) and
 * "bytes" (all of them) into o */
static int set_piece(json_t *o, const char *piece, size_t n)
{
    json_t *bytes = json_array();
    size_t ok = thaw_utf8_complete_len(piece, n);
    char *txt = thaw_utf8_sanitize(piece, ok);

    if (!bytes || !txt) {
        json_decref(bytes);
        free(txt);
        return THAW_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    json_object_set_new(o, "token", json_string(txt));
    json_object_set_new(o, "bytes", bytes);
    free(txt);
    return 0;
}

static json_t *one(const struct thaw_logprobs *lp, int32_t tok, float p, uint32_t off, uint32_t n, bool post)
{
    json_t *o = json_object();

    if (!o)
        return NULL;
    json_object_set_new(o, "id", json_integer(tok));
    if (set_piece(o, lp->bytes + off, n) != 0) {
        json_decref(o);
        return NULL;
    }
    json_object_set_new(o, post ? "prob" : "logprob", json_real(post ? (double)p : logarithm(p)));
    return o;
}

json_t *thaw_logprobs_json(const struct thaw_logprobs *lp, size_t from, size_t to, bool post, bool legacy)
{
    json_t *arr = json_array(), *tokens = NULL, *lps = NULL, *tops = NULL, *offs = NULL, *obj = NULL;

    if (!arr)
        return NULL;
    if (legacy && !((tokens = json_array()) && (lps = json_array()) && (tops = json_array()) &&
                    (offs = json_array()) && (obj = json_object())))
        goto enomem;
    for (size_t i = from; i < to && i < lp->n; i++) {
        const struct thaw_logprob_entry *e = &lp->v[i];
        json_t *o = one(lp, e->tok, e->p, e->piece_off, e->n_piece, post), *top = json_array();
        json_t *ltop = legacy ? json_object() : NULL;
        if (!o || !top || (legacy && !ltop)) {
            json_decref(o);
            json_decref(top);
            json_decref(ltop);
            goto enomem;
        }
        for (uint32_t j = 0; j < e->n_top; j++) {
            const struct thaw_logprob_top *t = &lp->top[e->top_off + j];
            json_t *c = one(lp, t->tok, t->p, t->piece_off, t->n_piece, post);
            if (!c) {
                json_decref(o);
                json_decref(top);
                json_decref(ltop);
                goto enomem;
            }
            if (ltop)
                json_object_set(ltop, json_string_value(json_object_get(c, "token")),
                                json_object_get(c, post ? "prob" : "logprob"));
            json_array_append_new(top, c);
        }
        json_object_set_new(o, post ? "top_probs" : "top_logprobs", top);
        if (legacy) {
            json_array_append(tokens, json_object_get(o, "token"));
            json_array_append(lps, json_object_get(o, post ? "prob" : "logprob"));
            json_array_append_new(tops, ltop);
            json_array_append_new(offs, json_integer(e->start));
        }
        json_array_append_new(arr, o);
    }
    if (!legacy)
        return arr;
    json_object_set_new(obj, "content", arr);
    json_object_set_new(obj, "tokens", tokens);
    json_object_set_new(obj, "token_logprobs", lps);
    json_object_set_new(obj, "top_logprobs", tops);
    json_object_set_new(obj, "text_offset", offs);
    return obj;

enomem:
    json_decref(arr);
    json_decref(tokens);
    json_decref(lps);
    json_decref(tops);
    json_decref(offs);
    json_decref(obj);
    return NULL;
}
