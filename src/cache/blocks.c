/* blocks.c — content-addressed blocks and manifests (blocks.h): the ids,
 * cutting and storing, the manifest codec, and which blocks a load needs;
 * reading them into place is block_reader.c's. */
#include "cache/blocks.h"

#include "base/blob.h"
#include "base/error.h"
#include "cache/cache_ram.h"
#include "cache/snapshots.h"
#include "cache/tiers.h"
#include "llama/kvstate.h"

#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MANIFEST_MAGIC 0x31464d54u /* "TMF1" */
#define MANIFEST_VERSION 1u
#define MANIFEST_VERSION_SWA 2u /* blocks carry SWA rows (blocks.h) */

struct manifest_header {
    uint32_t magic, version, n_tokens, block_tokens;
    uint32_t n_blocks, n_snaps; /* n_snaps: 0 before snapshots (it was reserved) */
    uint64_t tail_size, swa_size;
};

/* version 2 goes on with this */
struct manifest_swa {
    uint32_t swa_first, n_window;
    uint64_t swa_tail_size;
};

static const char ID_TAG[] = "thaw-block-v1";
static const char SWA_TAG[] = "thaw-swa-v1";

void thaw_blocks_swa_id(const uint8_t id[THAW_KEY_BYTES], uint8_t sid[THAW_KEY_BYTES])
{
    crypto_generichash(sid, THAW_KEY_BYTES, (const uint8_t *)SWA_TAG, sizeof SWA_TAG, id, THAW_KEY_BYTES);
}

/* The first block whose SWA rows a restore at n needs: the window
 * [n - n_window, n) starts in it (the token at n attends to the n_window - 1
 * before it). */
static uint32_t swa_first_needed(uint32_t n, uint32_t n_window, uint32_t block_tokens)
{
    return n > n_window ? (n - n_window) / block_tokens : 0;
}

void thaw_blocks_ids(const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, const llama_token *toks, int n,
                     uint8_t (*ids)[THAW_KEY_BYTES])
{
    static const uint8_t zero[THAW_KEY_BYTES];

    for (int k = 0; block_tokens > 0 && (int64_t)(k + 1) * block_tokens <= n; k++) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, binding, THAW_KEY_BYTES, THAW_KEY_BYTES);
        crypto_generichash_update(&st, (const uint8_t *)ID_TAG, sizeof ID_TAG);
        crypto_generichash_update(&st, k ? ids[k - 1] : zero, THAW_KEY_BYTES);
        /* i32 little-endian: the host's on every platform thaw builds for */
        crypto_generichash_update(&st, (const uint8_t *)(toks + (size_t)k * block_tokens),
                                  (size_t)block_tokens * sizeof(int32_t));
        crypto_generichash_final(&st, ids[k], THAW_KEY_BYTES);
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

/* A parsed capture as a store's source. */
static size_t layout_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvlayout_block_size(ud, a, b);
}

static int layout_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    return thaw_kvlayout_cut(ud, a, b, dst, cap);
}

/* A capture's SWA section as a source of SWA blocks: the window it holds. */
struct capture_swa {
    const struct thaw_kvlayout *l;
    struct thaw_kvlayout_mem *mem;
    int unused;
};

static size_t capture_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvlayout_block_size(((const struct capture_swa *)ud)->l, a, b);
}

static int capture_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    return thaw_kvlayout_cut(((const struct capture_swa *)ud)->l, a, b, dst, cap);
}

static size_t capture_swa_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvlayout_mem_block_size(((const struct capture_swa *)ud)->mem, a, b);
}

static int capture_swa_known(const void *ud, uint32_t a, uint32_t b)
{
    const struct capture_swa *cs = ud;
    int32_t *idx = malloc((size_t)(b - a) * sizeof *idx);
    int ok = idx && thaw_kvlayout_swa_find(cs->l, a, b, idx) == 0;

    free(idx);
    return ok;
}

