/* blocks.c — content-addressed blocks and manifests (blocks.h). */
#include "blocks.h"

#include "blob.h"
#include "error.h"
#include "kvstate.h"

#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MANIFEST_MAGIC 0x31464d54u /* "TMF1" */
#define MANIFEST_VERSION 1u

struct manifest_header {
    uint32_t magic, version, n_tokens, block_tokens;
    uint32_t n_blocks, reserved;
    uint64_t tail_size, swa_size;
};

static const char ID_TAG[] = "thaw-block-v1";

void thaw_blocks_ids(const uint8_t binding[32], uint32_t block_tokens, const llama_token *toks, int n,
                     uint8_t (*ids)[THAW_BLOCKS_ID_BYTES])
{
    static const uint8_t zero[THAW_BLOCKS_ID_BYTES];

    for (int k = 0; block_tokens > 0 && (int64_t)(k + 1) * block_tokens <= n; k++) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, binding, 32, THAW_BLOCKS_ID_BYTES);
        crypto_generichash_update(&st, (const uint8_t *)ID_TAG, sizeof ID_TAG);
        crypto_generichash_update(&st, k ? ids[k - 1] : zero, THAW_BLOCKS_ID_BYTES);
        /* i32 little-endian: the host's on every platform thaw builds for */
        crypto_generichash_update(&st, (const uint8_t *)(toks + (size_t)k * block_tokens),
                                  (size_t)block_tokens * sizeof(int32_t));
        crypto_generichash_final(&st, ids[k], THAW_BLOCKS_ID_BYTES);
    }
}

/* Held by the disk: committed, or still in the writer's queue (a block
 * submitted by the turn before, not yet written, is not written twice). */
int thaw_blocks_is_manifest(const void *blob, size_t n)
{
    uint32_t magic;

    if (!blob || n < sizeof(struct manifest_header))
        return 0;
    memcpy(&magic, blob, sizeof magic);
    return magic == MANIFEST_MAGIC;
}

