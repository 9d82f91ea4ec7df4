/* kvtap.c — blocks cut straight from libllama's KV cache (kvtap.h). */
#include "llama/kvtap.h"

#include "base/error.h"
#include "base/log.h"
#include "llama/kvlayout.h"

#include <ggml-backend.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYER_ID 4096 /* as kvlayout.c: more is not a layout we know */

/* The SWA layers' rows, copied out of the SWA cache as each ubatch writes
 * them (that cache keeps n_swa + n_ubatch cells: a block's rows are gone
 * from it long before the store that needs them). Laid out as a cache of
 * `cap` cells per stream with cell = position, so the same cutter as the
 * base cache's (kvlayout_mem) cuts SWA blocks from it. */
struct swa_shadow {
    uint32_t n_layers, cap, n_stream;
    int v_trans;
    int *il;               /* [n_layers]: the layer id of SWA layer j (section 1's order) */
    uint8_t **k, **v;      /* [n_layers]: [n_stream][cap][k_row]; V [n_stream][cap][v_row], or
                            * transposed [n_stream][n_embd_v][cap][el] */
    uint64_t *k_row, *v_row;
    uint32_t *v_el;        /* transposed V: bytes per element */
    uint16_t *done;        /* [n_stream][cap]: SWA layers copied for the position, in layer order */
    int32_t *ident;        /* [cap]: cell = position, for the cutter */
    struct thaw_kvlayout_mem *mem;
    uint8_t *seen;         /* [n_layers], a device's: 1 K written, 2 V written (this ubatch) */
    int64_t *ub_row;       /* the ubatch being computed: each token's row in the SWA cache ... */
    int32_t *ub_pos;       /* ... and its position */
    int64_t n_ub, ub_cap;
};

/* A block cut from device memory, [a, a + cells), of which the rows of
 * positions below `valid` are still those in the cache (a position
 * forgotten or written again since lowers it). */
struct last_cut {
    uint32_t a, cells, valid;
    uint8_t *blk;
    size_t cap;
};

struct thaw_kvtap {
    /* learnt from the graphs */
    struct ggml_tensor **k, **v; /* the cache's tensors by layer id */
    int n_ids;                   /* room in k and v */
    const int32_t *pos;          /* the positions of the ubatch being computed */
    int64_t n_pos;
    /* a cache in device memory (a GPU backend): the graph's row indices
     * and positions are device tensors, read once computed. The first K
     * write of each cache in a ubatch is observed for them (one
     * synchronisation a ubatch), the rows are read when a store cuts them */
    const struct ggml_tensor *pos_t; /* the ROPE's positions, when not host-readable */
    int32_t *pos_buf;
    int64_t *idx_buf;
    int64_t buf_cap;
    int last_il[2];  /* the last K write's layer of each cache: a lower one starts a ubatch */
    int learnt[2];   /* this ubatch's map of each cache is learnt */
    int device;      /* some layer's cache is in device memory */
    uint64_t device_bytes; /* read from device memory outside the cutter (SWA rows) */
    uint32_t kv_size, n_stream;
    int32_t *cell; /* [stream][pos]: the cell holding pos, -1 unknown */
    int32_t *rev;  /* [stream][cell]: the pos cell holds per `cell`, -1 */
    /* the other cache of an iSWA model (the cells of its SWA layers), learnt
     * the same way; the self-test swaps the two so that the one above is
     * the base (the larger) */
    uint32_t o_kv_size, o_n_stream;
    int32_t *o_cell, *o_rev;
    /* after the self-test */
    struct thaw_kvlayout_mem *mem;
    struct swa_shadow *swa; /* NULL: no SWA layers, or their rows are not cut */
    /* a device's: each stream's last block cut, kept so that the rows it
     * holds are not read again when the block is cut whole later */
    struct last_cut *last; /* [n_stream], or NULL */
    int ready, off;
};

int thaw_kvtap_new(struct thaw_kvtap **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : THAW_ENOMEM;
}

static void swa_free(struct swa_shadow *w)
{
    if (!w)
        return;
    for (uint32_t j = 0; j < w->n_layers; j++) {
        if (w->k)
            free(w->k[j]);
        if (w->v)
            free(w->v[j]);
    }
    free(w->il);
    free(w->k);
    free(w->v);
    free(w->k_row);
    free(w->v_row);
    free(w->v_el);
    free(w->done);
    free(w->seen);
    free(w->ident);
    free(w->ub_row);
    free(w->ub_pos);
    thaw_kvlayout_mem_free(w->mem);
    free(w);
}

void thaw_kvtap_free(struct thaw_kvtap *t)
{
    if (!t)
        return;
    free(t->k);
    free(t->v);
    free(t->cell);
    free(t->rev);
    free(t->o_cell);
    free(t->o_rev);
    free(t->pos_buf);
    free(t->idx_buf);
    thaw_kvlayout_mem_free(t->mem);
    swa_free(t->swa);
    if (t->last)
        for (uint32_t i = 0; i < t->n_stream; i++)
            free(t->last[i].blk);
    free(t->last);
    free(t);
}