static int capture_swa_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    const struct capture_swa *cs = ud;
    int32_t *idx = malloc((size_t)(b - a) * sizeof *idx);
    int rc = !idx ? THAW_ENOMEM : thaw_kvlayout_swa_find(cs->l, a, b, idx);

    if (rc == 0)
        rc = thaw_kvlayout_mem_cut(cs->mem, 0, a, b, idx, dst, cap);
    free(idx);
    return rc;
}

int thaw_blocks_store(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                      uint32_t block_tokens, const llama_token *toks, int n, const void *state, size_t n_state,
                      void **manifest, size_t *n_manifest, struct thaw_blocks_stats *st)
{
    return thaw_blocks_store_window(c, ram, binding, block_tokens, 0, toks, n, state, n_state, manifest, n_manifest,
                                    st);
}

int thaw_blocks_store_window(struct thaw_disk_cache *c, struct thaw_ram_cache *ram,
                             const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, uint32_t window,
                             const llama_token *toks, int n, const void *state, size_t n_state, void **manifest,
                             size_t *n_manifest, struct thaw_blocks_stats *st)
{
    struct thaw_kvlayout *l = NULL;
    int rc;

    *manifest = NULL;
    *n_manifest = 0;
    if (st)
        memset(st, 0, sizeof *st);
    if (n <= 0 || block_tokens == 0)
        return THAW_EINVAL;
    if ((rc = thaw_kvlayout_parse(state, n_state, &l)) != 0)
        return rc == THAW_ECORRUPT ? THAW_ELAYOUT : rc; /* fresh from libllama: not damage */
    struct thaw_blocks_src src = {thaw_kvlayout_n_cells(l), layout_size, layout_cut, NULL, l, NULL, 0,
                                  NULL, NULL, NULL, 0, NULL, 0};
    thaw_kvlayout_tail(l, &src.swa, &src.n_swa);
    struct capture_swa cs = {l, NULL, 0};
    if (window > 0 && thaw_kvlayout_swa_n_cells(l) > 0 && thaw_kvlayout_swa_mem(l, &cs.mem) == 0) {
        /* the window's SWA rows, while the capture holds them */
        src.swa_size = capture_swa_size;
        src.swa_cut = capture_swa_cut;
        src.swa_known = capture_swa_known;
        src.n_window = window;
        src.ud = &cs;
        src.size = capture_size;
        src.cut = capture_cut;
    }
    rc = thaw_blocks_store_src(c, ram, binding, block_tokens, toks, n, &src, manifest, n_manifest, st);
    thaw_kvlayout_mem_free(cs.mem);
    thaw_kvlayout_free(l);
    return rc;
}

/* Submits block id (cells [ka, kb) cut by `cut`, unless the RAM tier holds
 * it) to the disk writer. 0, or an error (THAW_EBUSY: the writer dropped it). */
static int put_block(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                     uint32_t block_tokens, size_t (*size_fn)(const void *, uint32_t, uint32_t),
                     int (*cut)(const void *, uint32_t, uint32_t, void *, size_t), const void *ud, uint32_t ka,
                     uint32_t kb, struct thaw_blocks_stats *st)
{
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    size_t size = 0, held_size = 0;
    int rc;

    /* the RAM tier may hold it still (the disk dropped or collected it) */
    if ((parts[THAW_PART_KV].data = thaw_ram_cache_block(ram, id, &held_size)) != NULL) {
        size = held_size;
    } else {
        size = size_fn(ud, ka, kb);
        if (!(parts[THAW_PART_KV].data = thaw_blob_alloc(size)))
            return THAW_ENOMEM;
        if ((rc = cut(ud, ka, kb, parts[THAW_PART_KV].data, size)) != 0) {
            thaw_blob_unref(parts[THAW_PART_KV].data);
            return rc;
        }
        /* one copy for both tiers: the RAM tier keeps a reference */
        if (ram)
            (void)thaw_ram_cache_put_block(ram, id, thaw_blob_ref(parts[THAW_PART_KV].data), size);
    }
    parts[THAW_PART_KV].size = size;
    if ((rc = thaw_disk_cache_submit(c, id, block_tokens, parts, NULL, 0)) != 0) {
        thaw_blob_unref(parts[THAW_PART_KV].data);
        st->dropped++;
        return rc;
    }
    st->written++;
    st->bytes_written += size;
    return 0;
}

