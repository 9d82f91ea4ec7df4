/* kvlayout.c — parse and cut libllama sequence-state buffers, validate
 * blocks; assembling blocks back into a buffer is kvlayout_asm.c's.
 *
 * The byte layouts are in kvlayout.h, the constants and the block parser
 * both files share in kvlayout_fmt.h. Two rules hold everywhere here:
 *   1. Nothing is read before the reader has checked that it lies inside the
 *      buffer (struct rd); sizes are multiplied only after a division has
 *      shown the product fits.
 *   2. A length in section 0 that runs past the end is THAW_ECORRUPT; a
 *      field that is in bounds but not what the pinned version writes, and
 *      anything after section 0 that is not exactly one SWA section, is
 *      THAW_ELAYOUT.
 *
 * Map:
 *   ---- reader ----        bounds-checked reads
 *   ---- types ----         which ggml types a row can hold
 *   ---- parse ----         one KV-cache section, then the whole buffer
 *   ---- blocks ----        cut one from a parsed buffer
 *   ---- blocks cut from the cache's memory ----  the shape (from a parsed
 *                           buffer), the layers' memory, cutting by cell
 *   ---- SWA rows (DESIGN §12) ----  where the window's positions are, its
 *                           rows as blocks
 *   ---- validating a block ----  head, whole, what a file's head says
 *   ---- self-test ----     the start-up round trip: parse, cut, assemble
 */
#include "llama/kvlayout.h"
#include "llama/kvlayout_fmt.h"

#include "base/error.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- reader ------------------------------------------------------------------ */

struct rd {
    const uint8_t *p;
    size_t n, off;
};

static int rd_get(struct rd *r, void *v, size_t len)
{
    if (r->n - r->off < len)
        return THAW_ECORRUPT;
    memcpy(v, r->p + r->off, len);
    r->off += len;
    return 0;
}

/* Skips count items of size bytes each. */
static int rd_skip(struct rd *r, uint64_t count, uint64_t size)
{
    size_t rem = r->n - r->off;

    if (size != 0 && count > rem / size)
        return THAW_ECORRUPT;
    r->off += (size_t)(count * size);
    return 0;
}

/* ---- types ------------------------------------------------------------------- */

/* 0 when t is a ggml type of known size and `row` bytes are a whole number
 * of its blocks; `el_only`: it must also be one element per block (transposed
 * V is addressed per element). */
static int check_type(int32_t t, uint64_t row, int el_only)
{
    if (t < 0 || t >= (int32_t)GGML_TYPE_COUNT)
        return THAW_ELAYOUT;
    size_t ts = ggml_type_size((enum ggml_type)t);
    int64_t bs = ggml_blck_size((enum ggml_type)t);
    if (ts == 0 || bs <= 0 || (el_only && bs != 1))
        return THAW_ELAYOUT;
    if (row == 0 || row % ts != 0)
        return THAW_ELAYOUT;
    return 0;
}

/* ---- parse ------------------------------------------------------------------- */

struct layer {
    int32_t k_type, v_type;
    uint64_t k_row, v_row; /* bytes per cell; transposed V: n_embd_v * el */
    uint32_t v_el;         /* transposed V: bytes per element */
    size_t k_off, v_off;   /* of the layer's data in the buffer */
};

struct section {
    uint32_t n_stream, stream, n_cells;
    size_t meta_off, end;
    uint32_t v_trans, n_layers;
    int k_only;           /* no V part: its layers' v_type, v_row, v_off are 0 */
    struct layer *layers; /* n_layers, malloc'd */
};

struct thaw_kvlayout {
    const uint8_t *buf;
    size_t n;
    int32_t seq_id;
    int ext;           /* cells carry llama_kv_cell_ext */
    struct section s0; /* the cut section */
    size_t tail_off;   /* == n when there is no tail */
    size_t cell_bytes; /* K + V bytes per cell, all layers */
    int recurrent;     /* the tail is a recurrent state, not an SWA section (s1 then empty) */
    struct section s1; /* the SWA section when there is one (n_layers 0 if it holds no cells) */
    size_t s1_cell_bytes;
};

/* Reads one stream's meta and data (n_cells > 0) at r; s->k_only: the
 * layers have no V part (libllama writes none for a cache without V
 * tensors, llama-kv-cache.cpp state_write_data's `if (!v) continue`). */
