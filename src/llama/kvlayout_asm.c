/* kvlayout_asm.c — assembly: blocks, a frame and a tail back into one
 * libllama sequence-state buffer (kvlayout.h, "assembly" and "assembly
 * straight into place"), the restore side of what kvlayout.c cuts.
 *
 * The state is laid out once from the first block's head (asm_shape: every
 * section's offsets, from the frame and the cell count), its fixed words
 * written (asm_write_section); then each block's head is checked against
 * the first one's and its cells' meta written (asm_place), and its data
 * bytes go where thaw_kvlayout_asm_segments() says, in the order the block
 * holds them: a block file is one preadv straight into place
 * (block_reader.c), a block in memory one memcpy per segment
 * (thaw_kvlayout_asm_copy). Nothing is written before its offset is known
 * to lie inside the buffer (asm_shape's size check).
 *
 * Map:
 *   ---- layout ----       the assembler, its buffer, one section's shape
 *   ---- placing blocks ---- heads, segments, copies, the tail
 *   ---- whole ----        thaw_kvlayout_assemble_ex: blocks in memory, at once
 */
#include "llama/kvlayout.h"
#include "llama/kvlayout_fmt.h"

#include "base/blob.h"
#include "base/error.h"

#include <ggml.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- layout ------------------------------------------------------------------ */

struct thaw_kvlayout_asm {
    struct thaw_kvlayout_frame f;
    uint32_t n_layers, flags, N, next; /* next: cells placed so far */
    uint32_t pos0;         /* the section's first position (0 for section 0) */
    int vtrans, ext, konly;
    uint8_t *table;        /* block 0's layer table, which every block must repeat */
    uint64_t *krow, *vrow; /* per layer, bytes per cell */
    uint32_t *vel;         /* per layer, transposed V: bytes per element */
    size_t *k_off, *v_off; /* per layer, offset in the state of its first K / V byte */
    size_t meta_off, tail_off, size, n_tail, headroom;
    size_t rest_off; /* the counts (0) of the streams after the frame's */
    uint8_t *buf;  /* headroom + size bytes; handed out by finish */
    int blob;      /* buf is a blob (blob.h), not malloc'd */
    uint8_t *base; /* the state in it (valid while the buffer lives) */
    /* the tail laid out as an SWA section whose blocks go straight into
     * place (thaw_kvlayout_asm_swa): an assembler of its own over this
     * one's buffer, which it does not own */
    struct thaw_kvlayout_asm *swa;
    int sub;
};

void thaw_kvlayout_asm_free(struct thaw_kvlayout_asm *a)
{
    if (!a)
        return;
    thaw_kvlayout_asm_free(a->swa);
    if (a->sub)
        ; /* the buffer is the outer assembler's */
    else if (a->blob)
        thaw_blob_unref(a->buf);
    else
        free(a->buf);
    free(a->table);
    free(a->krow);
    free(a->vrow);
    free(a->vel);
    free(a->k_off);
    free(a->v_off);
    free(a);
}

/* Big states get 2 MiB-aligned memory the kernel may back with huge pages:
 * the restore writes every byte once, and 4 KiB faults would cost more than
 * the copy. */
