/* kvtap.c — blocks cut straight from libllama's KV cache (kvtap.h). */
#include "kvtap.h"

#include "error.h"
#include "kvlayout.h"
#include "log.h"

#include <ggml-backend.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYER_ID 4096 /* as kvlayout.c: more is not a layout we know */

struct thaw_kvtap {
    /* learnt from the graphs */
    struct ggml_tensor **k, **v; /* the cache's tensors by layer id */
    int n_ids;                   /* room in k and v */
    const int32_t *pos;          /* the positions of the ubatch being computed */
    int64_t n_pos;
    uint32_t kv_size, n_stream;
    int32_t *cell; /* [stream][pos]: the cell holding pos, -1 unknown */
    int32_t *rev;  /* [stream][cell]: the pos cell holds per `cell`, -1 */
    /* after the self-test */
    struct thaw_kvlayout_mem *mem;
    int ready, off;
};

int thaw_kvtap_new(struct thaw_kvtap **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : THAW_ENOMEM;
}

void thaw_kvtap_free(struct thaw_kvtap *t)
{
    if (!t)
        return;
    free(t->k);
    free(t->v);
    free(t->cell);
    free(t->rev);
    thaw_kvlayout_mem_free(t->mem);
    free(t);
}

int thaw_kvtap_ready(const struct thaw_kvtap *t)
{
    return t && t->ready && !t->off;
}

/* Something the tap does not understand: off for good (stores capture). */
static void disable(struct thaw_kvtap *t, const char *fmt, ...)
{
    char why[160];
    va_list ap;

    if (t->off)
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    t->off = 1;
    if (t->ready)
        LOG_WRN("kv-cache: stores capture whole states from now on: %s", why);
    else
        LOG_DBG("kv tap off: %s", why);
}

static int grow_ids(struct thaw_kvtap *t, int il)
{
    if (il < t->n_ids)
        return 0;
    int n = il + 1 > 2 * t->n_ids ? il + 1 : 2 * t->n_ids;
    struct ggml_tensor **k = realloc(t->k, (size_t)n * sizeof *k);
    if (!k)
        return THAW_ENOMEM;
    t->k = k;
    struct ggml_tensor **v = realloc(t->v, (size_t)n * sizeof *v);
    if (!v)
        return THAW_ENOMEM;
    t->v = v;
    for (int i = t->n_ids; i < n; i++)
        t->k[i] = t->v[i] = NULL;
    t->n_ids = n;
    return 0;
}

/* The cells of a ubatch's tokens: K's index input, with the positions of
 * the ROPE node seen before it. */
static void learn_cells(struct thaw_kvtap *t, const struct ggml_tensor *node, const struct ggml_tensor *cache)
{
    const struct ggml_tensor *idx = node->src[1];
    uint32_t kv_size = (uint32_t)cache->ne[1], n_stream = (uint32_t)cache->ne[2];

    if (!idx || idx->type != GGML_TYPE_I64 || !idx->data ||
        (idx->buffer && !ggml_backend_buffer_is_host(idx->buffer))) {
        disable(t, "the cache's row indices are not readable");
        return;
    }
    int64_t n = ggml_nelements(idx);
    if (!t->pos || t->n_pos != n) {
        disable(t, "no positions for the cache's writes (%lld rows, %lld positions)", (long long)n,
                (long long)t->n_pos);
        return;
    }
    if (!t->cell) {
        size_t total = (size_t)kv_size * n_stream;
        if (!(t->cell = malloc(total * sizeof *t->cell)) || !(t->rev = malloc(total * sizeof *t->rev))) {
            free(t->cell);
            t->cell = NULL;
            disable(t, "out of memory");
            return;
        }
        memset(t->cell, 0xff, total * sizeof *t->cell);
        memset(t->rev, 0xff, total * sizeof *t->rev);
        t->kv_size = kv_size;
        t->n_stream = n_stream;
    } else if (kv_size != t->kv_size || n_stream != t->n_stream) {
        {
            disable(t, "the cache changed shape");
            return;
        }
    }
    const int64_t *rows = idx->data;
    for (int64_t j = 0; j < n; j++) {
        int64_t g = rows[j];
        int32_t p = t->pos[j];
        if (g < 0 || g >= (int64_t)kv_size * n_stream) {
            disable(t, "a cache row index out of range");
            return;
        }
        size_t st = (size_t)(g / kv_size), c = (size_t)(g % kv_size);
        int32_t *rev = &t->rev[st * kv_size + c];
        /* the cell's old position no longer lives there */
        if (*rev >= 0 && t->cell[st * kv_size + (size_t)*rev] == (int32_t)c)
            t->cell[st * kv_size + (size_t)*rev] = -1;
        *rev = -1;
        if (p < 0 || (uint32_t)p >= kv_size)
            continue; /* a position past the cells is never cut */
        int32_t *at = &t->cell[st * kv_size + (size_t)p];
        if (*at >= 0 && t->rev[st * kv_size + (size_t)*at] == p)
            t->rev[st * kv_size + (size_t)*at] = -1;
        *at = (int32_t)c;
        *rev = p;
    }
}