static int parse_cells(struct rd *r, int32_t seq_id, int ext, int from_zero, struct section *s)
{
    size_t stride = meta_stride(ext);
    int rc;

    s->meta_off = r->off;
    if ((rc = rd_skip(r, s->n_cells, stride)) != 0)
        return rc;
    for (uint32_t i = 0; i < s->n_cells; i++) {
        const uint8_t *c = r->p + s->meta_off + (size_t)i * stride;
        int32_t pos, seq;
        uint32_t n_seq;
        memcpy(&pos, c, 4);
        memcpy(&n_seq, c + 4, 4);
        memcpy(&seq, c + stride - 4, 4);
        if (n_seq != 1 || seq != seq_id || (from_zero && pos != (int32_t)i))
            return THAW_ELAYOUT;
    }
    if ((rc = rd_get(r, &s->v_trans, 4)) != 0 || (rc = rd_get(r, &s->n_layers, 4)) != 0)
        return rc;
    if (s->v_trans > 1 || s->n_layers == 0 || s->n_layers > MAX_LAYERS)
        return THAW_ELAYOUT;
    s->layers = calloc(s->n_layers, sizeof *s->layers);
    if (!s->layers)
        return THAW_ENOMEM;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        struct layer *ly = &s->layers[l];
        if ((rc = rd_get(r, &ly->k_type, 4)) != 0 || (rc = rd_get(r, &ly->k_row, 8)) != 0)
            return rc;
        if ((rc = check_type(ly->k_type, ly->k_row, 0)) != 0)
            return rc;
        ly->k_off = r->off;
        if ((rc = rd_skip(r, s->n_cells, ly->k_row)) != 0)
            return rc;
    }
    for (uint32_t l = 0; l < s->n_layers && !s->k_only; l++) {
        struct layer *ly = &s->layers[l];
        if ((rc = rd_get(r, &ly->v_type, 4)) != 0)
            return rc;
        if (!s->v_trans) {
            if ((rc = rd_get(r, &ly->v_row, 8)) != 0)
                return rc;
            if ((rc = check_type(ly->v_type, ly->v_row, 0)) != 0)
                return rc;
        } else {
            uint32_t n_embd_v;
            if ((rc = rd_get(r, &ly->v_el, 4)) != 0 || (rc = rd_get(r, &n_embd_v, 4)) != 0)
                return rc;
            ly->v_row = (uint64_t)ly->v_el * n_embd_v;
            if ((rc = check_type(ly->v_type, ly->v_row, 1)) != 0)
                return rc;
            if (ly->v_el != ggml_type_size((enum ggml_type)ly->v_type))
                return THAW_ELAYOUT;
        }
        ly->v_off = r->off;
        if ((rc = rd_skip(r, s->n_cells, ly->v_row)) != 0)
            return rc;
    }
    return 0;
}

/* Parses one llama_kv_cache section at `off`. s->layers is set (or NULL) on
 * every path; the caller frees it. */
static int parse_section(const uint8_t *b, size_t n, size_t off, int32_t seq_id, int ext, int from_zero, int k_only,
                         struct section *s)
{
    struct rd r = {b, n, off};
    int found = 0, rc;

    memset(s, 0, sizeof *s);
    s->k_only = k_only;
    if ((rc = rd_get(&r, &s->n_stream, 4)) != 0)
        return rc;
    if (s->n_stream == 0 || s->n_stream > MAX_STREAMS)
        return THAW_ELAYOUT;
    for (uint32_t st = 0; st < s->n_stream; st++) {
        uint32_t count;
        if ((rc = rd_get(&r, &count, 4)) != 0)
            return rc;
        if (count == 0)
            continue;
        if (found)
            return THAW_ELAYOUT; /* a sequence spread over two streams */
        found = 1;
        s->stream = st;
        s->n_cells = count;
        if ((rc = parse_cells(&r, seq_id, ext, from_zero, s)) != 0)
            return rc;
    }
    s->end = r.off;
    return 0;
}

void thaw_kvlayout_free(struct thaw_kvlayout *l)
{
    if (!l)
        return;
    free(l->s0.layers);
    free(l->s1.layers);
    free(l);
}

/* A hybrid memory's recurrent part after its attention section
 * (llama-memory-recurrent.cpp state_write for one sequence):
 *   u32 cell_count (1) | i32 pos (n_cells - 1) | u32 n_seq_id (0)
 *   u32 s_trans (0) | u32 n_layer | per recurrent layer: the R (conv)
 *   rows, then the S (ssm) rows, each with its type and row size
 * It is kept whole (it exists only at its last position: it cannot be
 * cut), so only its head is checked here; the round trip of
 * thaw_kvlayout_selftest checks the rest. */
static int is_recurrent_tail(const uint8_t *t, size_t n, uint32_t n_cells)
{
    uint32_t count, n_seq, s_trans, n_layer;
    int32_t pos;

    if (n < 20)
        return 0;
    memcpy(&count, t, 4);
    memcpy(&pos, t + 4, 4);
    memcpy(&n_seq, t + 8, 4);
    memcpy(&s_trans, t + 12, 4);
    memcpy(&n_layer, t + 16, 4);
    return count == 1 && pos == (int32_t)n_cells - 1 && n_seq == 0 && s_trans == 0 && n_layer > 0 &&
           n_layer <= MAX_LAYERS;
}

/* The whole buffer, assuming cells with (ext) or without ext, layers with
 * or without (k_only) V. */
