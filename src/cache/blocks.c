/* blocks.c — content-addressed blocks (blocks.h): the ids, cutting and
 * storing them with the manifest that names them (its bytes are
 * manifest.c's), and which blocks a load needs; reading them into place is
 * block_reader.c's. */
#include "cache/blocks.h"

#include "base/blob.h"
#include "base/error.h"
#include "cache/cache_ram.h"
#include "cache/manifest.h"
#include "cache/tiers.h"
#include "llama/kvstate.h"

#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char ID_TAG[] = "thaw-block-v1";
static const char SWA_TAG[] = "thaw-swa-v1";

void thaw_blocks_swa_id(const uint8_t id[THAW_KEY_BYTES], uint8_t sid[THAW_KEY_BYTES])
{
    crypto_generichash(sid, THAW_KEY_BYTES, (const uint8_t *)SWA_TAG, sizeof SWA_TAG, id, THAW_KEY_BYTES);
}

void thaw_blocks_ids(const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, const thaw_token *toks, int n,
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

/* Submits block id (cells [ka, kb) cut by `cut`, unless the RAM tier holds
 * it) to the disk writer. 0, or an error (THAW_EBUSY: the writer dropped it). */
static int put_block(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                     uint32_t block_tokens, size_t (*size_fn)(const void *, uint32_t, uint32_t),
                     int (*cut)(const void *, uint32_t, uint32_t, void *, size_t), const void *ud, uint32_t ka,
                     uint32_t kb, bool ahead, struct thaw_blocks_stats *st)
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
    rc = ahead ? thaw_disk_cache_submit_unsynced(c, id, block_tokens, parts)
               : thaw_disk_cache_submit(c, id, block_tokens, parts, NULL, 0);
    if (rc != 0) {
        thaw_blob_unref(parts[THAW_PART_KV].data);
        st->dropped++;
        return rc;
    }
    st->written++;
    st->bytes_written += size;
    return 0;
}