bool thaw_kvtap_eval_cb(struct ggml_tensor *node, bool ask, void *ud)
{
    struct thaw_kvtap *t = ud;

    if (!ask)
        return true; /* never asked for: go on */
    if (t->off)
        return false;
    if (node->op == GGML_OP_ROPE) {
        const struct ggml_tensor *p = node->src[1];
        if (p && p->type == GGML_TYPE_I32 && p->data && (!p->buffer || ggml_backend_buffer_is_host(p->buffer))) {
            t->pos = p->data;
            t->n_pos = ggml_nelements(p);
        }
        return false;
    }
    if (node->op != GGML_OP_SET_ROWS)
        return false;
    struct ggml_tensor *root = node;
    while (root->view_src)
        root = root->view_src;
    char kind, end;
    int il;
    /* the base cache only: "cache_swa_k_l3" and the like do not match */
    if (sscanf(root->name, "cache_%c_l%d%c", &kind, &il, &end) != 2 || (kind != 'k' && kind != 'v') || il < 0 ||
        il >= MAX_LAYER_ID)
        return false;
    if (!root->data || !root->buffer || !ggml_backend_buffer_is_host(root->buffer)) {
        disable(t, "the KV cache is not in host memory");
        return false;
    }
    if (grow_ids(t, il) != 0) {
        disable(t, "out of memory");
        return false;
    }
    if (kind == 'k') {
        t->k[il] = root;
        learn_cells(t, node, root);
    } else {
        t->v[il] = root;
    }
    return false;
}

void thaw_kvtap_forget(struct thaw_kvtap *t, llama_seq_id seq, int from_pos)
{
    if (!t || !t->cell || seq < 0 || (uint32_t)seq >= t->n_stream)
        return;
    size_t base = (size_t)seq * t->kv_size;
    for (uint32_t p = from_pos > 0 ? (uint32_t)from_pos : 0; p < t->kv_size; p++) {
        int32_t c = t->cell[base + p];
        if (c >= 0) {
            if (t->rev[base + (size_t)c] == (int32_t)p)
                t->rev[base + (size_t)c] = -1;
            t->cell[base + p] = -1;
        }
    }
}

int thaw_kvtap_known(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b)
{
    if (!thaw_kvtap_ready(t) || seq < 0 || (uint32_t)seq >= t->n_stream || b > t->kv_size || a > b)
        return 0;
    const int32_t *cell = t->cell + (size_t)seq * t->kv_size;
    for (uint32_t p = a; p < b; p++)
        if (cell[p] < 0)
            return 0;
    return 1;
}

size_t thaw_kvtap_block_size(const struct thaw_kvtap *t, uint32_t a, uint32_t b)
{
    return t->mem ? thaw_kvlayout_mem_block_size(t->mem, a, b) : 0;
}

int thaw_kvtap_cut(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    if (!thaw_kvtap_known(t, seq, a, b))
        return THAW_ENOTFOUND;
    return thaw_kvlayout_mem_cut(t->mem, (uint32_t)seq, a, b, t->cell + (size_t)seq * t->kv_size + a, dst, cap);
}

/* 0 when the tap's block of [a, b) equals the capture's. */
static int same_block(const struct thaw_kvtap *t, const struct thaw_kvlayout *l, llama_seq_id seq, uint32_t a,
                      uint32_t b)
{
    size_t n = thaw_kvlayout_block_size(l, a, b);
    if (n == 0 || n != thaw_kvtap_block_size(t, a, b))
        return THAW_EMISMATCH;
    uint8_t *x = malloc(n), *y = malloc(n);
    int rc = !x || !y ? THAW_ENOMEM : thaw_kvlayout_cut(l, a, b, x, n);
    if (rc == 0)
        rc = thaw_kvtap_cut(t, seq, a, b, y, n);
    if (rc == 0 && memcmp(x, y, n) != 0)
        rc = THAW_EMISMATCH;
    free(x);
    free(y);
    return rc;
}