static int parse_as(const uint8_t *b, size_t n, int32_t seq_id, int ext, int k_only, struct thaw_kvlayout *l)
{
    struct section tail = {0};
    int rc;

    l->ext = ext;
    if ((rc = parse_section(b, n, 8, seq_id, ext, 1, k_only, &l->s0)) != 0)
        return rc;
    if (l->s0.n_cells == 0)
        return THAW_EINVAL;
    l->tail_off = l->s0.end;
    if (l->tail_off == n)
        return 0;
    /* bytes follow: the SWA section of an iSWA cache, or the recurrent
     * state of a hybrid memory */
    rc = parse_section(b, n, l->tail_off, seq_id, ext, 0, k_only, &tail);
    if (rc == THAW_ECORRUPT) /* extra bytes and a cut-off tail look alike: both are not ours */
        rc = THAW_ELAYOUT;
    if (rc == 0 &&
        (tail.end != n || tail.n_stream != l->s0.n_stream || (tail.n_cells > 0 && tail.stream != l->s0.stream)))
        rc = THAW_ELAYOUT;
    if (rc == 0 && tail.n_cells > 0 && (tail.v_trans != l->s0.v_trans)) /* one context, one V orientation */
        rc = THAW_ELAYOUT;
    if (rc == 0) {
        l->s1 = tail; /* kept: SWA rows are cut from it (thaw_kvlayout_swa_*) */
        for (uint32_t i = 0; i < tail.n_layers; i++)
            l->s1_cell_bytes += tail.layers[i].k_row + tail.layers[i].v_row;
        return 0;
    }
    free(tail.layers);
    if (rc == THAW_ELAYOUT && is_recurrent_tail(b + l->tail_off, n - l->tail_off, l->s0.n_cells)) {
        l->recurrent = 1;
        rc = 0;
    }
    return rc;
}

/* Back to nothing parsed, for the next guess. */
static void parse_reset(struct thaw_kvlayout *l)
{
    free(l->s0.layers);
    memset(&l->s0, 0, sizeof l->s0);
    free(l->s1.layers);
    memset(&l->s1, 0, sizeof l->s1);
    l->s1_cell_bytes = 0;
    l->tail_off = 0;
    l->recurrent = 0;
}

int thaw_kvlayout_parse(const void *buf, size_t n, struct thaw_kvlayout **out)
{
    const uint8_t *b = buf;
    struct thaw_kvlayout *l = NULL;
    uint32_t magic;
    int32_t seq_id;
    int rc, rc_ext;

    *out = NULL;
    if (!buf || n < 8)
        return THAW_ECORRUPT;
    memcpy(&magic, b, 4);
    memcpy(&seq_id, b + 4, 4);
    if (magic != LLAMA_SEQ_MAGIC)
        return THAW_ELAYOUT;
    if (!(l = calloc(1, sizeof *l)))
        return THAW_ENOMEM;
    l->buf = b;
    l->n = n;
    l->seq_id = seq_id;
    rc = parse_as(b, n, seq_id, 0, 0, l);
    if (rc != 0 && rc != THAW_ENOMEM && l->tail_off == 0) {
        /* section 0 did not parse with plain cells: try cells with ext */
        parse_reset(l);
        rc_ext = parse_as(b, n, seq_id, 1, 0, l);
        /* a damaged buffer reads as damaged under at least one guess */
        if (rc_ext == 0 || rc_ext == THAW_ENOMEM || rc_ext == THAW_EINVAL || rc_ext == THAW_ECORRUPT)
            rc = rc_ext;
    }
    /* layers without V (MLA: a K-only latent cache): the state ends, or
     * its next section starts, where V would. Taken when section 0 parses
     * so (then its verdict on the rest is the one: bytes left over are
     * THAW_ELAYOUT as for any layout); else the error stands, so a
     * buffer cut short stays THAW_ECORRUPT (one cut exactly where V
     * starts reads as K-only only if no stream follows) */
    for (int ext = 0; ext < 2 && rc != 0 && rc != THAW_ENOMEM && l->tail_off == 0; ext++) {
        parse_reset(l);
        rc_ext = parse_as(b, n, seq_id, ext, 1, l);
        if (rc_ext == 0 || rc_ext == THAW_ENOMEM || l->tail_off != 0)
            rc = rc_ext;
    }
    if (rc != 0) {
        thaw_kvlayout_free(l);
        return rc;
    }
    for (uint32_t i = 0; i < l->s0.n_layers; i++)
        l->cell_bytes += l->s0.layers[i].k_row + l->s0.layers[i].v_row;
    *out = l;
    return 0;
}

uint32_t thaw_kvlayout_n_cells(const struct thaw_kvlayout *l)
{
    return l->s0.n_cells;
}

uint32_t thaw_kvlayout_n_layers(const struct thaw_kvlayout *l)
{
    return l->s0.n_layers;
}

int thaw_kvlayout_v_trans(const struct thaw_kvlayout *l)
{
    return (int)l->s0.v_trans;
}

int thaw_kvlayout_k_only(const struct thaw_kvlayout *l)
{
    return l->s0.k_only;
}

size_t thaw_kvlayout_bytes_per_cell(const struct thaw_kvlayout *l)
{
    return l->cell_bytes;
}

void thaw_kvlayout_frame(const struct thaw_kvlayout *l, struct thaw_kvlayout_frame *f)
{
    f->seq_id = l->seq_id;
    f->n_stream = l->s0.n_stream;
    f->stream = l->s0.stream;
}

int thaw_kvlayout_recurrent(const struct thaw_kvlayout *l)
{
    return l->recurrent;
}

void thaw_kvlayout_tail(const struct thaw_kvlayout *l, const void **tail, size_t *n_tail)
{
    *tail = l->tail_off < l->n ? l->buf + l->tail_off : NULL;
    *n_tail = l->n - l->tail_off;
}

/* ---- blocks ------------------------------------------------------------------ */