/* The store from a source; its params checked, *manifest and *st cleared */
static int store_src(const struct thaw_blocks_store_params *p, const struct thaw_blocks_src *src, void **manifest,
                     size_t *n_manifest, struct thaw_blocks_stats *st)
{
    struct thaw_disk_cache *c = p->disk;
    struct thaw_ram_cache *ram = p->ram;
    const uint32_t block_tokens = p->block_tokens;
    const int n = p->n;
    uint8_t(*ids)[THAW_KEY_BYTES] = NULL; /* the block ids, then the SWA block ids */
    uint8_t(*sids)[THAW_KEY_BYTES] = NULL;
    uint8_t *todo = NULL; /* per block: 0 held, 1 in the RAM tier, 2 to cut */
    uint32_t n_blocks = 0, swa_first = 0;
    bool held = false, swa_held = false, swa = false;
    int rc;

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
    thaw_blocks_ids(p->binding, block_tokens, p->toks, n, ids);
    /* Before looking: a block found present must not be collected before
     * the manifest that names it is queued (blocks.h: the caller unholds) */
    thaw_disk_cache_hold(c, ids[0], n_blocks);
    held = true;
    /* what to write, and whether the source can give it all, before any
     * of it is submitted */
    uint32_t a = n_blocks * block_tokens;
    if (src->known && a < (uint32_t)n && !p->ahead && !src->known(src->ud, a, (uint32_t)n)) {
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
        uint32_t need = thaw_manifest_swa_first((uint32_t)n, src->n_window, block_tokens);
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
    if (!swa && src->n_window > 0 && src->swa_cut && !src->swa && !p->ahead) {
        rc = THAW_ENOTFOUND; /* neither SWA rows nor a window: capture the state instead */
        goto out;
    }
    for (uint32_t k = 0; k < n_blocks; k++) {
        if (!todo[k]) {
            st->skipped++;
            continue;
        }
        uint32_t ka = k * block_tokens;
        if ((rc = put_block(c, ram, ids[k], block_tokens, src->size, src->cut, src->ud, ka, ka + block_tokens, p->ahead,
                            st)) != 0)
            goto out;
    }
    for (uint32_t k = swa_first; swa && k < n_blocks; k++) {
        if (thaw_disk_cache_has(c, sids[k])) {
            st->skipped++;
            continue;
        }
        uint32_t ka = k * block_tokens;
        if ((rc = put_block(c, ram, sids[k], block_tokens, src->swa_size, src->swa_cut, src->ud, ka,
                            ka + block_tokens, p->ahead, st)) != 0)
            goto out;
    }
    if (p->ahead) { /* no manifest: the turn's store names them (blocks.h) */
        thaw_disk_cache_unhold(c, ids[0], n_blocks);
        if (swa_held)
            thaw_disk_cache_unhold(c, sids[swa_first], n_blocks - swa_first);
        held = swa_held = false;
        rc = 0;
        goto out;
    }
    /* the manifest: tokens, ids, the cells past the last whole block, the
     * SWA window; or, with SWA rows, the SWA ids and the tail's SWA rows
     * instead of the window; or, for a hybrid, its snapshots instead of
     * the tail and the window (the last snapshot holds both). The cut
     * sections go straight into the manifest's blob. */
    uint32_t n_snaps = src->n_snaps;
    struct thaw_manifest mf = {
        .version = swa ? THAW_MANIFEST_V2_SWA : THAW_MANIFEST_V1,
        .n_tokens = (uint32_t)n,
        .block_tokens = block_tokens,
        .n_blocks = n_blocks,
        .tokens = p->toks,
        .ids = ids[0],
        .swa_first = swa ? swa_first : 0,
        .n_window = swa ? src->n_window : 0,
        .sids = swa ? sids[swa_first] : NULL,
        .n_snaps = n_snaps,
        .snaps = n_snaps ? src->snaps[0] : NULL,
        .tail_size = a < (uint32_t)n && !n_snaps ? src->size(src->ud, a, (uint32_t)n) : 0,
        .swa_tail_size = swa && a < (uint32_t)n ? src->swa_size(src->ud, a, (uint32_t)n) : 0,
        .swa = swa || n_snaps ? NULL : src->swa,
        .swa_size = swa || n_snaps ? 0 : src->n_swa,
    };
    struct thaw_manifest_sections at;
    void *m = NULL;
    size_t total = 0;
    if ((rc = thaw_manifest_encode(&mf, &m, &total, &at)) != 0)
        goto out;
    if (at.tail && (rc = src->cut(src->ud, a, (uint32_t)n, at.tail, mf.tail_size)) != 0) {
        thaw_blob_unref(m);
        goto out;
    }
    if (at.swa_tail && (rc = src->swa_cut(src->ud, a, (uint32_t)n, at.swa_tail, mf.swa_tail_size)) != 0) {
        thaw_blob_unref(m);
        goto out;
    }
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

/* A capture as the source: its cells, and its SWA section's rows */
static int store_capture(const struct thaw_blocks_store_params *p, void **manifest, size_t *n_manifest,
                         struct thaw_blocks_stats *st)
{
    struct thaw_kvlayout *l = NULL;
    int rc;

    if ((rc = thaw_kvlayout_parse(p->state, p->n_state, &l)) != 0)
        return rc == THAW_ECORRUPT ? THAW_ELAYOUT : rc; /* fresh from libllama: not damage */
    struct thaw_blocks_src src = {
        .n_cells = thaw_kvlayout_n_cells(l),
        .size = layout_size,
        .cut = layout_cut,
        .ud = l,
    };
    thaw_kvlayout_tail(l, &src.swa, &src.n_swa);
    struct capture_swa cs = {l, NULL, 0};
    if (p->window > 0 && thaw_kvlayout_swa_n_cells(l) > 0 && thaw_kvlayout_swa_mem(l, &cs.mem) == 0) {
        /* the window's SWA rows, while the capture holds them */
        src.swa_size = capture_swa_size;
        src.swa_cut = capture_swa_cut;
        src.swa_known = capture_swa_known;
        src.n_window = p->window;
        src.ud = &cs;
        src.size = capture_size;
        src.cut = capture_cut;
    }
    rc = store_src(p, &src, manifest, n_manifest, st);
    thaw_kvlayout_mem_free(cs.mem);
    thaw_kvlayout_free(l);
    return rc;
}

int thaw_blocks_store(const struct thaw_blocks_store_params *p, void **manifest, size_t *n_manifest,
                      struct thaw_blocks_stats *st)
{
    struct thaw_blocks_stats local = {0};

    *manifest = NULL;
    *n_manifest = 0;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (p->n <= 0 || p->block_tokens == 0 || (p->ahead && !p->src))
        return THAW_EINVAL;
    return p->src ? store_src(p, p->src, manifest, n_manifest, st) : store_capture(p, manifest, n_manifest, st);
}

int thaw_blocks_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest, size_t n_manifest,
                     const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    struct thaw_manifest m;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = thaw_manifest_parse(manifest, n_manifest, &m)) != 0)
        return rc;
    if (m.n_snaps)
        return THAW_EINVAL; /* a hybrid's: its tail and recurrent state are a snapshot's (snapshots.h) */
    const bool v2 = m.version == THAW_MANIFEST_V2_SWA;
    struct thaw_block_swa_rows rows = {0};
    if (v2) {
        /* the window's SWA blocks, then the tail's SWA rows, into place */
        uint32_t k0 = thaw_manifest_swa_first(m.n_tokens, m.n_window, m.block_tokens);
        if (k0 > m.n_blocks)
            k0 = m.n_blocks;
        rows = (struct thaw_block_swa_rows){
            .sids = (const uint8_t(*)[THAW_KEY_BYTES])(m.sids + (size_t)(k0 - m.swa_first) * THAW_KEY_BYTES),
            .n_sids = m.n_blocks - k0,
            .pos0 = k0 * m.block_tokens,
            .tail = m.swa_tail,
            .n_tail = m.swa_tail_size,
        };
    }
    thaw_token *tokens = malloc((size_t)m.n_tokens * sizeof(thaw_token)); /* aligned */
    if (!tokens)
        return THAW_ENOMEM;
    memcpy(tokens, m.tokens, (size_t)m.n_tokens * sizeof(thaw_token));
    rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])m.ids, m.n_blocks, m.block_tokens, m.tail,
                                m.tail_size, m.swa, m.swa_size, v2 ? &rows : NULL, f, tokens, (int)m.n_tokens, out);
    free(tokens);
    if (rc != 0)
        thaw_blocks_state_free(out);
    return rc;
}