void thaw_kvtap_restored(struct thaw_kvtap *t, llama_seq_id seq, const void *state, size_t n_state)
{
    struct thaw_kvlayout *l = NULL;

    if (!thaw_kvtap_ready(t) || seq < 0 || (uint32_t)seq >= t->n_stream)
        return;
    thaw_kvtap_forget(t, seq, 0); /* the install rewrote the stream's cells without a graph */
    if (thaw_kvlayout_parse(state, n_state, &l) != 0)
        return;
    uint32_t n = thaw_kvlayout_n_cells(l);
    if (n == 0 || n > t->kv_size) {
        thaw_kvlayout_free(l);
        return;
    }
    /* libllama installs a sequence into one run of free cells of its
     * stream, which the engine emptied first: from cell 0. Its first and
     * last cells where they should be means all of it is. */
    size_t base = (size_t)seq * t->kv_size;
    for (uint32_t p = 0; p < n; p++) {
        t->cell[base + p] = (int32_t)p;
        t->rev[base + p] = (int32_t)p;
    }
    if (same_block(t, l, seq, 0, 1) != 0 || same_block(t, l, seq, n - 1, n) != 0)
        thaw_kvtap_forget(t, seq, 0);
    thaw_kvlayout_free(l);
}

/* ---- checks ---------------------------------------------------------------------- */

static int capture(struct llama_context *ctx, llama_seq_id seq, uint8_t **out, size_t *n)
{
    *n = llama_state_seq_get_size(ctx, seq);
    if (*n == 0)
        return THAW_ELLAMA;
    if (!(*out = malloc(*n)))
        return THAW_ENOMEM;
    if (llama_state_seq_get_data(ctx, *out, *n, seq) != *n) {
        free(*out);
        *out = NULL;
        return THAW_ELLAMA;
    }
    return 0;
}

/* Points the cutter at the cache tensors the graphs showed, in layer
 * order (the order of the state's layers). */
static int bind_layers(struct thaw_kvtap *t, char *why, size_t n_why)
{
    uint32_t n = thaw_kvlayout_mem_n_layers(t->mem), i = 0;

    for (int il = 0; il < t->n_ids; il++) {
        struct ggml_tensor *k = t->k[il], *v = t->v[il];
        if (!k && !v)
            continue;
        if (!k || !v || i >= n)
            return thaw_why(why, n_why, THAW_ELAYOUT, "the graph's cache layers do not match the state's");
        uint64_t k_row, v_row;
        uint32_t v_el;
        thaw_kvlayout_mem_rows(t->mem, i, &k_row, &v_row, &v_el);
        if (!ggml_is_contiguous(k) || !ggml_is_contiguous(v) || (uint64_t)k->nb[1] != k_row ||
            (v_el == 0 && (uint64_t)v->nb[1] != v_row))
            return thaw_why(why, n_why, THAW_ELAYOUT, "layer %d's cache rows are not the state's rows", il);
        size_t v_stride = v_el ? (size_t)v->ne[1] * v_el : 0; /* transposed: one element of every cell */
        thaw_kvlayout_mem_set(t->mem, i, k->data, k->nb[2], v->data, v->nb[2], v_stride);
        i++;
    }
    if (i != n)
        return thaw_why(why, n_why, THAW_ELAYOUT, "the graph showed %u cache layers, the state holds %u", i, n);
    return 0;
}

#define SELFTEST_TOKENS 12