uint64_t thaw_kvtap_device_bytes(const struct thaw_kvtap *t)
{
    return t ? t->device_bytes + thaw_kvlayout_mem_device_bytes(t->mem) : 0;
}

int thaw_kvtap_device(const struct thaw_kvtap *t)
{
    return t && t->device;
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

/* Stream st's positions >= p are no longer the ones its last cut holds. */
static void last_lower(struct thaw_kvtap *t, size_t st, uint32_t p)
{
    if (t->last && st < t->n_stream && t->last[st].valid > p)
        t->last[st].valid = p;
}

/* One cache's position -> cell map (the base's, or the other of an iSWA model). */
struct cmap {
    uint32_t *kv_size, *n_stream;
    int32_t **cell, **rev;
};

static struct cmap map_of(struct thaw_kvtap *t, int other)
{
    return other ? (struct cmap){&t->o_kv_size, &t->o_n_stream, &t->o_cell, &t->o_rev}
                 : (struct cmap){&t->kv_size, &t->n_stream, &t->cell, &t->rev};
}

/* The cells of a ubatch's tokens: K's row indices (n of them), with the
 * positions of the ROPE node seen before it (pos), into map m of a cache
 * of kv_size cells per stream. */
static void learn_map(struct thaw_kvtap *t, struct cmap m, const int64_t *rows, int64_t n, const int32_t *pos,
                      int64_t n_pos, uint32_t kv_size, uint32_t n_stream)
{
    if (!pos || n_pos != n) {
        disable(t, "no positions for the cache's writes (%lld rows, %lld positions)", (long long)n,
                (long long)n_pos);
        return;
    }
    if (!*m.cell) {
        size_t total = (size_t)kv_size * n_stream;
        if (!(*m.cell = malloc(total * sizeof **m.cell)) || !(*m.rev = malloc(total * sizeof **m.rev))) {
            free(*m.cell);
            *m.cell = NULL;
            disable(t, "out of memory");
            return;
        }
        memset(*m.cell, 0xff, total * sizeof **m.cell);
        memset(*m.rev, 0xff, total * sizeof **m.rev);
        *m.kv_size = kv_size;
        *m.n_stream = n_stream;
    } else if (kv_size != *m.kv_size || n_stream != *m.n_stream) {
        disable(t, "the cache changed shape");
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        int64_t g = rows[j];
        int32_t p = pos[j];
        if (g < 0 || g >= (int64_t)kv_size * n_stream) {
            disable(t, "a cache row index out of range");
            return;
        }
        size_t st = (size_t)(g / kv_size), c = (size_t)(g % kv_size);
        int32_t *cell = *m.cell, *rv = *m.rev;
        if (p >= 0)
            last_lower(t, st, (uint32_t)p); /* written again: not the last cut's row */
        int32_t *rev = &rv[st * kv_size + c];
        /* the cell's old position no longer lives there */
        if (*rev >= 0 && cell[st * kv_size + (size_t)*rev] == (int32_t)c)
            cell[st * kv_size + (size_t)*rev] = -1;
        *rev = -1;
        if (p < 0 || (uint32_t)p >= kv_size)
            continue; /* a position past the cells is never cut (an SWA cache's: not mapped) */
        int32_t *at = &cell[st * kv_size + (size_t)p];
        if (*at >= 0 && rv[st * kv_size + (size_t)*at] == p)
            rv[st * kv_size + (size_t)*at] = -1;
        *at = (int32_t)c;
        *rev = p;
    }
}

static int host_readable(const struct ggml_tensor *x)
{
    return x && x->data && (!x->buffer || ggml_backend_buffer_is_host(x->buffer));
}

/* Room for n row indices and positions read from a device. */
static int grow_bufs(struct thaw_kvtap *t, int64_t n)
{
    if (n <= t->buf_cap)
        return 0;
    int64_t *r = realloc(t->idx_buf, (size_t)n * sizeof *r);
    if (!r)
        return THAW_ENOMEM;
    t->idx_buf = r;
    int32_t *q = realloc(t->pos_buf, (size_t)n * sizeof *q);
    if (!q)
        return THAW_ENOMEM;
    t->pos_buf = q;
    t->buf_cap = n;
    return 0;
}

/* The row indices of K write `node` and the ubatch's positions, from host
 * memory or (once computed) read from the device. 0 or -1 (disabled). */
static int ubatch_rows(struct thaw_kvtap *t, const struct ggml_tensor *node, const int64_t **rows, int64_t *n,
                       const int32_t **pos, int64_t *n_pos)
{
    const struct ggml_tensor *idx = node->src[1];

    if (!idx || idx->type != GGML_TYPE_I64 || !idx->data) {
        disable(t, "the cache's row indices are not readable");
        return -1;
    }
    *n = ggml_nelements(idx);
    *pos = t->pos;
    *n_pos = t->n_pos;
    if (host_readable(idx) && t->pos) {
        *rows = idx->data;
        return 0;
    }
    if (grow_bufs(t, *n) != 0) {
        disable(t, "out of memory");
        return -1;
    }
    ggml_backend_tensor_get(idx, t->idx_buf, 0, (size_t)*n * sizeof *t->idx_buf);
    *rows = t->idx_buf;
    if (!t->pos && t->pos_t && ggml_nelements(t->pos_t) == *n) {
        ggml_backend_tensor_get(t->pos_t, t->pos_buf, 0, (size_t)*n * sizeof *t->pos_buf);
        *pos = t->pos_buf;
        *n_pos = *n;
    }
    return 0;
}

/* ---- SWA rows ---------------------------------------------------------------------- */

/* SWA layer j of layer id il, or -1. */
static int swa_layer(const struct swa_shadow *w, int il)
{
    for (uint32_t j = 0; j < w->n_layers; j++)
        if (w->il[j] == il)
            return (int)j;
    return -1;
}

/* n bytes at offset off of cache tensor x into dst: a copy from host
 * memory, a read through the backend from a device's. */
static void read_rows(struct thaw_kvtap *t, const struct ggml_tensor *x, size_t off, void *dst, size_t n)
{
    if (host_readable(x)) {
        memcpy(dst, (const uint8_t *)x->data + off, n);
        return;
    }
    ggml_backend_tensor_get(x, dst, off, n);
    t->device_bytes += n;
}

/* Copies SWA layer j's rows of positions [p, p + n), held in cells
 * [c, c + n) of stream st of the SWA cache, into the shadow. */
static void swa_copy_run(struct thaw_kvtap *t, uint32_t j, size_t st, size_t c, uint32_t p, size_t n)
{
    struct swa_shadow *w = t->swa;
    const struct ggml_tensor *k = t->k[w->il[j]], *v = t->v[w->il[j]];
    size_t at = st * w->cap + p;

    read_rows(t, k, st * k->nb[2] + c * w->k_row[j], w->k[j] + at * w->k_row[j], n * w->k_row[j]);
    if (!w->v_trans) {
        read_rows(t, v, st * v->nb[2] + c * w->v_row[j], w->v[j] + at * w->v_row[j], n * w->v_row[j]);
    } else {
        size_t el = w->v_el[j], n_embd_v = w->v_row[j] / el, kv = (size_t)v->ne[1];
        uint8_t *dst = w->v[j] + st * w->cap * w->v_row[j] + (size_t)p * el;
        for (size_t e = 0; e < n_embd_v; e++)
            read_rows(t, v, st * v->nb[2] + e * kv * el + c * el, dst + e * w->cap * el, n * el);
    }
    /* known once every SWA layer copied it, in layer order */
    for (size_t i = 0; i < n; i++) {
        uint16_t *d = &w->done[at + i];
        *d = j == 0 ? 1 : (*d == j ? (uint16_t)(j + 1) : 0);
    }
}

/* Which SWA-cache row each of the ubatch's n tokens goes to. */
static void swa_note(struct thaw_kvtap *t, const int64_t *rows, int64_t n, const int32_t *pos, int64_t n_pos)
{
    struct swa_shadow *w = t->swa;

    if (!pos || n_pos != n) {
        w->n_ub = 0;
        return;
    }
    if (n > w->ub_cap) {
        int64_t *r = realloc(w->ub_row, (size_t)n * sizeof *r);
        if (r)
            w->ub_row = r;
        int32_t *q = r ? realloc(w->ub_pos, (size_t)n * sizeof *q) : NULL;
        if (q)
            w->ub_pos = q;
        if (!r || !q) {
            disable(t, "out of memory");
            return;
        }
        w->ub_cap = n;
    }
    memcpy(w->ub_row, rows, (size_t)n * sizeof *w->ub_row);
    memcpy(w->ub_pos, pos, (size_t)n * sizeof *w->ub_pos);
    w->n_ub = n;
}

/* After SWA layer il's V write computed (its K write came before it in
 * the graph): the ubatch's rows of that layer into the shadow, a run of
 * cells holding a run of positions at a time. */
static void swa_take(struct thaw_kvtap *t, int il)
{
    struct swa_shadow *w = t->swa;
    int j = swa_layer(w, il);

    if (j < 0)
        return;
    for (int64_t e = 0; e < w->n_ub;) {
        int64_t g = w->ub_row[e];
        int32_t p = w->ub_pos[e];
        if (g < 0 || g >= (int64_t)t->o_kv_size * t->o_n_stream || p < 0 || (uint32_t)p >= w->cap) {
            e++;
            continue;
        }
        size_t st = (size_t)(g / t->o_kv_size), c = (size_t)(g % t->o_kv_size), n = 1;
        while (e + (int64_t)n < w->n_ub && w->ub_row[e + (int64_t)n] == g + (int64_t)n &&
               w->ub_pos[e + (int64_t)n] == p + (int32_t)n && c + n < t->o_kv_size && (uint32_t)p + n < w->cap)
            n++;
        swa_copy_run(t, (uint32_t)j, st, c, (uint32_t)p, n);
        e += (int64_t)n;
    }
}

int thaw_kvtap_has_swa(const struct thaw_kvtap *t)
{
    return thaw_kvtap_ready(t) && t->swa != NULL;
}

/* Positions [a, b) of seq are in the shadow (ready or not: the self-test's). */
static int swa_has(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b)
{
    if (!t || !t->swa || t->off || seq < 0 || (uint32_t)seq >= t->swa->n_stream || b > t->swa->cap || a > b)
        return 0;
    const uint16_t *d = t->swa->done + (size_t)seq * t->swa->cap;
    for (uint32_t p = a; p < b; p++)
        if (d[p] != t->swa->n_layers)
            return 0;
    return 1;
}

int thaw_kvtap_swa_known(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b)
{
    return thaw_kvtap_ready(t) && swa_has(t, seq, a, b);
}

size_t thaw_kvtap_swa_block_size(const struct thaw_kvtap *t, uint32_t a, uint32_t b)
{
    return t->swa ? thaw_kvlayout_mem_block_size(t->swa->mem, a, b) : 0;
}

int thaw_kvtap_swa_cut(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    if (!swa_has(t, seq, a, b))
        return THAW_ENOTFOUND;
    return thaw_kvlayout_mem_cut(t->swa->mem, (uint32_t)seq, a, b, t->swa->ident + a, dst, cap);
}

/* Positions [from, cap) of seq are no longer the shadow's. */
static void swa_forget(struct thaw_kvtap *t, llama_seq_id seq, uint32_t from)
{
    struct swa_shadow *w = t->swa;

    if (!w || seq < 0 || (uint32_t)seq >= w->n_stream || from >= w->cap)
        return;
    memset(w->done + (size_t)seq * w->cap + from, 0, (size_t)(w->cap - from) * sizeof *w->done);
}

/* The other map's positions >= from of stream seq (the self-test's). */
static void forget_other(struct thaw_kvtap *t, llama_seq_id seq, int from_pos)
{
    if (!t->o_cell || seq < 0 || (uint32_t)seq >= t->o_n_stream)
        return;
    size_t base = (size_t)seq * t->o_kv_size;
    for (uint32_t p = from_pos > 0 ? (uint32_t)from_pos : 0; p < t->o_kv_size; p++) {
        int32_t c = t->o_cell[base + p];
        if (c >= 0) {
            if (t->o_rev[base + (size_t)c] == (int32_t)p)
                t->o_rev[base + (size_t)c] = -1;
            t->o_cell[base + p] = -1;
        }
    }
}

/* ---- the eval callback ----------------------------------------------------------- */

/* Which cache a K write of kv_size cells per stream is: 0 the first seen
 * (the self-test makes it the base), 1 the other of an iSWA model, -1
 * neither. */
static int cache_of(struct thaw_kvtap *t, uint32_t kv, uint32_t n_stream)
{
    if (!t->kv_size || kv == t->kv_size) {
        t->kv_size = kv, t->n_stream = n_stream;
        return 0;
    }
    if (!t->o_kv_size || kv == t->o_kv_size) {
        t->o_kv_size = kv, t->o_n_stream = n_stream;
        return 1;
    }
    return -1;
}

/* K write `node` of cache ci computed (or readable before): its cells. */
static void learn(struct thaw_kvtap *t, int ci, const struct ggml_tensor *node, const struct ggml_tensor *cache)
{
    const int64_t *rows;
    const int32_t *pos;
    int64_t n, n_pos;

    if (ubatch_rows(t, node, &rows, &n, &pos, &n_pos) != 0)
        return;
    learn_map(t, map_of(t, ci), rows, n, pos, n_pos, (uint32_t)cache->ne[1], (uint32_t)cache->ne[2]);
    if (ci == 1 && t->swa && !t->off)
        swa_note(t, rows, n, pos, n_pos);
    t->learnt[ci] = 1;
}

bool thaw_kvtap_eval_cb(struct ggml_tensor *node, bool ask, void *ud)
{
    struct thaw_kvtap *t = ud;
    char kind, end;
    int il;

    if (!ask) {
        /* computed: a device cache's first K write of the ubatch (its row
         * indices), or an SWA layer's V write (its rows) */
        struct ggml_tensor *r = node;
        while (r->view_src)
            r = r->view_src;
        if (t->off || node->op != GGML_OP_SET_ROWS || sscanf(r->name, "cache_%c_l%d%c", &kind, &il, &end) != 2)
            return true; /* go on */
        if (kind == 'k') {
            int ci = cache_of(t, (uint32_t)r->ne[1], (uint32_t)r->ne[2]);
            if (ci >= 0 && !t->learnt[ci])
                learn(t, ci, node, r);
        }
        if (t->swa && !t->off) {
            int j = swa_layer(t->swa, il);
            if (j < 0)
                return true;
            if (host_readable(r)) {
                swa_take(t, il); /* the CPU computes in graph order: K was written before V */
                return true;
            }
            /* a device backend may reorder the graph (ggml-vulkan does):
             * the rows are taken once both writes of the layer computed */
            t->swa->seen[j] |= kind == 'k' ? 1 : 2;
            if (t->swa->seen[j] == 3) {
                t->swa->seen[j] = 0;
                swa_take(t, il);
            }
        }
        return true;
    }
    if (t->off)
        return false;
    if (node->op == GGML_OP_ROPE) {
        const struct ggml_tensor *p = node->src[1];
        if (p && p->type == GGML_TYPE_I32 && p->data) {
            int host = host_readable(p);
            t->pos = host ? p->data : NULL;
            t->pos_t = host ? NULL : p;
            t->n_pos = ggml_nelements(p);
        }
        return false;
    }
    if (node->op != GGML_OP_SET_ROWS)
        return false;
    struct ggml_tensor *root = node;
    while (root->view_src)
        root = root->view_src;
    /* the base cache only: "cache_swa_k_l3" and the like do not match */
    if (sscanf(root->name, "cache_%c_l%d%c", &kind, &il, &end) != 2 || (kind != 'k' && kind != 'v') || il < 0 ||
        il >= MAX_LAYER_ID)
        return false;
    if (!root->data || !root->buffer) {
        disable(t, "the KV cache has no memory the tap can read");
        return false;
    }
    int dev = !ggml_backend_buffer_is_host(root->buffer);
    t->device |= dev;
    if (grow_ids(t, il) != 0) {
        disable(t, "out of memory");
        return false;
    }
    if (kind == 'k') {
        t->k[il] = root;
        /* an iSWA model has two caches of different sizes: a map each */
        int ci = cache_of(t, (uint32_t)root->ne[1], (uint32_t)root->ne[2]);
        if (ci < 0) {
            disable(t, "more than two KV caches");
            return false;
        }
        if (il <= t->last_il[ci])
            t->learnt[ci] = 0; /* a new ubatch */
        t->last_il[ci] = il;
        /* an SWA layer's K write in device memory is seen computed too (below) */
        bool swa_dev = dev && t->swa && t->ready && swa_layer(t->swa, il) >= 0;
        if (t->learnt[ci])
            return swa_dev;
        if (!dev && host_readable(node->src[1]) && t->pos) {
            learn(t, ci, node, root);
            return false;
        }
        return true; /* the row indices are the device's: read them once computed */
    }
    t->v[il] = root;
    /* an SWA layer's rows are taken once written: ask to see the node */
    return t->swa && t->ready && swa_layer(t->swa, il) >= 0;
}

void thaw_kvtap_forget(struct thaw_kvtap *t, llama_seq_id seq, int from_pos)
{
    if (!t)
        return;
    swa_forget(t, seq, from_pos > 0 ? (uint32_t)from_pos : 0);
    forget_other(t, seq, from_pos);
    if (!t->cell || seq < 0 || (uint32_t)seq >= t->n_stream)
        return;
    last_lower(t, (size_t)seq, from_pos > 0 ? (uint32_t)from_pos : 0);
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

int thaw_kvtap_cut(const struct thaw_kvtap *t_, llama_seq_id seq, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    struct thaw_kvtap *t = (struct thaw_kvtap *)t_; /* keeps the last cut only */
    const int32_t *cell = t->cell + (size_t)seq * t->kv_size + a;

    if (!thaw_kvtap_known(t, seq, a, b))
        return THAW_ENOTFOUND;
    if (!t->device)
        return thaw_kvlayout_mem_cut(t->mem, (uint32_t)seq, a, b, cell, dst, cap);
    if (!t->last && t->n_stream && !(t->last = calloc(t->n_stream, sizeof *t->last)))
        return thaw_kvlayout_mem_cut(t->mem, (uint32_t)seq, a, b, cell, dst, cap);
    struct last_cut *lc = &t->last[seq];
    uint32_t n_head = lc->blk && lc->a == a && lc->valid > a ? (lc->valid < b ? lc->valid : b) - a : 0;
    int rc = thaw_kvlayout_mem_cut_after(t->mem, (uint32_t)seq, a, b, cell, lc->blk, lc->cells, n_head, dst, cap);
    if (rc != 0 || (lc->blk && a < lc->a))
        return rc;
    /* the stream's last block so far: a store cuts its blocks in order */
    size_t n = thaw_kvlayout_mem_block_size(t->mem, a, b);
    if (n > lc->cap) {
        uint8_t *x = realloc(lc->blk, n);
        if (!x) {
            lc->valid = 0;
            return 0;
        }
        lc->blk = x;
        lc->cap = n;
    }
    memcpy(lc->blk, dst, n);
    lc->a = a, lc->cells = b - a, lc->valid = b;
    return 0;
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

/* The SWA rows of an installed state (its section 1, the window) are the
 * shadow's: a later store cuts the blocks they are part of. */
static void swa_restored(struct thaw_kvtap *t, llama_seq_id seq, const struct thaw_kvlayout *l)
{
    struct swa_shadow *w = t->swa;
    uint32_t m = thaw_kvlayout_swa_n_cells(l);

    if (!w || m == 0 || seq < 0 || (uint32_t)seq >= w->n_stream)
        return;
    int32_t lo, hi;
    if (thaw_kvlayout_swa_pos_range(l, &lo, &hi) != 0 || lo < 0 || (uint32_t)hi >= w->cap)
        return;
    uint32_t n = (uint32_t)(hi - lo + 1);
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
        return;
    /* a window with a gap is not taken: its blocks cannot be cut anyway */
    if (thaw_kvlayout_swa_find(l, (uint32_t)lo, (uint32_t)hi + 1, idx) == 0) {
        for (uint32_t i = 0; i < n; i++) {
            size_t at = (size_t)seq * w->cap + (uint32_t)lo + i;
            for (uint32_t j = 0; j < w->n_layers; j++) {
                uint8_t *vd = w->v_trans ? w->v[j] + (size_t)seq * w->cap * w->v_row[j] + ((size_t)lo + i) * w->v_el[j]
                                         : w->v[j] + at * w->v_row[j];
                thaw_kvlayout_swa_copy_cell(l, (uint32_t)idx[i], j, w->k[j] + at * w->k_row[j], vd,
                                            w->v_trans ? (size_t)w->cap * w->v_el[j] : 0);
            }
            w->done[at] = (uint16_t)w->n_layers;
        }
    }
    free(idx);
}

/* A device's restored partial last block [a, n) of the state l, kept as
 * stream seq's last cut: its rows are the state's own bytes, so the store
 * that cuts the block next reads only the cells past n from the device. */
static void last_restored(struct thaw_kvtap *t, llama_seq_id seq, const struct thaw_kvlayout *l, uint32_t n,
                          uint32_t block_tokens)
{
    uint32_t a = n / block_tokens * block_tokens;

    if (a == n || (!t->last && !(t->last = calloc(t->n_stream, sizeof *t->last))))
        return;
    struct last_cut *lc = &t->last[seq];
    size_t sz = thaw_kvlayout_block_size(l, a, n);
    if (sz == 0 || sz != thaw_kvtap_block_size(t, a, n))
        return;
    if (sz > lc->cap) {
        uint8_t *x = realloc(lc->blk, sz);
        if (!x)
            return;
        lc->blk = x;
        lc->cap = sz;
    }
    if (thaw_kvlayout_cut(l, a, n, lc->blk, sz) != 0)
        return;
    lc->a = a, lc->cells = n - a, lc->valid = n;
}

void thaw_kvtap_restored(struct thaw_kvtap *t, llama_seq_id seq, const void *state, size_t n_state,
                         uint32_t block_tokens)
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
    if (same_block(t, l, seq, 0, 1) != 0 || same_block(t, l, seq, n - 1, n) != 0) {
        thaw_kvtap_forget(t, seq, 0);
    } else {
        swa_restored(t, seq, l);
        if (t->device && block_tokens)
            last_restored(t, seq, l, n, block_tokens);
    }
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
    const int k_only = thaw_kvlayout_mem_k_only(t->mem);

    for (int il = 0; il < t->n_ids; il++) {
        struct ggml_tensor *k = t->k[il], *v = t->v[il];
        if (!k && !v)
            continue;
        if (k && t->o_cell && (uint32_t)k->ne[1] == t->o_kv_size)
            continue; /* an SWA layer: swa_setup's */
        /* an MLA model's cache has no V tensors (V is a view of K's latent)
         * and its state no V parts: K rows only */
        if (!k || (v == NULL) != k_only || i >= n)
            return thaw_why(why, n_why, THAW_ELAYOUT, "the graph's cache layers do not match the state's");
        uint64_t k_row, v_row;
        uint32_t v_el;
        thaw_kvlayout_mem_rows(t->mem, i, &k_row, &v_row, &v_el);
        if (!ggml_is_contiguous(k) || (uint64_t)k->nb[1] != k_row ||
            (v && (!ggml_is_contiguous(v) || (v_el == 0 && (uint64_t)v->nb[1] != v_row))))
            return thaw_why(why, n_why, THAW_ELAYOUT, "layer %d's cache rows are not the state's rows", il);
        size_t v_stride = v && v_el ? (size_t)v->ne[1] * v_el : 0; /* transposed: one element of every cell */
        if (!host_readable(k) || (v && !host_readable(v)))
            thaw_kvlayout_mem_set_device(t->mem, i, k, v, v_stride);
        else
            thaw_kvlayout_mem_set(t->mem, i, k->data, k->nb[2], v ? v->data : NULL, v ? v->nb[2] : 0, v_stride);
        i++;
    }
    if (i != n)
        return thaw_why(why, n_why, THAW_ELAYOUT, "the graph showed %u cache layers, the state holds %u", i, n);
    return 0;
}

/* The shadow for l's SWA section: its layers are the graph's layers of the
 * other cache, in layer order, each checked against the section's shape.
 * cap: the base cache's cells per stream (positions beyond are never cut). */
static int swa_setup(struct thaw_kvtap *t, const struct thaw_kvlayout *l, char *why, size_t n_why)
{
    struct swa_shadow *w = NULL;
    int rc;

    swa_free(t->swa);
    t->swa = NULL;
    if (!t->o_cell)
        return thaw_why(why, n_why, THAW_ELAYOUT, "the SWA cache is as large as the base one (no separate window)");
    if (!(w = calloc(1, sizeof *w)))
        return THAW_ENOMEM;
    if ((rc = thaw_kvlayout_mem_new_swa(l, &w->mem)) != 0) {
        swa_free(w);
        return thaw_why(why, n_why, rc, "the SWA section's cells carry extra position data");
    }
    uint32_t n = thaw_kvlayout_mem_n_layers(w->mem);
    w->n_layers = n;
    w->cap = t->kv_size;
    w->n_stream = t->n_stream;
    if (!(w->il = calloc(n, sizeof *w->il)) || !(w->k = calloc(n, sizeof *w->k)) ||
        !(w->v = calloc(n, sizeof *w->v)) || !(w->k_row = calloc(n, sizeof *w->k_row)) ||
        !(w->v_row = calloc(n, sizeof *w->v_row)) || !(w->v_el = calloc(n, sizeof *w->v_el)) ||
        !(w->done = calloc((size_t)w->cap * w->n_stream, sizeof *w->done)) || !(w->seen = calloc(n, 1)) ||
        !(w->ident = malloc((size_t)w->cap * sizeof *w->ident))) {
        swa_free(w);
        return THAW_ENOMEM;
    }
    for (uint32_t p = 0; p < w->cap; p++)
        w->ident[p] = (int32_t)p;
    uint32_t j = 0;
    for (int il = 0; il < t->n_ids; il++) {
        struct ggml_tensor *k = t->k[il], *v = t->v[il];
        if (!k || (uint32_t)k->ne[1] != t->o_kv_size)
            continue;
        if (!v || j >= n) {
            swa_free(w);
            return thaw_why(why, n_why, THAW_ELAYOUT, "the graph's SWA layers do not match the state's");
        }
        uint64_t k_row, v_row;
        uint32_t v_el;
        thaw_kvlayout_mem_rows(w->mem, j, &k_row, &v_row, &v_el);
        w->v_trans = v_el != 0;
        if (!ggml_is_contiguous(k) || !ggml_is_contiguous(v) || (uint64_t)k->nb[1] != k_row ||
            (v_el == 0 && (uint64_t)v->nb[1] != v_row) || (v_el != 0 && ggml_type_size(v->type) != v_el) ||
            (v_el != 0 && (uint64_t)v->ne[0] * v_el != v_row)) {
            swa_free(w);
            return thaw_why(why, n_why, THAW_ELAYOUT, "SWA layer %d's cache rows are not the state's rows", il);
        }
        w->il[j] = il;
        w->k_row[j] = k_row;
        w->v_row[j] = v_row;
        w->v_el[j] = v_el;
        /* calloc: pages a stream never uses are never touched */
        if (!(w->k[j] = calloc((size_t)w->cap * w->n_stream, k_row)) ||
            !(w->v[j] = calloc((size_t)w->cap * w->n_stream, v_row))) {
            swa_free(w);
            return THAW_ENOMEM;
        }
        thaw_kvlayout_mem_set(w->mem, j, w->k[j], (size_t)w->cap * k_row, w->v[j], (size_t)w->cap * v_row,
                              v_el ? (size_t)w->cap * v_el : 0);
        j++;
    }
    if (j != n) {
        swa_free(w);
        return thaw_why(why, n_why, THAW_ELAYOUT, "the graph showed %u SWA layers, the state holds %u", j, n);
    }
    t->swa = w;
    return 0;
}

/* Fills the shadow with seq's positions [0, n) from the SWA cache itself
 * (the other map says where they are). */
static int swa_fill_from_cache(struct thaw_kvtap *t, llama_seq_id seq, uint32_t n)
{
    for (uint32_t p = 0; p < n; p++) {
        int32_t c = p < t->o_kv_size ? t->o_cell[(size_t)seq * t->o_kv_size + p] : -1;
        if (c < 0)
            return THAW_ENOTFOUND;
        for (uint32_t j = 0; j < t->swa->n_layers; j++)
            swa_copy_run(t, j, (size_t)seq, (size_t)c, p, 1);
    }
    return 0;
}

/* 0 when the shadow's SWA block of [a, b) equals the one cut from the
 * capture's SWA section. */
static int same_swa_block(const struct thaw_kvtap *t, const struct thaw_kvlayout *l, llama_seq_id seq, uint32_t a,
                          uint32_t b)
{
    struct thaw_kvlayout_mem *cm = NULL;
    int32_t *idx = malloc((size_t)(b - a) * sizeof *idx);
    size_t n = thaw_kvtap_swa_block_size(t, a, b);
    uint8_t *x = malloc(n ? n : 1), *y = malloc(n ? n : 1);
    int rc = !idx || !x || !y ? THAW_ENOMEM : thaw_kvlayout_swa_find(l, a, b, idx);

    if (rc == 0)
        rc = thaw_kvlayout_swa_mem(l, &cm);
    if (rc == 0)
        rc = thaw_kvlayout_mem_cut(cm, 0, a, b, idx, x, n);
    if (rc == 0)
        rc = thaw_kvtap_swa_cut(t, seq, a, b, y, n);
    if (rc == 0 && memcmp(x, y, n) != 0)
        rc = THAW_EMISMATCH;
    thaw_kvlayout_mem_free(cm);
    free(idx);
    free(x);
    free(y);
    return rc;
}

#define SELFTEST_TOKENS 12
#define SELFTEST_SWA_MORE 4 /* decoded with the shadow live */

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
    if (t->o_cell && t->o_kv_size > t->kv_size) {
        /* the first cache seen was the SWA one (gemma: layer 0 slides) */
        uint32_t ks = t->kv_size, ns = t->n_stream;
        int32_t *c = t->cell, *r = t->rev;
        int li = t->last_il[0], lt = t->learnt[0];
        t->kv_size = t->o_kv_size, t->n_stream = t->o_n_stream, t->cell = t->o_cell, t->rev = t->o_rev;
        t->o_kv_size = ks, t->o_n_stream = ns, t->o_cell = c, t->o_rev = r;
        t->last_il[0] = t->last_il[1], t->learnt[0] = t->learnt[1];
        t->last_il[1] = li, t->learnt[1] = lt;
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
        rc = thaw_why(why, n_why, rc, "cells with extra position data");
        goto done;
    }
    if ((rc = bind_layers(t, why, n_why)) != 0)
        goto done;
    if (thaw_kvlayout_has_swa(l)) {
        /* an iSWA cache: the SWA rows are taken as written (DESIGN §12) */
        if ((rc = swa_setup(t, l, why, n_why)) != 0)
            goto done;
        if (swa_fill_from_cache(t, seq, SELFTEST_TOKENS) != 0 ||
            same_swa_block(t, l, seq, 0, SELFTEST_TOKENS) != 0 || same_swa_block(t, l, seq, 5, 7) != 0) {
            rc = thaw_why(why, n_why, THAW_ELAYOUT, "SWA rows cut from the SWA cache differ from the captured ones");
            goto done;
        }
    } else if (t->o_cell) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "two KV caches but no SWA section in the state");
        goto done;
    }
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
    if (t->swa) {
        /* and rows written with the shadow live are taken as they are written */
        for (int i = 0; i < SELFTEST_SWA_MORE; i++) {
            batch.token[i] = (llama_token)((5 + 13 * i) % n_vocab);
            batch.pos[i] = SELFTEST_TOKENS + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = seq;
            batch.logits[i] = i == SELFTEST_SWA_MORE - 1;
        }
        batch.n_tokens = SELFTEST_SWA_MORE;
        uint8_t *more = NULL;
        size_t n_more = 0;
        struct thaw_kvlayout *lm = NULL;
        uint32_t end = SELFTEST_TOKENS + SELFTEST_SWA_MORE;
        rc = llama_decode(ctx, batch) != 0 ? THAW_ELLAMA : capture(ctx, seq, &more, &n_more);
        if (rc == 0)
            rc = thaw_kvlayout_parse(more, n_more, &lm);
        if (rc == 0 && (t->off || same_swa_block(t, lm, seq, SELFTEST_TOKENS - 2, end) != 0 ||
                        same_swa_block(t, lm, seq, 0, end) != 0))
            rc = THAW_ELAYOUT;
        thaw_kvlayout_free(lm);
        free(more);
        /* back to the first SELFTEST_TOKENS, for the restore check below */
        llama_memory_seq_rm(mem, seq, SELFTEST_TOKENS, -1);
        thaw_kvtap_forget(t, seq, SELFTEST_TOKENS);
        if (rc != 0) {
            t->ready = 0;
            rc = thaw_why(why, n_why, rc == THAW_ENOMEM ? rc : THAW_ELAYOUT,
                          "SWA rows taken as the graph wrote them differ from the captured ones");
            goto done;
        }
    }
    /* and a state installed anew is found where libllama puts it */
    if (llama_state_seq_set_data(ctx, state, n_state, seq) != n_state) {
        t->ready = 0;
        rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_state_seq_set_data failed");
        goto done;
    }
    thaw_kvtap_restored(t, seq, state, n_state, 0);
    if (!thaw_kvtap_known(t, seq, 0, SELFTEST_TOKENS)) {
        t->ready = 0;
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "a restored state's cells are not where the tap expects them");
        goto done;
    }
    if (t->swa && (!thaw_kvtap_swa_known(t, seq, 0, SELFTEST_TOKENS) || same_swa_block(t, l, seq, 0, SELFTEST_TOKENS))) {
        t->ready = 0;
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "a restored state's SWA rows are not the shadow's");
        goto done;
    }
    rc = 0;
done:
    if (rc != 0) {
        t->off = 1; /* the context still calls it: it only returns */
        swa_free(t->swa);
        t->swa = NULL;
    }
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
    /* the shadow's SWA rows against the window the capture still holds */
    int32_t lo, hi;
    if (rc == 0 && t->swa && thaw_kvlayout_swa_pos_range(l, &lo, &hi) == 0 &&
        thaw_kvtap_swa_known(t, seq, (uint32_t)lo, (uint32_t)hi + 1)) {
        for (uint32_t a = (uint32_t)lo; a <= (uint32_t)hi && rc == 0; a += block_tokens) {
            uint32_t b = a + block_tokens <= (uint32_t)hi + 1 ? a + block_tokens : (uint32_t)hi + 1;
            if ((rc = same_swa_block(t, l, seq, a, b)) == THAW_EMISMATCH) {
                LOG_ERR("slot %d: SWA rows %u..%u cut from the KV cache differ from the captured state", seq, a, b);
                disable(t, "SWA rows taken from the cache differed from the capture");
            } else if (rc == THAW_ENOTFOUND) {
                rc = 0; /* a window with a gap: nothing to compare */
            }
        }
    }
    thaw_kvlayout_free(l);
    free(state);
    return rc;
}