int thaw_blocks_store(struct thaw_disk_cache *c, const uint8_t binding[32], uint32_t block_tokens,
                      const llama_token *toks, int n, const void *state, size_t n_state, void **manifest,
                      size_t *n_manifest, struct thaw_blocks_stats *st)
{
    struct thaw_blocks_stats local = {0};
    struct thaw_kvlayout *l = NULL;
    uint8_t(*ids)[THAW_BLOCKS_ID_BYTES] = NULL;
    uint32_t n_blocks = 0;
    bool held = false;
    int rc;

    *manifest = NULL;
    *n_manifest = 0;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (n <= 0 || block_tokens == 0)
        return THAW_EINVAL;
    if ((rc = thaw_kvlayout_parse(state, n_state, &l)) != 0)
        return rc == THAW_ECORRUPT ? THAW_ELAYOUT : rc; /* fresh from libllama: not damage */
    if (thaw_kvlayout_n_cells(l) != (uint32_t)n) {
        rc = THAW_EINVAL;
        goto out;
    }
    n_blocks = (uint32_t)n / block_tokens;
    if (!(ids = malloc(((size_t)n_blocks + 1) * sizeof *ids))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    thaw_blocks_ids(binding, block_tokens, toks, n, ids);
    /* Before looking: a block found present must not be collected before
     * the manifest that names it is queued (blocks.h: the caller unholds) */
    thaw_disk_cache_hold(c, ids[0], n_blocks);
    held = true;
    for (uint32_t k = 0; k < n_blocks; k++) {
        if (thaw_disk_cache_has(c, ids[k])) {
            st->skipped++;
            continue;
        }
        uint32_t a = k * block_tokens, b = a + block_tokens;
        size_t size = thaw_kvlayout_block_size(l, a, b);
        struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
        if (!(parts[THAW_PART_KV].data = thaw_blob_alloc(size))) {
            rc = THAW_ENOMEM;
            goto out;
        }
        parts[THAW_PART_KV].size = size;
        if ((rc = thaw_kvlayout_cut(l, a, b, parts[THAW_PART_KV].data, size)) != 0) {
            thaw_blob_unref(parts[THAW_PART_KV].data);
            goto out;
        }
        if ((rc = thaw_disk_cache_submit(c, ids[k], block_tokens, parts, NULL, 0)) != 0) {
            thaw_blob_unref(parts[THAW_PART_KV].data);
            st->dropped++;
            goto out;
        }
        st->written++;
        st->bytes_written += size;
    }
    /* the manifest: tokens, ids, the cells past the last whole block, the SWA window */
    uint32_t a = n_blocks * block_tokens;
    size_t tail_size = a < (uint32_t)n ? thaw_kvlayout_block_size(l, a, (uint32_t)n) : 0;
    const void *swa;
    size_t swa_size;
    thaw_kvlayout_tail(l, &swa, &swa_size);
    size_t head = sizeof(struct manifest_header) + (size_t)n * sizeof(int32_t) + (size_t)n_blocks * sizeof *ids;
    size_t total = head + tail_size + swa_size;
    uint8_t *m = thaw_blob_alloc(total);
    if (!m) {
        rc = THAW_ENOMEM;
        goto out;
    }
    struct manifest_header h = {MANIFEST_MAGIC, MANIFEST_VERSION, (uint32_t)n, block_tokens, n_blocks, 0,
                                tail_size,      swa_size};
    memcpy(m, &h, sizeof h);
    memcpy(m + sizeof h, toks, (size_t)n * sizeof(int32_t));
    memcpy(m + sizeof h + (size_t)n * sizeof(int32_t), ids, (size_t)n_blocks * sizeof *ids);
    if (tail_size && (rc = thaw_kvlayout_cut(l, a, (uint32_t)n, m + head, tail_size)) != 0) {
        thaw_blob_unref(m);
        goto out;
    }
    if (swa_size)
        memcpy(m + head + tail_size, swa, swa_size);
    *manifest = m;
    *n_manifest = total;
    rc = 0;
out:
    if (rc != 0 && held)
        thaw_disk_cache_unhold(c, ids[0], n_blocks);
    free(ids);
    thaw_kvlayout_free(l);
    return rc;
}

void thaw_blocks_state_free(struct thaw_blocks_state *s)
{
    if (!s)
        return;
    free(s->kv);
    memset(s, 0, sizeof *s);
}

/* Reads blocks ids[0, n_ids) (block k must hold positions [kB, (k+1)B)),
 * then appends the extra block (the tail; may be NULL) and the SWA window,
 * and assembles them for frame f. */
static int load_blocks(struct thaw_disk_cache *c, const uint8_t (*ids)[THAW_BLOCKS_ID_BYTES], uint32_t n_ids,
                       uint32_t block_tokens, const void *tail, size_t tail_size, const void *swa, size_t swa_size,
                       const struct thaw_kvlayout_frame *f, const llama_token *toks, int n_toks,
                       struct thaw_blocks_state *out)
{
    struct thaw_disk_entry **ents = calloc((size_t)n_ids + 1, sizeof *ents);
    void **queued = calloc((size_t)n_ids + 1, sizeof *queued); /* blocks still in the writer's queue */
    const void **blocks = calloc((size_t)n_ids + 1, sizeof *blocks);
    size_t *sizes = calloc((size_t)n_ids + 1, sizeof *sizes);
    int rc = 0, nb = 0;

    if (!ents || !queued || !blocks || !sizes) {
        rc = THAW_ENOMEM;
        goto out;
    }
    for (uint32_t k = 0; k < n_ids; k++) {
        uint32_t pos0, cells;
        struct thaw_part_blob pend[THAW_PART_COUNT];
        if (thaw_disk_cache_pending(c, ids[k], pend) == 0) {
            for (int p = 1; p < THAW_PART_COUNT; p++)
                thaw_blob_unref(pend[p].data);
            queued[k] = pend[THAW_PART_KV].data;
            blocks[nb] = queued[k];
            sizes[nb] = pend[THAW_PART_KV].size;
        } else if ((rc = thaw_disk_cache_lookup(c, ids[k], &ents[k])) != 0) {
            rc = rc == THAW_ECORRUPT ? THAW_ENOTFOUND : rc; /* removed by the disk tier */
            goto out;
        } else {
            blocks[nb] = thaw_disk_entry_part(ents[k], THAW_PART_KV, &sizes[nb]);
        }
        if (thaw_kvlayout_block_info(blocks[nb], sizes[nb], &pos0, &cells) != 0 || pos0 != k * block_tokens ||
            cells != block_tokens) {
            rc = THAW_ECORRUPT;
            goto out;
        }
        nb++;
    }
    if (tail_size) {
        /* the tail must hold exactly the cells past the whole blocks: its
         * own header says how many, and assembly checks only the order */
        uint32_t pos0, cells;
        if (thaw_kvlayout_block_info(tail, tail_size, &pos0, &cells) != 0 || pos0 != n_ids * block_tokens ||
            (int64_t)pos0 + cells != n_toks) {
            rc = THAW_ECORRUPT;
            goto out;
        }
        blocks[nb] = tail;
        sizes[nb++] = tail_size;
    }
    size_t head = thaw_kvstate_head_size(n_toks), n_state;
    rc = thaw_kvlayout_assemble_ex(blocks, sizes, nb, f, swa, swa_size, head, &out->kv, &n_state);
    if (rc == THAW_EINVAL || rc == THAW_EMISMATCH || rc == THAW_EVERSION)
        rc = THAW_ECORRUPT; /* blocks that do not fit together */
    if (rc == 0) {
        thaw_kvstate_write_head(out->kv, toks, n_toks, n_state);
        out->n_kv = head + n_state;
        out->n_tokens = n_toks;
        out->n_blocks = (int)n_ids;
    }
out:
    for (uint32_t k = 0; ents && queued && k < n_ids; k++) {
        thaw_disk_entry_release(ents[k]);
        thaw_blob_unref(queued[k]);
    }
    free(ents);
    free(queued);
    free(blocks);
    free(sizes);
    return rc;
}

/* Validates a manifest's header against its size. */
static int manifest_header(const void *manifest, size_t n_manifest, struct manifest_header *h)
{
    if (!thaw_blocks_is_manifest(manifest, n_manifest))
        return THAW_ECORRUPT;
    memcpy(h, manifest, sizeof *h);
    if (h->version != MANIFEST_VERSION)
        return THAW_EVERSION;
    /* every length against the blob, in 64 bits */
    uint64_t need = (uint64_t)sizeof *h + (uint64_t)h->n_tokens * 4 + (uint64_t)h->n_blocks * THAW_BLOCKS_ID_BYTES;
    if (h->block_tokens == 0 || h->n_tokens == 0 || h->n_blocks != h->n_tokens / h->block_tokens ||
        (h->tail_size == 0) != (h->n_tokens % h->block_tokens == 0) || h->tail_size > n_manifest ||
        h->swa_size > n_manifest || need + h->tail_size + h->swa_size != n_manifest)
        return THAW_ECORRUPT;
    return 0;
}

int thaw_blocks_manifest_ids(const void *manifest, size_t n, const uint8_t **ids, uint32_t *n_ids)
{
    struct manifest_header h;
    int rc = manifest_header(manifest, n, &h);

    if (rc != 0)
        return rc;
    *ids = (const uint8_t *)manifest + sizeof h + (size_t)h.n_tokens * 4;
    *n_ids = h.n_blocks;
    return 0;
}

int thaw_blocks_classify(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs)
{
    uint32_t pos0, cells;

    (void)ud;
    if (thaw_blocks_is_manifest(kv, n)) {
        if (thaw_blocks_manifest_ids(kv, n, refs, n_refs) != 0) {
            *refs = NULL; /* it will not load either: a miss, naming nothing */
            *n_refs = 0;
        }
        return THAW_DISK_KIND_ROOT;
    }
    if (thaw_kvlayout_block_info(kv, n, &pos0, &cells) == 0)
        return THAW_DISK_KIND_BLOCK;
    return THAW_DISK_KIND_ROOT;
}

int thaw_blocks_load(struct thaw_disk_cache *c, const void *manifest, size_t n_manifest,
                     const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    struct manifest_header h;
    const uint8_t *m = manifest;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = manifest_header(manifest, n_manifest, &h)) != 0)
        return rc;
    const uint8_t *toks = m + sizeof h;
    const uint8_t *ids = toks + (size_t)h.n_tokens * 4;
    const uint8_t *tail = ids + (size_t)h.n_blocks * THAW_BLOCKS_ID_BYTES;
    llama_token *tokens = malloc((size_t)h.n_tokens * sizeof(llama_token)); /* aligned */
    if (!tokens)
        return THAW_ENOMEM;
    memcpy(tokens, toks, (size_t)h.n_tokens * sizeof(llama_token));
    rc = load_blocks(c, (const uint8_t(*)[THAW_BLOCKS_ID_BYTES])ids, h.n_blocks, h.block_tokens, tail, h.tail_size,
                     tail + h.tail_size, h.swa_size, f, tokens, (int)h.n_tokens, out);
    free(tokens);
    if (rc != 0)
        thaw_blocks_state_free(out);
    return rc;
}