int thaw_kvtap_selftest(struct thaw_kvtap *t, struct llama_context *ctx, llama_seq_id seq, char *why, size_t n_why)
{
    const struct llama_vocab *vocab = llama_model_get_vocab(llama_get_model(ctx));
    llama_memory_t mem = llama_get_memory(ctx);
    struct llama_batch batch = llama_batch_init(SELFTEST_TOKENS, 0, 1);
    struct thaw_kvlayout *l = NULL;
    uint8_t *state = NULL;
    size_t n_state;
    int rc;

    if (why && n_why)
        why[0] = '\0';
    t->ready = 0;
    llama_memory_seq_rm(mem, seq, -1, -1);
    thaw_kvtap_forget(t, seq, 0);
    /* two decodes, so the second's cells follow the first's as a turn's do */
    int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int part = 0; part < 2; part++) {
        int a = part ? SELFTEST_TOKENS / 2 : 0, b = part ? SELFTEST_TOKENS : SELFTEST_TOKENS / 2;
        for (int i = a; i < b; i++) {
            batch.token[i - a] = (llama_token)((3 + 11 * i) % n_vocab);
            batch.pos[i - a] = i;
            batch.n_seq_id[i - a] = 1;
            batch.seq_id[i - a][0] = seq;
            batch.logits[i - a] = i == b - 1;
        }
        batch.n_tokens = b - a;
        if (llama_decode(ctx, batch) != 0) {
            rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_decode failed");
            goto done;
        }
    }
    if (t->off) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "the graph is not one the tap knows");
        goto done;
    }
    if (!t->cell) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "the graph wrote no KV cache the tap knows");
        goto done;
    }
    if ((rc = capture(ctx, seq, &state, &n_state)) != 0) {
        rc = thaw_why(why, n_why, rc, "llama_state_seq_get_data failed");
        goto done;
    }
    if ((rc = thaw_kvlayout_parse(state, n_state, &l)) != 0 || thaw_kvlayout_n_cells(l) != SELFTEST_TOKENS) {
        rc = thaw_why(why, n_why, rc == THAW_ENOMEM ? rc : THAW_ELAYOUT, "the state does not parse as cells");
        goto done;
    }
    thaw_kvlayout_mem_free(t->mem);
    t->mem = NULL;
    if ((rc = thaw_kvlayout_mem_new(l, &t->mem)) != 0) {
        rc = thaw_why(why, n_why, rc, "cells with extra position data, or an SWA cache");
        goto done;
    }
    if ((rc = bind_layers(t, why, n_why)) != 0)
        goto done;
    t->ready = 1;
    /* a block across both decodes, one inside each, the whole */
    static const uint32_t cuts[][2] = {{0, SELFTEST_TOKENS}, {0, 4}, {4, 8}, {8, SELFTEST_TOKENS}, {5, 7}};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        if ((rc = same_block(t, l, seq, cuts[i][0], cuts[i][1])) != 0) {
            t->ready = 0;
            rc = thaw_why(why, n_why, rc == THAW_ENOMEM ? rc : THAW_ELAYOUT,
                      "cells %u..%u cut from the cache differ from the captured ones", cuts[i][0], cuts[i][1]);
            goto done;
        }
    /* and a state installed anew is found where libllama puts it */
    if (llama_state_seq_set_data(ctx, state, n_state, seq) != n_state) {
        t->ready = 0;
        rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_state_seq_set_data failed");
        goto done;
    }
    thaw_kvtap_restored(t, seq, state, n_state);
    if (!thaw_kvtap_known(t, seq, 0, SELFTEST_TOKENS)) {
        t->ready = 0;
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "a restored state's cells are not where the tap expects them");
        goto done;
    }
    rc = 0;
done:
    if (rc != 0)
        t->off = 1; /* the context still calls it: it only returns */
    llama_memory_seq_rm(mem, seq, -1, -1);
    thaw_kvtap_forget(t, seq, 0);
    thaw_kvlayout_free(l);
    free(state);
    llama_batch_free(batch);
    return rc;
}

int thaw_kvtap_verify(struct thaw_kvtap *t, struct llama_context *ctx, llama_seq_id seq, int n_tokens,
                      uint32_t block_tokens)
{
    struct thaw_kvlayout *l = NULL;
    uint8_t *state = NULL;
    size_t n_state;
    int rc;

    if (!thaw_kvtap_ready(t) || n_tokens <= 0 || block_tokens == 0)
        return 0;
    if ((rc = capture(ctx, seq, &state, &n_state)) != 0)
        return rc;
    if ((rc = thaw_kvlayout_parse(state, n_state, &l)) != 0 || thaw_kvlayout_n_cells(l) != (uint32_t)n_tokens) {
        free(state);
        thaw_kvlayout_free(l);
        return rc ? rc : THAW_EINVAL;
    }
    for (uint32_t a = 0; a < (uint32_t)n_tokens && rc == 0; a += block_tokens) {
        uint32_t b = a + block_tokens < (uint32_t)n_tokens ? a + block_tokens : (uint32_t)n_tokens;
        if (!thaw_kvtap_known(t, seq, a, b))
            continue;
        if ((rc = same_block(t, l, seq, a, b)) == THAW_EMISMATCH) {
            LOG_ERR("slot %d: cells %u..%u cut from the KV cache differ from the captured state", seq, a, b);
            disable(t, "a cut from the cache differed from the capture");
        }
    }
    thaw_kvlayout_free(l);
    free(state);
    return rc;
}