size_t thaw_kvlayout_block_size(const struct thaw_kvlayout *l, uint32_t a, uint32_t b)
{
    if (a >= b || b > l->s0.n_cells)
        return 0;
    size_t m = b - a;
    return BLOCK_HEAD + (size_t)l->s0.n_layers * BLOCK_LAYER + m * block_meta_stride(l->ext) + m * l->cell_bytes;
}

/* A block's header and layer table for cells [a, b) shaped as `ly`
 * (K only: its v_type and v_row are 0). */
static void put_head(uint8_t **p, uint32_t a, uint32_t b, uint32_t n_layers, const struct layer *ly, int v_trans,
                     int ext, int k_only)
{
    uint32_t flags = (v_trans ? FLAG_VTRANS : 0) | (ext ? FLAG_EXT : 0) | (k_only ? FLAG_KONLY : 0);

    put32(p, BLOCK_MAGIC);
    put32(p, THAW_KVLAYOUT_BLOCK_VERSION | flags << 16);
    put32(p, a); /* positions are the cell indices */
    put32(p, b - a);
    put32(p, n_layers);
    put32(p, 0);
    for (uint32_t i = 0; i < n_layers; i++) {
        put32(p, (uint32_t)ly[i].k_type);
        put32(p, (uint32_t)ly[i].v_type);
        put64(p, ly[i].k_row);
        put64(p, ly[i].v_row);
    }
}

int thaw_kvlayout_cut(const struct thaw_kvlayout *l, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    const struct section *s = &l->s0;
    size_t need = thaw_kvlayout_block_size(l, a, b), stride = meta_stride(l->ext);
    uint8_t *p = dst;
    size_t m = (size_t)b - a;

    if (need == 0)
        return THAW_EINVAL;
    if (cap < need)
        return THAW_ETOOBIG;
    put_head(&p, a, b, s->n_layers, s->layers, (int)s->v_trans, l->ext, s->k_only);
    for (uint32_t c = a; c < b; c++) {
        const uint8_t *cell = l->buf + s->meta_off + (size_t)c * stride;
        put(&p, cell, 4); /* pos */
        if (l->ext)
            put(&p, cell + 8, CELL_EXT);
    }
    for (uint32_t i = 0; i < s->n_layers; i++)
        put(&p, l->buf + s->layers[i].k_off + a * s->layers[i].k_row, m * s->layers[i].k_row);
    for (uint32_t i = 0; i < s->n_layers && !s->k_only; i++) {
        const struct layer *ly = &s->layers[i];
        if (!s->v_trans) {
            put(&p, l->buf + ly->v_off + a * ly->v_row, m * ly->v_row);
            continue;
        }
        /* transposed: element j of every cell is one column of n_cells */
        size_t n_embd_v = ly->v_row / ly->v_el;
        for (size_t j = 0; j < n_embd_v; j++)
            put(&p, l->buf + ly->v_off + (j * s->n_cells + a) * ly->v_el, m * ly->v_el);
    }
    return 0;
}

/* ---- blocks cut from the cache's memory ---------------------------------------- */

struct thaw_kvlayout_mem {
    uint32_t n_layers;
    int v_trans, k_only;
    size_t cell_bytes;
    struct layer *layers;  /* the shape, from a parsed capture */
    const uint8_t **k, **v; /* each layer's stream 0 */
    size_t *ss;             /* bytes from one stream to the next (K and V alike) */
    size_t *v_stride;
    /* a layer in device memory: its tensors, read through the backend
     * (k and v above are then the tensors' data, offsets into them) */
    const struct ggml_tensor **kt, **vt;
    uint64_t device_bytes; /* read from device memory so far */
};

void thaw_kvlayout_mem_free(struct thaw_kvlayout_mem *m)
{
    if (!m)
        return;
    free(m->layers);
    free(m->k);
    free(m->v);
    free(m->v_stride);
    free(m->ss);
    free(m->kt);
    free(m->vt);
    free(m);
}

/* A cutter shaped as section s (cell_bytes: its K + V bytes per cell). */
static int mem_new_section(const struct section *s, size_t cell_bytes, struct thaw_kvlayout_mem **out)
{
    struct thaw_kvlayout_mem *m;
    uint32_t n = s->n_layers;

    *out = NULL;
    if (n == 0)
        return THAW_ELAYOUT;
    if (!(m = calloc(1, sizeof *m)) || !(m->layers = malloc(n * sizeof *m->layers)) ||
        !(m->k = calloc(n, sizeof *m->k)) || !(m->v = calloc(n, sizeof *m->v)) ||
        !(m->v_stride = calloc(n, sizeof *m->v_stride)) || !(m->ss = calloc(2 * (size_t)n, sizeof *m->ss)) ||
        !(m->kt = calloc(n, sizeof *m->kt)) || !(m->vt = calloc(n, sizeof *m->vt))) {
        thaw_kvlayout_mem_free(m);
        return THAW_ENOMEM;
    }
    memcpy(m->layers, s->layers, n * sizeof *m->layers);
    m->n_layers = n;
    m->v_trans = (int)s->v_trans;
    m->k_only = s->k_only;
    m->cell_bytes = cell_bytes;
    *out = m;
    return 0;
}