static void *alloc_state(size_t n)
{
    void *p = NULL;

    if (n < (8u << 20))
        return malloc(n);
    if (posix_memalign(&p, 2u << 20, n) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice only */
#endif
    return p;
}

/* Lays out one section (kvlayout.h: u32 n_stream, ...) of n_cells cells
 * from position pos0, shaped as block k, its first word at offset sec_off
 * of the state: a's shape and offsets; *end is the offset past it.
 * Writes nothing. 0, THAW_EINVAL or THAW_ENOMEM. */
static int asm_shape(struct thaw_kvlayout_asm *a, const struct blk *k, uint32_t n_cells, uint32_t pos0,
                     const struct thaw_kvlayout_frame *f, size_t sec_off, size_t *end)
{
    uint64_t cell_bytes = 0;

    if (!f || f->n_stream == 0 || f->stream >= f->n_stream || f->n_stream > MAX_STREAMS || n_cells == 0 ||
        n_cells > INT32_MAX || (uint64_t)pos0 + n_cells > INT32_MAX)
        return THAW_EINVAL;
    a->f = *f;
    a->n_layers = k->n_layers;
    a->flags = k->flags;
    a->vtrans = (k->flags & FLAG_VTRANS) != 0;
    a->ext = (k->flags & FLAG_EXT) != 0;
    a->konly = (k->flags & FLAG_KONLY) != 0;
    a->N = n_cells;
    a->pos0 = pos0;
    uint32_t L = k->n_layers;
    if (!(a->table = malloc((size_t)L * BLOCK_LAYER)) || !(a->krow = calloc(L, sizeof *a->krow)) ||
        !(a->vrow = calloc(L, sizeof *a->vrow)) || !(a->vel = calloc(L, sizeof *a->vel)) ||
        !(a->k_off = calloc(L, sizeof *a->k_off)) || !(a->v_off = calloc(L, sizeof *a->v_off)))
        return THAW_ENOMEM;
    memcpy(a->table, k->table, (size_t)L * BLOCK_LAYER);
    for (uint32_t l = 0; l < L; l++) {
        int32_t vt;
        memcpy(&vt, a->table + (size_t)l * BLOCK_LAYER + 4, 4);
        memcpy(&a->krow[l], a->table + (size_t)l * BLOCK_LAYER + 8, 8);
        memcpy(&a->vrow[l], a->table + (size_t)l * BLOCK_LAYER + 16, 8);
        a->vel[l] = a->vtrans ? (uint32_t)ggml_type_size((enum ggml_type)vt) : 0;
        cell_bytes += a->krow[l] + a->vrow[l]; /* bounded by block_parse_head */
    }
    /* the section's size; the cells' bytes must fit the address space */
    if (cell_bytes > (SIZE_MAX / 4) / n_cells)
        return THAW_ENOMEM;
    size_t off = sec_off + 4 + 4 * (size_t)f->stream + 4;
    a->meta_off = off;
    off += (size_t)n_cells * meta_stride(a->ext) + 8;
    for (uint32_t l = 0; l < L; l++) {
        a->k_off[l] = off + 12;
        off += 12 + (size_t)n_cells * a->krow[l];
    }
    for (uint32_t l = 0; l < L && !a->konly; l++) {
        a->v_off[l] = off + 12;
        off += 12 + (size_t)n_cells * a->vrow[l];
    }
    a->rest_off = off;
    off += 4 * (size_t)(f->n_stream - f->stream - 1);
    *end = off;
    return 0;
}

/* Writes a's section's words (all but the cells' meta and data), its
 * first word at sec_off of a->base. */
static void asm_write_section(struct thaw_kvlayout_asm *a, size_t sec_off)
{
    const struct thaw_kvlayout_frame *f = &a->f;
    uint32_t L = a->n_layers;
    uint8_t *p = a->base + sec_off;

    put32(&p, f->n_stream);
    for (uint32_t st = 0; st < f->stream; st++)
        put32(&p, 0);
    put32(&p, a->N);
    p = a->base + a->meta_off + (size_t)a->N * meta_stride(a->ext);
    put32(&p, (uint32_t)a->vtrans);
    put32(&p, L);
    for (uint32_t l = 0; l < L; l++) {
        p = a->base + a->k_off[l] - 12;
        put(&p, a->table + (size_t)l * BLOCK_LAYER, 4);
        put64(&p, a->krow[l]);
    }
    for (uint32_t l = 0; l < L && !a->konly; l++) {
        p = a->base + a->v_off[l] - 12;
        put(&p, a->table + (size_t)l * BLOCK_LAYER + 4, 4);
        if (!a->vtrans) {
            put64(&p, a->vrow[l]);
        } else {
            put32(&p, a->vel[l]);
            put32(&p, (uint32_t)(a->vrow[l] / a->vel[l]));
        }
    }
    p = a->base + a->rest_off;
    for (uint32_t st = f->stream + 1; st < f->n_stream; st++)
        put32(&p, 0);
}

int thaw_kvlayout_section_size(const void *head0, size_t n_head0, uint32_t n_cells,
                               const struct thaw_kvlayout_frame *f, size_t *n)
{
    struct thaw_kvlayout_asm a = {0};
    struct blk k;
    uint64_t total;
    size_t end = 0;
    int rc = kvlayout_block_parse_head(head0, n_head0, &k, &total);

    if (rc == 0)
        rc = asm_shape(&a, &k, n_cells, 0, f, 0, &end);
    free(a.table);
    free(a.krow);
    free(a.vrow);
    free(a.vel);
    free(a.k_off);
    free(a.v_off);
    *n = end;
    return rc;
}

int thaw_kvlayout_asm_new(const void *head0, size_t n_head0, uint32_t n_cells, const struct thaw_kvlayout_frame *f,
                          size_t n_tail, size_t headroom, unsigned flags, struct thaw_kvlayout_asm **out)
{
    struct thaw_kvlayout_asm *a;
    struct blk k;
    uint64_t total;
    size_t end;
    uint8_t *p;
    int rc;

    *out = NULL;
    if ((rc = kvlayout_block_parse_head(head0, n_head0, &k, &total)) != 0)
        return rc;
    if (!(a = calloc(1, sizeof *a)))
        return THAW_ENOMEM;
    if ((rc = asm_shape(a, &k, n_cells, 0, f, 8, &end)) != 0)
        goto fail;
    a->n_tail = n_tail;
    a->headroom = headroom;
    a->tail_off = end;
    a->size = end + n_tail;
    a->blob = (flags & THAW_KVLAYOUT_ASM_BLOB) != 0;
    if (a->size < end || a->size > SIZE_MAX - headroom ||
        !(a->buf = a->blob ? thaw_blob_alloc(headroom + a->size) : alloc_state(headroom + a->size))) {
        rc = THAW_ENOMEM;
        goto fail;
    }
    a->base = a->buf + headroom;
    /* everything but the cells' meta and data, and the tail */
    p = a->base;
    put32(&p, LLAMA_SEQ_MAGIC);
    put32(&p, (uint32_t)f->seq_id);
    asm_write_section(a, 8);
    *out = a;
    return 0;
fail:
    thaw_kvlayout_asm_free(a);
    return rc;
}

int thaw_kvlayout_asm_swa(struct thaw_kvlayout_asm *a, const void *head0, size_t n_head0, uint32_t pos0,
                          uint32_t n_cells)
{
    struct thaw_kvlayout_asm *w;
    struct blk k;
    uint64_t total;
    size_t end;
    int rc;

    if (a->swa || a->sub || !a->buf)
        return THAW_EINVAL;
    if ((rc = kvlayout_block_parse_head(head0, n_head0, &k, &total)) != 0)
        return rc;
    if (!(w = calloc(1, sizeof *w)))
        return THAW_ENOMEM;
    w->sub = 1;
    if ((rc = asm_shape(w, &k, n_cells, pos0, &a->f, a->tail_off, &end)) != 0 ||
        (rc = end - a->tail_off == a->n_tail ? 0 : THAW_EINVAL) != 0) {
        thaw_kvlayout_asm_free(w);
        return rc;
    }
    w->buf = a->buf;
    w->base = a->base;
    asm_write_section(w, a->tail_off);
    a->swa = w;
    return 0;
}

struct thaw_kvlayout_asm *thaw_kvlayout_asm_swa_part(struct thaw_kvlayout_asm *a)
{
    return a->swa;
}

/* ---- placing blocks ---------------------------------------------------------- */

/* Block k (parsed) is the next one: same shape as block 0, at the next
 * position; its cells' meta written. */
static int asm_place(struct thaw_kvlayout_asm *a, const struct blk *k)
{
    if (k->n_layers != a->n_layers || k->flags != a->flags ||
        memcmp(k->table, a->table, (size_t)a->n_layers * BLOCK_LAYER) != 0)
        return THAW_EMISMATCH;
    if (k->pos0 != a->pos0 + a->next || k->n_cells > a->N - a->next)
        return THAW_EINVAL;
    uint8_t *p = a->base + a->meta_off + (size_t)a->next * meta_stride(a->ext);
    size_t bstride = block_meta_stride(a->ext);
    for (uint32_t c = 0; c < k->n_cells; c++) {
        const uint8_t *m = k->meta + (size_t)c * bstride;
        put(&p, m, 4);
        put32(&p, 1);
        if (a->ext)
            put(&p, m + 4, CELL_EXT);
        put32(&p, (uint32_t)a->f.seq_id);
    }
    a->next += k->n_cells;
    return 0;
}

int thaw_kvlayout_asm_head(struct thaw_kvlayout_asm *a, const void *head, size_t n_head, uint64_t n_block,
                           uint32_t *pos0, uint32_t *n_cells)
{
    struct blk k;
    uint64_t total;
    int rc;

    if ((rc = kvlayout_block_parse_head(head, n_head, &k, &total)) != 0)
        return rc;
    if (total != n_block || (size_t)(k.data - (const uint8_t *)head) != n_head)
        return THAW_ECORRUPT;
    if ((rc = asm_place(a, &k)) != 0)
        return rc;
    *pos0 = k.pos0;
    *n_cells = k.n_cells;
    return 0;
}

int thaw_kvlayout_asm_segments(const struct thaw_kvlayout_asm *a, uint32_t pos0, uint32_t n_cells,
                               struct thaw_kvlayout_cursor *cur, struct iovec *iov, int cap)
{
    uint8_t *base = a->base;
    int n = 0;

    if (pos0 < a->pos0)
        return 0; /* not this section's (asm_head refused it) */
    pos0 -= a->pos0; /* the section's cell */
    while (n < cap && cur->part < (a->konly ? 1u : 2u)) {
        uint32_t l = cur->l;
        if (l == a->n_layers) {
            cur->part++;
            cur->l = cur->j = 0;
            continue;
        }
        if (cur->part == 0) { /* K: the block's rows, one run per layer */
            iov[n].iov_base = base + a->k_off[l] + (size_t)pos0 * a->krow[l];
            iov[n++].iov_len = (size_t)n_cells * a->krow[l];
            cur->l++;
        } else if (!a->vtrans) {
            iov[n].iov_base = base + a->v_off[l] + (size_t)pos0 * a->vrow[l];
            iov[n++].iov_len = (size_t)n_cells * a->vrow[l];
            cur->l++;
        } else { /* transposed V: one run per embedding column */
            size_t el = a->vel[l];
            iov[n].iov_base = base + a->v_off[l] + ((size_t)cur->j * a->N + pos0) * el;
            iov[n++].iov_len = (size_t)n_cells * el;
            if (++cur->j == a->vrow[l] / el) {
                cur->j = 0;
                cur->l++;
            }
        }
    }
    return n;
}

int thaw_kvlayout_asm_copy(struct thaw_kvlayout_asm *a, const void *block, size_t n, uint32_t *n_cells)
{
    struct thaw_kvlayout_cursor cur = {0};
    struct iovec iov[64];
    struct blk k;
    int rc, m;

    if ((rc = kvlayout_block_parse(block, n, &k)) != 0 || (rc = asm_place(a, &k)) != 0)
        return rc;
    const uint8_t *src = k.data;
    while ((m = thaw_kvlayout_asm_segments(a, k.pos0, k.n_cells, &cur, iov, 64)) > 0)
        for (int i = 0; i < m; i++) {
            memcpy(iov[i].iov_base, src, iov[i].iov_len);
            src += iov[i].iov_len;
        }
    if (n_cells)
        *n_cells = k.n_cells;
    return 0;
}

int thaw_kvlayout_asm_finish(struct thaw_kvlayout_asm *a, const void *tail, size_t n_tail, void **out, size_t *n_out)
{
    if (a->sub || a->next != a->N)
        return THAW_EINVAL;
    if (a->swa ? n_tail != 0 || a->swa->next != a->swa->N : n_tail != a->n_tail || (n_tail && !tail))
        return THAW_EINVAL;
    if (n_tail)
        memcpy(a->buf + a->headroom + a->tail_off, tail, n_tail);
    *out = a->buf;
    *n_out = a->size;
    a->buf = NULL;
    return 0;
}

/* ---- whole ------------------------------------------------------------------- */

int thaw_kvlayout_assemble(const void *const *blocks, const size_t *sizes, int n_blocks,
                           const struct thaw_kvlayout_frame *f, const void *tail, size_t n_tail, void **out,
                           size_t *n_out)
{
    return thaw_kvlayout_assemble_ex(blocks, sizes, n_blocks, f, tail, n_tail, 0, out, n_out);
}

int thaw_kvlayout_assemble_ex(const void *const *blocks, const size_t *sizes, int n_blocks,
                              const struct thaw_kvlayout_frame *f, const void *tail, size_t n_tail, size_t headroom,
                              void **out, size_t *n_out)
{
    struct thaw_kvlayout_asm *a = NULL;
    struct blk k;
    uint64_t n_cells = 0;
    int rc;

    *out = NULL;
    *n_out = 0;
    if (n_blocks <= 0 || !f || f->n_stream == 0 || f->stream >= f->n_stream || (n_tail && !tail))
        return THAW_EINVAL;
    for (int i = 0; i < n_blocks; i++) {
        if ((rc = kvlayout_block_parse(blocks[i], sizes[i], &k)) != 0)
            return rc;
        n_cells += k.n_cells;
    }
    if (n_cells > INT32_MAX)
        return THAW_EINVAL;
    if ((rc = thaw_kvlayout_asm_new(blocks[0], sizes[0], (uint32_t)n_cells, f, n_tail, headroom, 0, &a)) != 0)
        return rc;
    for (int i = 0; i < n_blocks && rc == 0; i++)
        rc = thaw_kvlayout_asm_copy(a, blocks[i], sizes[i], NULL);
    if (rc == 0)
        rc = thaw_kvlayout_asm_finish(a, tail, n_tail, out, n_out);
    thaw_kvlayout_asm_free(a);
    return rc;
}