int thaw_blocks_store_src(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                          uint32_t block_tokens, const llama_token *toks, int n, const struct thaw_blocks_src *src,
                          void **manifest, size_t *n_manifest, struct thaw_blocks_stats *st)
{
    struct thaw_blocks_stats local = {0};
    uint8_t(*ids)[THAW_KEY_BYTES] = NULL; /* the block ids, then the SWA block ids */
    uint8_t(*sids)[THAW_KEY_BYTES] = NULL;
    uint8_t *todo = NULL; /* per block: 0 held, 1 in the RAM tier, 2 to cut */
    uint32_t n_blocks = 0, swa_first = 0;
    bool held = false, swa_held = false, swa = false;
    int rc;

    *manifest = NULL;
    *n_manifest = 0;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (n <= 0 || block_tokens == 0)
        return THAW_EINVAL;
    if (src->n_cells != (uint32_t)n)
        return THAW_EINVAL;
    if (src->n_snaps && src->swa_cut)
        return THAW_EINVAL; /* snapshots or SWA rows (blocks.h): no layout has both */
    n_blocks = (uint32_t)n / block_tokens;
    if (!(ids = malloc((2 * (size_t)n_blocks + 1) * sizeof *ids)) || !(todo = calloc((size_t)n_blocks + 1, 1))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    sids = ids + n_blocks;
    thaw_blocks_ids(binding, block_tokens, toks, n, ids);
    /* Before looking: a block found present must not be collected before
     * the manifest that names it is queued (blocks.h: the caller unholds) */
    thaw_disk_cache_hold(c, ids[0], n_blocks);
    held = true;
    /* what to write, and whether the source can give it all, before any
     * of it is submitted */
    uint32_t a = n_blocks * block_tokens;
    if (src->known && a < (uint32_t)n && !src->known(src->ud, a, (uint32_t)n)) {
        rc = THAW_ENOTFOUND;
        goto out;
    }
    for (uint32_t k = 0; k < n_blocks; k++) {
        if (thaw_disk_cache_has(c, ids[k]))
            continue;
        todo[k] = thaw_ram_cache_has_block(ram, ids[k]) ? 1 : 2;
        if (todo[k] == 2 && src->known && !src->known(src->ud, k * block_tokens, (k + 1) * block_tokens)) {
            rc = THAW_ENOTFOUND;
            goto out;
        }
    }
    /* SWA rows (DESIGN §12): the SWA blocks a restore at n needs must be
     * stored or cuttable, and the tail's rows cuttable; then every earlier
     * one the source still has goes too (a run ending at the last block) */
    if (src->swa_cut && src->n_window > 0) {
        uint32_t need = swa_first_needed((uint32_t)n, src->n_window, block_tokens);
        swa = a >= (uint32_t)n || src->swa_known(src->ud, a, (uint32_t)n);
        swa_first = n_blocks;
        for (uint32_t k = n_blocks; swa && k-- > 0;) {
            thaw_blocks_swa_id(ids[k], sids[k]);
            if (!thaw_tiers_has(c, ram, sids[k]) && !src->swa_known(src->ud, k * block_tokens, (k + 1) * block_tokens))
                break;
            swa_first = k;
        }
        if (swa && swa_first > need && need < n_blocks)
            swa = false;
        if (swa) {
            thaw_disk_cache_hold(c, sids[swa_first], n_blocks - swa_first);
            swa_held = true;
        }
    }
    if (!swa && src->n_window > 0 && src->swa_cut && !src->swa) {
        rc = THAW_ENOTFOUND; /* neither SWA rows nor a window: capture the state instead */
        goto out;
    }
    for (uint32_t k = 0; k < n_blocks; k++) {
        if (!todo[k]) {
            st->skipped++;
            continue;
        }
        uint32_t ka = k * block_tokens;
        if ((rc = put_block(c, ram, ids[k], block_tokens, src->size, src->cut, src->ud, ka, ka + block_tokens, st)) != 0)
            goto out;
    }
    for (uint32_t k = swa_first; swa && k < n_blocks; k++) {
        if (thaw_disk_cache_has(c, sids[k])) {
            st->skipped++;
            continue;
        }
        uint32_t ka = k * block_tokens;
        if ((rc = put_block(c, ram, sids[k], block_tokens, src->swa_size, src->swa_cut, src->ud, ka,
                            ka + block_tokens, st)) != 0)
            goto out;
    }
    /* the manifest: tokens, ids, the cells past the last whole block, the
     * SWA window; or, with SWA rows, the SWA ids and the tail's SWA rows
     * instead of the window; or, for a hybrid, its snapshots instead of
     * the tail and the window (the last snapshot holds both) */
    uint32_t n_sids = swa ? n_blocks - swa_first : 0;
    uint32_t n_snaps = src->n_snaps;
    size_t tail_size = a < (uint32_t)n && !n_snaps ? src->size(src->ud, a, (uint32_t)n) : 0;
    size_t swa_tail = swa && a < (uint32_t)n ? src->swa_size(src->ud, a, (uint32_t)n) : 0;
    size_t window = swa || n_snaps ? 0 : src->n_swa;
    size_t hsize = sizeof(struct manifest_header) + (swa ? sizeof(struct manifest_swa) : 0);
    size_t head = hsize + (size_t)n * sizeof(int32_t) + ((size_t)n_blocks + n_sids + n_snaps) * sizeof *ids;
    size_t total = head + tail_size + swa_tail + window;
    uint8_t *m = thaw_blob_alloc(total);
    if (!m) {
        rc = THAW_ENOMEM;
        goto out;
    }
    struct manifest_header h = {MANIFEST_MAGIC, swa ? MANIFEST_VERSION_SWA : MANIFEST_VERSION, (uint32_t)n,
                                block_tokens,   n_blocks, n_snaps, tail_size, window};
    memcpy(m, &h, sizeof h);
    if (swa) {
        struct manifest_swa hs = {swa_first, src->n_window, swa_tail};
        memcpy(m + sizeof h, &hs, sizeof hs);
    }
    memcpy(m + hsize, toks, (size_t)n * sizeof(int32_t));
    memcpy(m + hsize + (size_t)n * sizeof(int32_t), ids, (size_t)n_blocks * sizeof *ids);
    if (n_sids)
        memcpy(m + hsize + (size_t)n * sizeof(int32_t) + (size_t)n_blocks * sizeof *ids, sids[swa_first],
               (size_t)n_sids * sizeof *ids);
    if (n_snaps)
        memcpy(m + hsize + (size_t)n * sizeof(int32_t) + ((size_t)n_blocks + n_sids) * sizeof *ids, src->snaps,
               (size_t)n_snaps * sizeof *ids);
    if (tail_size && (rc = src->cut(src->ud, a, (uint32_t)n, m + head, tail_size)) != 0) {
        thaw_blob_unref(m);
        goto out;
    }
    if (swa_tail && (rc = src->swa_cut(src->ud, a, (uint32_t)n, m + head + tail_size, swa_tail)) != 0) {
        thaw_blob_unref(m);
        goto out;
    }
    if (window)
        memcpy(m + head + tail_size, src->swa, window);
    *manifest = m;
    *n_manifest = total;
    rc = 0;
out:
    if (rc != 0 && held)
        thaw_disk_cache_unhold(c, ids[0], n_blocks);
    if (rc != 0 && swa_held)
        thaw_disk_cache_unhold(c, sids[swa_first], n_blocks - swa_first);
    free(todo);
    free(ids);
    return rc;
}

/* A manifest's header, either version, validated against its size. */
struct manifest {
    struct manifest_header h;
    struct manifest_swa w; /* all 0 in version 1 */
    size_t hsize;          /* bytes of header */
    uint32_t n_sids;       /* SWA ids after the ids */
};

static int manifest_header(const void *manifest, size_t n_manifest, struct manifest *mf)
{
    struct manifest_header *h = &mf->h;

    memset(mf, 0, sizeof *mf);
    if (!thaw_blocks_is_manifest(manifest, n_manifest))
        return THAW_ECORRUPT;
    memcpy(h, manifest, sizeof *h);
    mf->hsize = sizeof *h;
    if (h->version == MANIFEST_VERSION_SWA) {
        if (n_manifest < sizeof *h + sizeof mf->w)
            return THAW_ECORRUPT;
        memcpy(&mf->w, (const uint8_t *)manifest + sizeof *h, sizeof mf->w);
        mf->hsize += sizeof mf->w;
        if (h->swa_size != 0 || mf->w.n_window == 0 || mf->w.swa_first > h->n_blocks ||
            (mf->w.swa_tail_size == 0) != (h->tail_size == 0) || mf->w.swa_tail_size > n_manifest)
            return THAW_ECORRUPT;
        mf->n_sids = h->n_blocks - mf->w.swa_first;
    } else if (h->version != MANIFEST_VERSION) {
        return THAW_EVERSION;
    }
    /* every length against the blob, in 64 bits */
    uint64_t need = (uint64_t)mf->hsize + (uint64_t)h->n_tokens * 4 +
                    ((uint64_t)h->n_blocks + mf->n_sids + h->n_snaps) * THAW_KEY_BYTES;
    if (h->block_tokens == 0 || h->n_tokens == 0 || h->n_blocks != h->n_tokens / h->block_tokens ||
        h->n_snaps > THAW_DISK_REFS_MAX || h->tail_size > n_manifest || h->swa_size > n_manifest ||
        need + h->tail_size + h->swa_size + mf->w.swa_tail_size != n_manifest)
        return THAW_ECORRUPT;
    /* the tail: inline, or in the last snapshot (which holds the swa part
     * too); snapshots are version 1's (blocks.h): SWA rows are not */
    if (h->n_snaps ? h->tail_size != 0 || h->swa_size != 0 || h->version != MANIFEST_VERSION
                   : (h->tail_size == 0) != (h->n_tokens % h->block_tokens == 0))
        return THAW_ECORRUPT;
    /* a restore at n_tokens needs the SWA blocks from the window's start */
    if (h->version == MANIFEST_VERSION_SWA &&
        swa_first_needed(h->n_tokens, mf->w.n_window, h->block_tokens) < mf->w.swa_first &&
        swa_first_needed(h->n_tokens, mf->w.n_window, h->block_tokens) < h->n_blocks)
        return THAW_ECORRUPT;
    return 0;
}

int thaw_blocks_manifest_ids(const void *manifest, size_t n, const uint8_t **ids, uint32_t *n_ids)
{
    struct manifest mf;
    int rc = manifest_header(manifest, n, &mf);

    if (rc != 0)
        return rc;
    *ids = (const uint8_t *)manifest + mf.hsize + (size_t)mf.h.n_tokens * 4;
    *n_ids = mf.h.n_blocks + mf.n_sids + mf.h.n_snaps; /* the SWA ids, then the snapshots, follow the ids */
    return 0;
}

int thaw_blocks_manifest_swa_rows(const void *manifest, size_t n)
{
    struct manifest mf;

    return manifest_header(manifest, n, &mf) == 0 && mf.h.version == MANIFEST_VERSION_SWA;
}

int thaw_blocks_manifest_snaps(const void *manifest, size_t n, const uint8_t **snaps, uint32_t *n_snaps)
{
    struct manifest mf;
    int rc = manifest_header(manifest, n, &mf);

    if (rc != 0)
        return rc;
    *snaps = (const uint8_t *)manifest + mf.hsize + (size_t)mf.h.n_tokens * 4 +
             ((size_t)mf.h.n_blocks + mf.n_sids) * THAW_KEY_BYTES;
    *n_snaps = mf.h.n_snaps;
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
    if (thaw_kvlayout_block_info(kv, n, &pos0, &cells) == 0 || thaw_snapshots_is(kv, n))
        return THAW_DISK_KIND_BLOCK; /* a snapshot lives as a block does: while a manifest names it */
    return THAW_DISK_KIND_ROOT;
}

int thaw_blocks_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest, size_t n_manifest,
                     const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    struct manifest mf;
    const uint8_t *m = manifest;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = manifest_header(manifest, n_manifest, &mf)) != 0)
        return rc;
    const struct manifest_header h = mf.h;
    const uint8_t *toks = m + mf.hsize;
    const uint8_t *ids = toks + (size_t)h.n_tokens * 4;
    const uint8_t *sids = ids + (size_t)h.n_blocks * THAW_KEY_BYTES;
    const uint8_t *snaps = sids + (size_t)mf.n_sids * THAW_KEY_BYTES;
    const uint8_t *tail = snaps + (size_t)h.n_snaps * THAW_KEY_BYTES;
    const uint8_t *swa = tail + h.tail_size;
    struct thaw_block_swa_rows rows = {NULL, 0, 0, NULL, 0};
    if (h.version == MANIFEST_VERSION_SWA) {
        /* the window's SWA blocks, then the tail's SWA rows, into place */
        uint32_t k0 = swa_first_needed(h.n_tokens, mf.w.n_window, h.block_tokens);
        if (k0 > h.n_blocks)
            k0 = h.n_blocks;
        rows.sids = (const uint8_t(*)[THAW_KEY_BYTES])(sids + (size_t)(k0 - mf.w.swa_first) * THAW_KEY_BYTES);
        rows.n_sids = h.n_blocks - k0;
        rows.pos0 = k0 * h.block_tokens;
        rows.tail = mf.w.swa_tail_size ? swa : NULL;
        rows.n_tail = mf.w.swa_tail_size;
    }
    llama_token *tokens = malloc((size_t)h.n_tokens * sizeof(llama_token)); /* aligned */
    if (!tokens)
        return THAW_ENOMEM;
    memcpy(tokens, toks, (size_t)h.n_tokens * sizeof(llama_token));
    if (h.n_snaps) {
        /* a hybrid: the tail and the recurrent state are the last snapshot's */
        struct thaw_snapshot_view sv;
        void *snap = NULL;
        size_t n_snap = 0;
        rc = thaw_tiers_fetch(c, ram, snaps + (size_t)(h.n_snaps - 1) * THAW_KEY_BYTES, &snap, &n_snap);
        if (rc == 0 && (thaw_snapshots_parse(snap, n_snap, &sv) != 0 || sv.n_tokens != h.n_tokens ||
                        sv.block_tokens != h.block_tokens))
            rc = THAW_ECORRUPT;
        if (rc == 0)
            rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, h.n_blocks, h.block_tokens, sv.tail,
                             sv.tail_size, sv.rec, sv.rec_size, NULL, f, tokens, (int)h.n_tokens, out);
        else if (rc == THAW_ECORRUPT)
            rc = THAW_ENOTFOUND; /* removed: this manifest is no use */
        thaw_blob_unref(snap);
    } else {
        bool v2 = h.version == MANIFEST_VERSION_SWA;
        rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, h.n_blocks, h.block_tokens, tail, h.tail_size,
                         v2 ? NULL : swa, v2 ? 0 : h.swa_size, v2 ? &rows : NULL, f, tokens, (int)h.n_tokens, out);
    }
    free(tokens);
    if (rc != 0)
        thaw_blocks_state_free(out);
    return rc;
}