int thaw_kvlayout_mem_new(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out)
{
    *out = NULL;
    if (l->ext)
        return THAW_ELAYOUT; /* cells with ext: not cut from memory */
    return mem_new_section(&l->s0, l->cell_bytes, out);
}

uint32_t thaw_kvlayout_mem_n_layers(const struct thaw_kvlayout_mem *m)
{
    return m->n_layers;
}

int thaw_kvlayout_mem_k_only(const struct thaw_kvlayout_mem *m)
{
    return m->k_only;
}

void thaw_kvlayout_mem_rows(const struct thaw_kvlayout_mem *m, uint32_t layer, uint64_t *k_row, uint64_t *v_row,
                            uint32_t *v_el)
{
    *k_row = m->layers[layer].k_row;
    *v_row = m->layers[layer].v_row;
    *v_el = m->layers[layer].v_el;
}

void thaw_kvlayout_mem_set(struct thaw_kvlayout_mem *m, uint32_t layer, const void *k, size_t k_ss, const void *v,
                           size_t v_ss, size_t v_stride)
{
    m->k[layer] = k;
    m->v[layer] = v;
    m->ss[2 * layer] = k_ss;
    m->ss[2 * layer + 1] = v_ss;
    m->v_stride[layer] = v_stride;
    m->kt[layer] = m->vt[layer] = NULL;
}

void thaw_kvlayout_mem_set_device(struct thaw_kvlayout_mem *m, uint32_t layer, const struct ggml_tensor *k,
                                  const struct ggml_tensor *v, size_t v_stride)
{
    thaw_kvlayout_mem_set(m, layer, k->data, k->nb[2], v ? v->data : NULL, v ? v->nb[2] : 0, v_stride);
    m->kt[layer] = k;
    m->vt[layer] = v;
}

uint64_t thaw_kvlayout_mem_device_bytes(const struct thaw_kvlayout_mem *m)
{
    return m ? m->device_bytes : 0;
}

/* Copies n bytes at src, inside layer memory `base` (tensor t when it is
 * in device memory), to *p. */
static void put_from(struct thaw_kvlayout_mem *m, uint8_t **p, const struct ggml_tensor *t, const uint8_t *base,
                     const uint8_t *src, size_t n)
{
    if (t) {
        ggml_backend_tensor_get(t, *p, (size_t)(src - base), n);
        m->device_bytes += n;
        *p += n;
        return;
    }
    put(p, src, n);
}

size_t thaw_kvlayout_mem_block_size(const struct thaw_kvlayout_mem *m, uint32_t a, uint32_t b)
{
    if (a >= b)
        return 0;
    size_t c = b - a;
    return BLOCK_HEAD + (size_t)m->n_layers * BLOCK_LAYER + c * block_meta_stride(0) + c * m->cell_bytes;
}

/* A run of rows [j, j + n) of a block being cut: rows below n_head come
 * from the head block's section (rows of hrow bytes, h bytes apart for a
 * transposed V's columns: passed as the section's start), the rest from
 * memory at src (one row every `step` bytes, or side by side when run). */
struct rows {
    const uint8_t *head; /* the head block's copy of this section, or NULL */
    size_t n_head;
};

static void put_rows(struct thaw_kvlayout_mem *m, uint8_t **p, const struct ggml_tensor *t, const uint8_t *base,
                     const uint8_t *src, const int32_t *cell, int run, size_t n, size_t row, struct rows h)
{
    size_t j = 0;

    if (h.head && h.n_head) {
        j = h.n_head < n ? h.n_head : n;
        put(p, h.head, j * row);
    }
    if (j == n)
        return;
    if (run) {
        put_from(m, p, t, base, src + (size_t)cell[j] * row, (n - j) * row);
        return;
    }
    for (; j < n; j++)
        put_from(m, p, t, base, src + (size_t)cell[j] * row, row);
}

int thaw_kvlayout_mem_cut(const struct thaw_kvlayout_mem *m_, uint32_t stream, uint32_t a, uint32_t b,
                          const int32_t *cell, void *dst, size_t cap)
{
    return thaw_kvlayout_mem_cut_after(m_, stream, a, b, cell, NULL, 0, 0, dst, cap);
}