int thaw_blocks_load_at(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                        uint32_t block_tokens, const thaw_token *toks, int p, const void *tail, size_t n_tail,
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

/* The deepest boundary at most `run` blocks in whose SWA blocks a restore
 * needs are stored (sids filled for them); 0: none. */
static uint32_t swa_run(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t (*ids)[THAW_KEY_BYTES],
                        uint8_t (*sids)[THAW_KEY_BYTES], uint32_t run, uint32_t n_window, uint32_t block_tokens,
                        uint32_t *first)
{
    for (uint32_t b = run; b > 0; b--) {
        uint32_t k0 = thaw_manifest_swa_first(b * block_tokens, n_window, block_tokens), k = b;
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

int thaw_blocks_prefix(const struct thaw_blocks_prefix_params *p, struct thaw_blocks_state *out)
{
    struct thaw_disk_cache *c = p->disk;
    struct thaw_ram_cache *ram = p->ram;
    const uint32_t block_tokens = p->block_tokens, n_window = p->n_window;
    const thaw_token *toks = p->toks;
    const int n = p->n;
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
    thaw_blocks_ids(p->binding, block_tokens, toks, (int)(n_blocks * block_tokens), ids);
    /* a block found bad on the way is removed by the disk tier: the run
     * ends before it, so try again with what is left (a few times) */
    rc = THAW_ENOTFOUND;
    for (int attempt = 0; attempt < 3 && rc == THAW_ENOTFOUND; attempt++) {
        uint32_t run = 0;
        while (run < n_blocks && thaw_tiers_has(c, ram, ids[run]))
            run++;
        struct thaw_block_swa_rows rows = {0};
        if (run > 0 && n_window > 0) {
            /* a boundary is a hit only with its window's SWA rows */
            uint32_t k0 = 0;
            run = swa_run(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, sids, run, n_window, block_tokens, &k0);
            rows = (struct thaw_block_swa_rows){
                .sids = (const uint8_t(*)[THAW_KEY_BYTES])sids[k0],
                .n_sids = run - k0,
                .pos0 = k0 * block_tokens,
            };
        }
        if (run == 0)
            break;
        rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])ids, run, block_tokens, NULL, 0, NULL, 0,
                         n_window > 0 ? &rows : NULL, p->frame, toks, (int)(run * block_tokens), out);
        if (rc != 0)
            thaw_blocks_state_free(out);
    }
    free(ids);
    return rc;
}