int thaw_blocks_load_at(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                        uint32_t block_tokens, const llama_token *toks, int p, const void *tail, size_t n_tail,
                        const void *rest, size_t n_rest, const struct thaw_kvlayout_frame *f,
                        struct thaw_blocks_state *out)
{
    uint8_t(*ids)[THAW_KEY_BYTES];
    uint32_t n_blocks;
    int rc;

    memset(out, 0, sizeof *out);
    if (block_tokens == 0 || p <= 0 || (tail == NULL) != ((uint32_t)p % block_tokens == 0))
        return THAW_EINVAL;
    n_blocks = (uint32_t)p / block_tokens;
    if (!(ids = malloc(((size_t)n_blocks + 1) * sizeof *ids)))
        return THAW_ENOMEM;
    thaw_blocks_ids(binding, block_tokens, toks, p, ids);
    rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, n_blocks, block_tokens, tail, n_tail, rest, n_rest,
                     NULL, f, toks, p, out);
    if (rc != 0)
        thaw_blocks_state_free(out);
    free(ids);
    return rc;
}

int thaw_blocks_prefix(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                       uint32_t block_tokens, const llama_token *toks, int n, const struct thaw_kvlayout_frame *f,
                       struct thaw_blocks_state *out)
{
    return thaw_blocks_prefix_swa(c, ram, binding, block_tokens, 0, toks, n, f, out);
}