int thaw_kvlayout_mem_cut_after(const struct thaw_kvlayout_mem *m_, uint32_t stream, uint32_t a, uint32_t b,
                                const int32_t *cell, const void *head, uint32_t head_cells, uint32_t n_head,
                                void *dst, size_t cap)
{
    struct thaw_kvlayout_mem *m = (struct thaw_kvlayout_mem *)m_; /* counts device bytes only */
    size_t need = thaw_kvlayout_mem_block_size(m, a, b), n = (size_t)b - a;
    uint8_t *p = dst;
    int run = 1; /* the cells lie side by side: one copy per row run */

    if (need == 0)
        return THAW_EINVAL;
    if (cap < need)
        return THAW_ETOOBIG;
    if (!head || n_head > head_cells)
        n_head = 0;
    for (size_t i = n_head; i < n; i++) {
        if (cell[i] < 0)
            return THAW_ENOTFOUND;
        if (cell[i] != cell[n_head] + (int32_t)(i - n_head))
            run = 0;
    }
    for (uint32_t i = 0; i < m->n_layers; i++)
        if (!m->k[i] || (!m->v[i] && !m->k_only))
            return THAW_ENOTFOUND;
    put_head(&p, a, b, m->n_layers, m->layers, m->v_trans, 0, m->k_only);
    for (uint32_t c = a; c < b; c++)
        put32(&p, c);
    /* the head block's sections: the same layout for head_cells cells */
    const uint8_t *h = n_head ? (const uint8_t *)head + BLOCK_HEAD + (size_t)m->n_layers * BLOCK_LAYER +
                                    head_cells * block_meta_stride(0)
                              : NULL;
    for (uint32_t i = 0; i < m->n_layers; i++) {
        size_t row = m->layers[i].k_row;
        const uint8_t *k = m->k[i] + stream * m->ss[2 * i];
        put_rows(m, &p, m->kt[i], m->k[i], k, cell, run, n, row, (struct rows){h, n_head});
        if (h)
            h += head_cells * row;
    }
    for (uint32_t i = 0; i < m->n_layers && !m->k_only; i++) {
        const struct layer *ly = &m->layers[i];
        const uint8_t *v = m->v[i] + stream * m->ss[2 * i + 1];
        if (!m->v_trans) {
            put_rows(m, &p, m->vt[i], m->v[i], v, cell, run, n, ly->v_row, (struct rows){h, n_head});
            if (h)
                h += head_cells * ly->v_row;
            continue;
        }
        size_t n_embd_v = ly->v_row / ly->v_el, el = ly->v_el;
        for (size_t e = 0; e < n_embd_v; e++) {
            put_rows(m, &p, m->vt[i], m->v[i], v + e * m->v_stride[i], cell, run, n, el, (struct rows){h, n_head});
            if (h)
                h += head_cells * el;
        }
    }
    return 0;
}

/* ---- SWA rows (DESIGN §12) ----------------------------------------------------- */

uint32_t thaw_kvlayout_swa_n_cells(const struct thaw_kvlayout *l)
{
    return l->s1.n_layers ? l->s1.n_cells : 0;
}

int thaw_kvlayout_has_swa(const struct thaw_kvlayout *l)
{
    return l->tail_off != l->n;
}

int thaw_kvlayout_swa_pos_range(const struct thaw_kvlayout *l, int32_t *lo, int32_t *hi)
{
    const struct section *s = &l->s1;
    size_t stride = meta_stride(l->ext);

    if (!s->n_layers || !s->n_cells)
        return THAW_ENOTFOUND;
    *lo = INT32_MAX;
    *hi = -1;
    for (uint32_t i = 0; i < s->n_cells; i++) {
        int32_t pos;
        memcpy(&pos, l->buf + s->meta_off + (size_t)i * stride, 4);
        if (pos < *lo)
            *lo = pos;
        if (pos > *hi)
            *hi = pos;
    }
    return 0;
}

int thaw_kvlayout_swa_find(const struct thaw_kvlayout *l, uint32_t a, uint32_t b, int32_t *idx)
{
    const struct section *s = &l->s1;
    size_t stride = meta_stride(l->ext);

    if (!s->n_layers || a >= b)
        return THAW_ENOTFOUND;
    for (uint32_t i = 0; i < b - a; i++)
        idx[i] = -1;
    for (uint32_t i = 0; i < s->n_cells; i++) {
        int32_t pos;
        memcpy(&pos, l->buf + s->meta_off + (size_t)i * stride, 4);
        if (pos >= (int32_t)a && pos < (int32_t)b)
            idx[pos - (int32_t)a] = (int32_t)i;
    }
    for (uint32_t i = 0; i < b - a; i++)
        if (idx[i] < 0)
            return THAW_ENOTFOUND;
    return 0;
}

int thaw_kvlayout_mem_new_swa(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out)
{
    *out = NULL;
    if (l->ext)
        return THAW_ELAYOUT;
    return mem_new_section(&l->s1, l->s1_cell_bytes, out);
}

int thaw_kvlayout_swa_mem(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out)
{
    const struct section *s = &l->s1;
    int rc = thaw_kvlayout_mem_new_swa(l, out);

    if (rc != 0)
        return rc;
    /* the capture's own rows: one stream, cells by their index in the section */
    for (uint32_t i = 0; i < s->n_layers; i++) {
        const struct layer *ly = &s->layers[i];
        thaw_kvlayout_mem_set(*out, i, l->buf + ly->k_off, 0, l->buf + ly->v_off, 0,
                              s->v_trans ? (size_t)s->n_cells * ly->v_el : 0);
    }
    return 0;
}

void thaw_kvlayout_swa_copy_cell(const struct thaw_kvlayout *l, uint32_t i, uint32_t layer, void *k_dst,
                                 void *v_dst, size_t v_dst_stride)
{
    const struct section *s = &l->s1;
    const struct layer *ly = &s->layers[layer];

    memcpy(k_dst, l->buf + ly->k_off + (size_t)i * ly->k_row, ly->k_row);
    if (s->k_only)
        return;
    if (!s->v_trans) {
        memcpy(v_dst, l->buf + ly->v_off + (size_t)i * ly->v_row, ly->v_row);
        return;
    }
    size_t n_embd_v = ly->v_row / ly->v_el;
    for (size_t e = 0; e < n_embd_v; e++)
        memcpy((uint8_t *)v_dst + e * v_dst_stride, l->buf + ly->v_off + (e * s->n_cells + i) * ly->v_el, ly->v_el);
}

