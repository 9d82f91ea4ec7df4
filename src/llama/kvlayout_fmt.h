/* kvlayout_fmt.h — what kvlayout.c (parse, cut, validate) and
 * kvlayout_asm.c (assemble) share and no one else sees: the layouts'
 * constants (kvlayout.h has the layouts themselves), the byte writers, and
 * a block validated into where its parts start. */
#ifndef THAW_KVLAYOUT_FMT_H
#define THAW_KVLAYOUT_FMT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LLAMA_SEQ_MAGIC 0xaf143cd8u /* llama-context.cpp io_magic (v0.4.0) */
#define BLOCK_MAGIC 0x31424b54u     /* "TKB1" */
#define BLOCK_HEAD 24u              /* fixed block header, bytes */
#define BLOCK_LAYER 24u             /* one layer-table entry, bytes */
#define FLAG_VTRANS 1u
#define FLAG_EXT 2u
#define FLAG_KONLY 4u /* layers without V: an MLA model's latent cache */
#define FLAG_ALL (FLAG_VTRANS | FLAG_EXT | FLAG_KONLY)
#define CELL_EXT 12u     /* llama_kv_cell_ext: i32 x, y; llama_token tok */
#define MAX_LAYERS 4096u /* sanity bounds: more is not a layout we know */
#define MAX_STREAMS 65536u

/* Bytes of one cell's meta in a libllama section: pos, n_seq_id (1),
 * [ext], seq_id. */
static inline size_t meta_stride(int ext)
{
    return 4 + 4 + (ext ? CELL_EXT : 0) + 4;
}

/* Bytes of one cell's meta in a block: pos [| ext]. */
static inline size_t block_meta_stride(int ext)
{
    return 4 + (ext ? CELL_EXT : 0);
}

static inline void put32(uint8_t **p, uint32_t v)
{
    memcpy(*p, &v, 4);
    *p += 4;
}

static inline void put64(uint8_t **p, uint64_t v)
{
    memcpy(*p, &v, 8);
    *p += 8;
}

static inline void put(uint8_t **p, const void *src, size_t n)
{
    memcpy(*p, src, n);
    *p += n;
}

/* A validated block: its header fields and where its parts start (all
 * pointing into the block). */
struct blk {
    const uint8_t *p;
    uint32_t pos0, n_cells, n_layers, flags;
    const uint8_t *table, *meta, *data;
};

/* Validates a block's head (header, layer table, cell meta) within the n
 * bytes at block and fills *k; *total is the size the whole block must
 * have. 0, THAW_ECORRUPT or THAW_EVERSION. */
int kvlayout_block_parse_head(const void *block, size_t n, struct blk *k, uint64_t *total);

/* kvlayout_block_parse_head of a whole block: n must be its *total. */
int kvlayout_block_parse(const void *block, size_t n, struct blk *k);

#endif