/* The deepest boundary at most `run` blocks in whose SWA blocks a restore
 * needs are stored (sids filled for them); 0: none. */
static uint32_t swa_run(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t (*ids)[THAW_KEY_BYTES],
                        uint8_t (*sids)[THAW_KEY_BYTES], uint32_t run, uint32_t n_window, uint32_t block_tokens,
                        uint32_t *first)
{
    for (uint32_t b = run; b > 0; b--) {
        uint32_t k0 = swa_first_needed(b * block_tokens, n_window, block_tokens), k = b;
        while (k > k0) {
            thaw_blocks_swa_id(ids[k - 1], sids[k - 1]);
            if (!thaw_tiers_has(c, ram, sids[k - 1]))
                break;
            k--;
        }
        if (k == k0) {
            *first = k0;
            return b;
        }
    }
    return 0;
}

int thaw_blocks_prefix_swa(struct thaw_disk_cache *c, struct thaw_ram_cache *ram,
                           const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, uint32_t n_window,
                           const llama_token *toks, int n, const struct thaw_kvlayout_frame *f,
                           struct thaw_blocks_state *out)
{
    uint8_t(*ids)[THAW_KEY_BYTES];
    int rc;

    memset(out, 0, sizeof *out);
    if (block_tokens == 0 || n <= 1)
        return THAW_ENOTFOUND;
    uint32_t n_blocks = (uint32_t)(n - 1) / block_tokens; /* one token left to decode */
    if (n_blocks == 0)
        return THAW_ENOTFOUND;
    if (!(ids = malloc(2 * (size_t)n_blocks * sizeof *ids)))
        return THAW_ENOMEM;
    uint8_t(*sids)[THAW_KEY_BYTES] = ids + n_blocks;
    thaw_blocks_ids(binding, block_tokens, toks, (int)(n_blocks * block_tokens), ids);
    /* a block found bad on the way is removed by the disk tier: the run
     * ends before it, so try again with what is left (a few times) */
    rc = THAW_ENOTFOUND;
    for (int attempt = 0; attempt < 3 && rc == THAW_ENOTFOUND; attempt++) {
        uint32_t run = 0;
        while (run < n_blocks && thaw_tiers_has(c, ram, ids[run]))
            run++;
        struct thaw_block_swa_rows rows = {NULL, 0, 0, NULL, 0};
        if (run > 0 && n_window > 0) {
            /* a boundary is a hit only with its window's SWA rows */
            uint32_t k0 = 0;
            run = swa_run(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, sids, run, n_window, block_tokens, &k0);
            rows = (struct thaw_block_swa_rows){(const uint8_t(*)[THAW_KEY_BYTES])sids[k0], run - k0, k0 * block_tokens, NULL, 0};
        }
        if (run == 0)
            break;
        rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, run, block_tokens, NULL, 0, NULL, 0,
                         n_window > 0 ? &rows : NULL, f, toks, (int)(run * block_tokens), out);
        if (rc != 0)
            thaw_blocks_state_free(out);
    }
    free(ids);
    return rc;
}