/* ---- validating a block ------------------------------------------------------ */

int kvlayout_block_parse_head(const void *block, size_t n, struct blk *k, uint64_t *total)
{
    struct rd r = {block, n, 0};
    uint32_t magic, ver, reserved;
    uint64_t cell_bytes = 0;
    int rc;

    if (!block)
        return THAW_ECORRUPT;
    if ((rc = rd_get(&r, &magic, 4)) != 0 || (rc = rd_get(&r, &ver, 4)) != 0 || (rc = rd_get(&r, &k->pos0, 4)) != 0 ||
        (rc = rd_get(&r, &k->n_cells, 4)) != 0 || (rc = rd_get(&r, &k->n_layers, 4)) != 0 ||
        (rc = rd_get(&r, &reserved, 4)) != 0)
        return rc;
    if (magic != BLOCK_MAGIC)
        return THAW_ECORRUPT;
    if ((ver & 0xffff) != THAW_KVLAYOUT_BLOCK_VERSION)
        return THAW_EVERSION;
    k->flags = ver >> 16;
    if ((k->flags & ~FLAG_ALL) || k->n_cells == 0 || k->n_layers == 0 || k->n_layers > MAX_LAYERS || reserved != 0 ||
        (uint64_t)k->pos0 + k->n_cells > INT32_MAX)
        return THAW_ECORRUPT;
    k->p = block;
    k->table = r.p + r.off;
    if ((rc = rd_skip(&r, k->n_layers, BLOCK_LAYER)) != 0)
        return rc;
    for (uint32_t i = 0; i < k->n_layers; i++) {
        const uint8_t *e = k->table + (size_t)i * BLOCK_LAYER;
        int32_t kt, vt;
        uint64_t kr, vr;
        memcpy(&kt, e, 4);
        memcpy(&vt, e + 4, 4);
        memcpy(&kr, e + 8, 8);
        memcpy(&vr, e + 16, 8);
        if (check_type(kt, kr, 0) != 0)
            return THAW_ECORRUPT;
        if ((k->flags & FLAG_KONLY) ? vt != 0 || vr != 0 : check_type(vt, vr, (k->flags & FLAG_VTRANS) != 0) != 0)
            return THAW_ECORRUPT;
        if (kr > UINT64_MAX / 4 - cell_bytes || vr > UINT64_MAX / 4 - cell_bytes - kr)
            return THAW_ECORRUPT;
        cell_bytes += kr + vr;
    }
    k->meta = r.p + r.off;
    if ((rc = rd_skip(&r, k->n_cells, block_meta_stride(k->flags & FLAG_EXT))) != 0)
        return rc;
    size_t stride = block_meta_stride(k->flags & FLAG_EXT);
    for (uint32_t c = 0; c < k->n_cells; c++) {
        int32_t pos;
        memcpy(&pos, k->meta + (size_t)c * stride, 4);
        if (pos != (int32_t)(k->pos0 + c))
            return THAW_ECORRUPT;
    }
    k->data = r.p + r.off;
    if (cell_bytes != 0 && k->n_cells > (UINT64_MAX - r.off) / cell_bytes)
        return THAW_ECORRUPT;
    *total = r.off + (uint64_t)k->n_cells * cell_bytes;
    return 0;
}

int kvlayout_block_parse(const void *block, size_t n, struct blk *k)
{
    uint64_t total;
    int rc = kvlayout_block_parse_head(block, n, k, &total);

    if (rc != 0)
        return rc;
    return total == n ? 0 : THAW_ECORRUPT;
}

int thaw_kvlayout_block_head_size(const void *hdr, size_t n, size_t *n_head)
{
    uint32_t magic, ver, n_cells, n_layers;

    if (!hdr || n < BLOCK_HEAD)
        return THAW_ECORRUPT;
    memcpy(&magic, hdr, 4);
    memcpy(&ver, (const uint8_t *)hdr + 4, 4);
    memcpy(&n_cells, (const uint8_t *)hdr + 12, 4);
    memcpy(&n_layers, (const uint8_t *)hdr + 16, 4);
    if (magic != BLOCK_MAGIC)
        return THAW_ECORRUPT;
    if ((ver & 0xffff) != THAW_KVLAYOUT_BLOCK_VERSION)
        return THAW_EVERSION;
    if (((ver >> 16) & ~FLAG_ALL) || n_layers == 0 || n_layers > MAX_LAYERS || n_cells == 0 || n_cells > INT32_MAX)
        return THAW_ECORRUPT;
    *n_head = BLOCK_HEAD + (size_t)n_layers * BLOCK_LAYER + (size_t)n_cells * block_meta_stride((ver >> 16) & FLAG_EXT);
    return 0;
}

int thaw_kvlayout_is_block(const void *blob, size_t n)
{
    uint32_t magic;

    if (!blob || n < BLOCK_HEAD)
        return 0;
    memcpy(&magic, blob, sizeof magic);
    return magic == BLOCK_MAGIC;
}

int thaw_kvlayout_block_info(const void *block, size_t n, uint32_t *pos0, uint32_t *n_cells)
{
    struct blk k;
    int rc = kvlayout_block_parse(block, n, &k);

    if (rc == 0) {
        *pos0 = k.pos0;
        *n_cells = k.n_cells;
    }
    return rc;
}