int thaw_blocks_prefix(struct thaw_disk_cache *c, const uint8_t binding[32], uint32_t block_tokens,
                       const llama_token *toks, int n, const struct thaw_kvlayout_frame *f,
                       struct thaw_blocks_state *out)
{
    uint8_t(*ids)[THAW_BLOCKS_ID_BYTES];
    int rc;

    memset(out, 0, sizeof *out);
    if (block_tokens == 0 || n <= 1)
        return THAW_ENOTFOUND;
    uint32_t n_blocks = (uint32_t)(n - 1) / block_tokens; /* one token left to decode */
    if (n_blocks == 0)
        return THAW_ENOTFOUND;
    if (!(ids = malloc((size_t)n_blocks * sizeof *ids)))
        return THAW_ENOMEM;
    thaw_blocks_ids(binding, block_tokens, toks, (int)(n_blocks * block_tokens), ids);
    /* a block found bad on the way is removed by the disk tier: the run
     * ends before it, so try again with what is left (a few times) */
    rc = THAW_ENOTFOUND;
    for (int attempt = 0; attempt < 3 && rc == THAW_ENOTFOUND; attempt++) {
        uint32_t run = 0;
        while (run < n_blocks && thaw_disk_cache_has(c, ids[run]))
            run++;
        if (run == 0)
            break;
        rc = load_blocks(c, (const uint8_t(*)[THAW_BLOCKS_ID_BYTES])ids, run, block_tokens, NULL, 0, NULL, 0, f, toks,
                         (int)(run * block_tokens), out);
        if (rc != 0)
            thaw_blocks_state_free(out);
    }
    free(ids);
    return rc;
}