/* ---- self-test --------------------------------------------------------------- */

#define SELFTEST_TOKENS 8
#define SELFTEST_BLOCK 2

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

int thaw_kvlayout_selftest(struct llama_context *ctx, llama_seq_id seq, char *why, size_t n_why)
{
    const struct llama_vocab *vocab = llama_model_get_vocab(llama_get_model(ctx));
    llama_memory_t mem = llama_get_memory(ctx);
    struct llama_batch batch = llama_batch_init(SELFTEST_TOKENS, 0, 1);
    struct thaw_kvlayout *l = NULL;
    uint8_t *state = NULL, *again = NULL, *blk[SELFTEST_TOKENS / SELFTEST_BLOCK] = {0};
    size_t sizes[SELFTEST_TOKENS / SELFTEST_BLOCK] = {0};
    void *asm_buf = NULL;
    size_t n_state, n_asm;
    int rc, nb = 0;

    if (why && n_why)
        why[0] = '\0';
    llama_memory_seq_rm(mem, seq, -1, -1);
    int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < SELFTEST_TOKENS; i++) {
        batch.token[i] = (llama_token)((1 + 7 * i) % n_vocab);
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i] = i == SELFTEST_TOKENS - 1;
    }
    batch.n_tokens = SELFTEST_TOKENS;
    if (llama_decode(ctx, batch) != 0) {
        rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_decode failed");
        goto done;
    }
    n_state = llama_state_seq_get_size(ctx, seq);
    if (n_state == 0) {
        rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_state_seq_get_size returned 0");
        goto done;
    }
    if (!(state = malloc(n_state)) || !(again = malloc(n_state))) {
        rc = THAW_ENOMEM;
        goto done;
    }
    if (llama_state_seq_get_data(ctx, state, n_state, seq) != n_state) {
        rc = thaw_why(why, n_why, THAW_ELLAMA, "llama_state_seq_get_data failed");
        goto done;
    }
    if ((rc = thaw_kvlayout_parse(state, n_state, &l)) != 0) {
        const struct llama_model *m = llama_get_model(ctx);
        rc =
            thaw_why(why, n_why, rc == THAW_ENOMEM ? rc : THAW_ELAYOUT, "the state does not parse: %s%s", thaw_strerror(rc),
                 llama_model_is_recurrent(m) || llama_model_is_hybrid(m) ? " (the model has recurrent memory)" : "");
        goto done;
    }
    if (thaw_kvlayout_n_cells(l) != SELFTEST_TOKENS) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "the state holds %u cells for %d tokens", thaw_kvlayout_n_cells(l),
                  SELFTEST_TOKENS);
        goto done;
    }
    for (uint32_t a = 0; a < SELFTEST_TOKENS; a += SELFTEST_BLOCK, nb++) {
        sizes[nb] = thaw_kvlayout_block_size(l, a, a + SELFTEST_BLOCK);
        if (!(blk[nb] = malloc(sizes[nb]))) {
            rc = THAW_ENOMEM;
            goto done;
        }
        if ((rc = thaw_kvlayout_cut(l, a, a + SELFTEST_BLOCK, blk[nb], sizes[nb])) != 0) {
            rc = thaw_why(why, n_why, THAW_ELAYOUT, "cutting cells %u..%u: %s", a, a + SELFTEST_BLOCK, thaw_strerror(rc));
            goto done;
        }
    }
    struct thaw_kvlayout_frame fr;
    const void *tail;
    size_t n_tail;
    thaw_kvlayout_frame(l, &fr);
    thaw_kvlayout_tail(l, &tail, &n_tail);
    if ((rc = thaw_kvlayout_assemble((const void *const *)blk, sizes, nb, &fr, tail, n_tail, &asm_buf, &n_asm)) != 0) {
        rc = thaw_why(why, n_why, rc == THAW_ENOMEM ? rc : THAW_ELAYOUT, "assembly: %s", thaw_strerror(rc));
        goto done;
    }
    if (n_asm != n_state || memcmp(asm_buf, state, n_state) != 0) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT,
                  "the assembled state (%zu bytes) differs from the captured one (%zu) at byte %zu", n_asm, n_state,
                  first_diff(asm_buf, state, n_asm < n_state ? n_asm : n_state));
        goto done;
    }
    if (llama_state_seq_set_data(ctx, asm_buf, n_asm, seq) != n_asm) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "llama_state_seq_set_data refused the assembled state");
        goto done;
    }
    if (llama_state_seq_get_size(ctx, seq) != n_state ||
        llama_state_seq_get_data(ctx, again, n_state, seq) != n_state || memcmp(again, state, n_state) != 0) {
        rc = thaw_why(why, n_why, THAW_ELAYOUT, "the restored sequence's state differs from the captured one");
        goto done;
    }
    rc = 0;
done:
    llama_memory_seq_rm(mem, seq, -1, -1);
    free(asm_buf);
    for (int i = 0; i < SELFTEST_TOKENS / SELFTEST_BLOCK; i++)
        free(blk[i]);
    thaw_kvlayout_free(l);
    free(again);
    free(state);
    llama_batch_free(batch);
    return rc;
}
