/* snapshots.c — a hybrid's recurrent state at chosen positions (snapshots.h).
 *
 * Map:
 *   ---- ids and format ----  the id, the entry's bytes
 *   ---- store ----           the capture's end and the slot's checkpoints
 *                             as snapshots, then blocks and the manifest;
 *                             a turn end kept back, written later (flush)
 *   ---- restore ----         a hybrid's manifest, its snapshots as checkpoints,
 *                             the deepest snapshot of a prompt
 */
#include "cache/snapshots.h"

#include "base/blob.h"
#include "base/error.h"
#include "cache/block_reader.h"
#include "cache/manifest.h"
#include "cache/tiers.h"
#include "llama/kvstate.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define SNAP_MAGIC 0x314e5354u /* "TSN1" */
#define SNAP_VERSION 1u
#define LLAMA_SEQ_MAGIC 0xaf143cd8u /* llama_state_seq_get_data's first word */

struct snap_header {
    uint32_t magic, version, n_tokens, block_tokens;
    uint64_t tail_size, rec_size;
};

static const char SNAP_TAG[] = "thaw-snap-v1";

/* ---- ids and format ---------------------------------------------------------- */

void thaw_snapshots_id(const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, const uint8_t *prev,
                       const thaw_token *toks, uint32_t p, uint8_t out[THAW_KEY_BYTES])
{
    static const uint8_t zero[THAW_KEY_BYTES];
    uint32_t a = block_tokens ? p / block_tokens * block_tokens : 0;
    crypto_generichash_state st;

    crypto_generichash_init(&st, binding, THAW_KEY_BYTES, THAW_KEY_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)SNAP_TAG, sizeof SNAP_TAG);
    crypto_generichash_update(&st, prev && a > 0 ? prev : zero, THAW_KEY_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)&p, sizeof p);
    crypto_generichash_update(&st, (const uint8_t *)(toks + a), (size_t)(p - a) * sizeof(int32_t));
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

int thaw_snapshots_is(const void *blob, size_t n)
{
    uint32_t magic;

    if (!blob || n < sizeof(struct snap_header))
        return 0;
    memcpy(&magic, blob, sizeof magic);
    return magic == SNAP_MAGIC;
}

int thaw_snapshots_parse(const void *blob, size_t n, struct thaw_snapshot_view *v)
{
    struct snap_header h;
    const uint8_t *b = blob;

    if (!thaw_snapshots_is(blob, n))
        return THAW_ECORRUPT;
    memcpy(&h, b, sizeof h);
    if (h.version != SNAP_VERSION)
        return THAW_EVERSION;
    if (h.n_tokens == 0 || h.block_tokens == 0 || h.rec_size == 0 || h.tail_size > n || h.rec_size > n ||
        sizeof h + h.tail_size + h.rec_size != n || (h.tail_size == 0) != (h.n_tokens % h.block_tokens == 0))
        return THAW_ECORRUPT;
    v->n_tokens = h.n_tokens;
    v->block_tokens = h.block_tokens;
    v->tail = h.tail_size ? b + sizeof h : NULL;
    v->tail_size = (size_t)h.tail_size;
    v->rec = b + sizeof h + h.tail_size;
    v->rec_size = (size_t)h.rec_size;
    return 0;
}

/* ---- store ------------------------------------------------------------------- */

/* A snapshot to store: the recurrent state `rec` at position p. */
struct at {
    uint32_t p;
    const void *rec;
    size_t n_rec;
};

/* The recurrent section of a checkpoint taken at p tokens: its bytes after
 * libllama's magic and sequence id, when they hold one cell at p - 1 (the
 * head is kvlayout's recurrent tail). NULL otherwise (an SWA checkpoint, a
 * layout this build does not know): that checkpoint is no snapshot. */
static const void *ckpt_rec(const struct thaw_ckpt *ck, size_t *n)
{
    const uint8_t *d = ck->data;
    uint32_t magic, count, n_seq;
    int32_t pos;

    if (ck->size < 8 + 20)
        return NULL;
    memcpy(&magic, d, 4);
    memcpy(&count, d + 8, 4);
    memcpy(&pos, d + 12, 4);
    memcpy(&n_seq, d + 16, 4);
    if (magic != LLAMA_SEQ_MAGIC || count != 1 || pos != ck->n_tokens - 1 || n_seq != 0)
        return NULL;
    *n = ck->size - 8;
    return d + 8;
}

static size_t layout_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvlayout_block_size(ud, a, b);
}

static int layout_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    return thaw_kvlayout_cut(ud, a, b, dst, cap);
}

/* The snapshot entry of `at` (its tail cut from l), a new blob. */
static int build(const struct thaw_kvlayout *l, uint32_t block_tokens, const struct at *at, void **out, size_t *n_out)
{
    uint32_t a = at->p / block_tokens * block_tokens;
    size_t tail = a < at->p ? thaw_kvlayout_block_size(l, a, at->p) : 0;
    size_t total = sizeof(struct snap_header) + tail + at->n_rec;
    uint8_t *b;
    int rc;

    if (a < at->p && tail == 0)
        return THAW_EINVAL;
    if (!(b = thaw_blob_alloc(total)))
        return THAW_ENOMEM;
    struct snap_header h = {SNAP_MAGIC, SNAP_VERSION, at->p, block_tokens, tail, at->n_rec};
    memcpy(b, &h, sizeof h);
    if (tail && (rc = thaw_kvlayout_cut(l, a, at->p, b + sizeof h, tail)) != 0) {
        thaw_blob_unref(b);
        return rc;
    }
    memcpy(b + sizeof h + tail, at->rec, at->n_rec);
    *out = b;
    *n_out = total;
    return 0;
}

static int cmp_at(const void *x, const void *y)
{
    const struct at *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p;
}

int thaw_snapshots_store(const struct thaw_blocks_store_params *p, const void *ckpt, size_t n_ckpt, void **manifest,
                         size_t *n_manifest, struct thaw_snapshot_pending *defer, struct thaw_blocks_stats *st)
{
    struct thaw_disk_cache *c = p->disk;
    struct thaw_ram_cache *ram = p->ram;
    const uint8_t *binding = p->binding;
    const uint32_t block_tokens = p->block_tokens;
    const thaw_token *toks = p->toks;
    const int n = p->n;
    struct thaw_blocks_stats local = {0}, bst = {0};
    struct thaw_kvlayout *l = NULL;
    struct thaw_ckpt_list ckl = {0};
    struct at *at = NULL;
    uint8_t(*bids)[THAW_KEY_BYTES] = NULL, (*sids)[THAW_KEY_BYTES] = NULL;
    uint32_t n_at = 0;
    int held = 0, rc;

    *manifest = NULL;
    *n_manifest = 0;
    if (defer)
        memset(defer, 0, sizeof *defer);
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (n <= 0 || block_tokens == 0)
        return THAW_EINVAL;
    if (p->src)
        return THAW_EINVAL; /* a capture only: the recurrent state is in no source */
    if ((rc = thaw_kvlayout_parse(p->state, p->n_state, &l)) != 0)
        return rc == THAW_ECORRUPT ? THAW_ELAYOUT : rc;
    if (!thaw_kvlayout_recurrent(l) || thaw_kvlayout_n_cells(l) != (uint32_t)n) {
        rc = THAW_ELAYOUT;
        goto out;
    }
    if ((rc = thaw_ckpt_parse(ckpt, n_ckpt, &ckl)) != 0)
        goto out;
    if (!(at = calloc((size_t)ckl.n + 1, sizeof *at)) || !(bids = malloc(((size_t)n / block_tokens + 1) * sizeof *bids)) ||
        !(sids = malloc(((size_t)ckl.n + 1) * sizeof *sids))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    /* the checkpoints inside the conversation, then its end */
    for (int i = 0; i < ckl.n; i++) {
        size_t n_rec = 0;
        /* only those taken at snapshot positions: the one at each prompt's
         * end serves the slot's own rollbacks; stored, it would add a
         * partial block of attention rows every turn */
        const void *rec = ckl.v[i].n_tokens > 0 && ckl.v[i].n_tokens < n && (ckl.v[i].flags & THAW_CKPT_SNAPSHOT)
                              ? ckpt_rec(&ckl.v[i], &n_rec)
                              : NULL;
        if (rec)
            at[n_at++] = (struct at){(uint32_t)ckl.v[i].n_tokens, rec, n_rec};
    }
    qsort(at, n_at, sizeof *at, cmp_at);
    uint32_t u = 0; /* one per position */
    for (uint32_t i = 0; i < n_at; i++)
        if (u == 0 || at[u - 1].p != at[i].p)
            at[u++] = at[i];
    n_at = u;
    thaw_kvlayout_tail(l, &at[n_at].rec, &at[n_at].n_rec);
    at[n_at++].p = (uint32_t)n;
    thaw_blocks_ids(binding, block_tokens, toks, n, bids);
    for (uint32_t i = 0; i < n_at; i++)
        thaw_snapshots_id(binding, block_tokens, at[i].p >= block_tokens ? bids[at[i].p / block_tokens - 1] : NULL,
                          toks, at[i].p, sids[i]);
    /* held before looking, as blocks are: the manifest will name them */
    thaw_disk_cache_hold(c, sids[0], n_at);
    held = 1;
    for (uint32_t i = 0; i < n_at; i++) {
        struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
        if (thaw_disk_cache_has(c, sids[i])) {
            st->skipped++;
            continue;
        }
        if (!(parts[THAW_PART_KV].data = thaw_ram_cache_block(ram, sids[i], &parts[THAW_PART_KV].size))) {
            if ((rc = build(l, block_tokens, &at[i], &parts[THAW_PART_KV].data, &parts[THAW_PART_KV].size)) != 0)
                goto out;
            if (ram)
                (void)thaw_ram_cache_put_block(ram, sids[i], thaw_blob_ref(parts[THAW_PART_KV].data),
                                               parts[THAW_PART_KV].size);
        }
        size_t size = parts[THAW_PART_KV].size;
        if (defer && i == n_at - 1) {
            /* the turn's end: kept for the caller, written when the slot
             * loses the conversation (snapshots.h, "Written when") */
            memcpy(defer->id, sids[i], THAW_KEY_BYTES);
            defer->p = at[i].p;
            defer->blob = parts[THAW_PART_KV].data;
            defer->size = size;
            continue;
        }
        if ((rc = thaw_disk_cache_submit(c, sids[i], at[i].p, parts, NULL, 0)) != 0) {
            thaw_blob_unref(parts[THAW_PART_KV].data);
            st->dropped++;
            goto out;
        }
        st->written++;
        st->bytes_written += size;
    }
    /* the blocks and the manifest naming them and the snapshots */
    struct thaw_blocks_src src = {
        .n_cells = (uint32_t)n,
        .size = layout_size,
        .cut = layout_cut,
        .ud = l,
        .snaps = (const uint8_t(*)[THAW_KEY_BYTES])sids,
        .n_snaps = n_at,
    };
    struct thaw_blocks_store_params bp = *p;
    bp.src = &src;
    rc = thaw_blocks_store(&bp, manifest, n_manifest, &bst);
    st->written += bst.written;
    st->skipped += bst.skipped;
    st->dropped += bst.dropped;
    st->bytes_written += bst.bytes_written;
out:
    if (rc != 0 && held)
        thaw_disk_cache_unhold(c, sids[0], n_at);
    if (rc != 0 && defer)
        thaw_snapshots_pending_drop(defer);
    thaw_ckpt_clear(&ckl);
    free(sids);
    free(bids);
    free(at);
    thaw_kvlayout_free(l);
    return rc;
}

int thaw_snapshots_flush(struct thaw_disk_cache *c, struct thaw_snapshot_pending *pd, size_t *n_written)
{
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    int rc = 0;

    if (n_written)
        *n_written = 0;
    if (!pd->blob)
        return 0;
    if (!thaw_disk_cache_has(c, pd->id)) {
        parts[THAW_PART_KV] = (struct thaw_part_blob){pd->blob, pd->size};
        if ((rc = thaw_disk_cache_submit(c, pd->id, pd->p, parts, NULL, 0)) == 0) {
            pd->blob = NULL; /* the writer's now */
            if (n_written)
                *n_written = pd->size;
        }
    }
    thaw_snapshots_pending_drop(pd);
    return rc;
}

void thaw_snapshots_pending_drop(struct thaw_snapshot_pending *pd)
{
    thaw_blob_unref(pd->blob);
    memset(pd, 0, sizeof *pd);
}

/* ---- restore ----------------------------------------------------------------- */

int thaw_snapshots_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest, size_t n_manifest,
                        const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    struct thaw_manifest m;
    struct thaw_snapshot_view sv;
    void *snap = NULL;
    size_t n_snap = 0;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = thaw_manifest_parse(manifest, n_manifest, &m)) != 0)
        return rc;
    if (!m.n_snaps)
        return THAW_EINVAL; /* blocks.h's: thaw_blocks_load */
    thaw_token *tokens = malloc((size_t)m.n_tokens * sizeof(thaw_token)); /* aligned */
    if (!tokens)
        return THAW_ENOMEM;
    memcpy(tokens, m.tokens, (size_t)m.n_tokens * sizeof(thaw_token));
    /* the blocks, then the tail and the recurrent state: the last snapshot's */
    rc = thaw_tiers_fetch(c, ram, m.snaps + (size_t)(m.n_snaps - 1) * THAW_KEY_BYTES, &snap, &n_snap);
    if (rc == 0 && (thaw_snapshots_parse(snap, n_snap, &sv) != 0 || sv.n_tokens != m.n_tokens ||
                    sv.block_tokens != m.block_tokens))
        rc = THAW_ECORRUPT;
    if (rc == 0)
        rc = thaw_block_reader_load(c, ram, (const uint8_t(*)[THAW_KEY_BYTES])m.ids, m.n_blocks, m.block_tokens,
                                    sv.tail, sv.tail_size, sv.rec, sv.rec_size, NULL, f, tokens, (int)m.n_tokens, out);
    else if (rc == THAW_ECORRUPT)
        rc = THAW_ENOTFOUND; /* removed: this manifest is no use */
    thaw_blob_unref(snap);
    free(tokens);
    if (rc != 0)
        thaw_blocks_state_free(out);
    return rc;
}

int thaw_snapshots_ckpts(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest,
                         size_t n_manifest, int32_t seq_id, void **ckpt, size_t *n_ckpt)
{
    struct thaw_ckpt_list l = {0};
    const uint8_t *snaps;
    uint32_t n_snaps;
    int rc = 0;

    *ckpt = NULL;
    *n_ckpt = 0;
    if (thaw_manifest_snaps(manifest, n_manifest, &snaps, &n_snaps) != 0 || n_snaps == 0)
        return THAW_ENOTFOUND;
    if (!(l.v = calloc(n_snaps, sizeof *l.v)))
        return THAW_ENOMEM;
    l.cap = (int)n_snaps;
    for (uint32_t i = 0; i < n_snaps && rc == 0; i++) {
        struct thaw_snapshot_view v;
        void *snap = NULL;
        size_t n_snap = 0;
        if ((rc = thaw_tiers_fetch(c, ram, snaps + (size_t)i * THAW_KEY_BYTES, &snap, &n_snap)) != 0)
            break;
        if (thaw_snapshots_parse(snap, n_snap, &v) != 0) {
            rc = THAW_ECORRUPT;
        } else {
            /* a checkpoint is llama_state_seq_get_data_ext(PARTIAL_ONLY): the
             * magic, the sequence id, then the recurrent section */
            struct thaw_ckpt *ck = &l.v[l.n];
            uint32_t magic = LLAMA_SEQ_MAGIC;
            if (!(ck->data = malloc(8 + v.rec_size))) {
                rc = THAW_ENOMEM;
            } else {
                memcpy(ck->data, &magic, 4);
                memcpy((uint8_t *)ck->data + 4, &seq_id, 4);
                memcpy((uint8_t *)ck->data + 8, v.rec, v.rec_size);
                ck->size = 8 + v.rec_size;
                ck->n_tokens = (int)v.n_tokens;
                ck->pos_min = 0;
                ck->pos_max = (int32_t)v.n_tokens - 1;
                ck->flags = THAW_CKPT_SNAPSHOT; /* stored: later manifests name it too */
                l.n++;
            }
        }
        thaw_blob_unref(snap);
    }
    if (rc == 0)
        rc = thaw_ckpt_serialize(&l, ckpt, n_ckpt);
    thaw_ckpt_clear(&l);
    return rc == 0 ? 0 : rc == THAW_ENOMEM ? rc : THAW_ENOTFOUND;
}

int thaw_snapshots_prefix(const struct thaw_blocks_prefix_params *pp, struct thaw_blocks_state *out)
{
    struct thaw_disk_cache *c = pp->disk;
    struct thaw_ram_cache *ram = pp->ram;
    const uint8_t *binding = pp->binding;
    const uint32_t block_tokens = pp->block_tokens;
    const thaw_token *toks = pp->toks;
    const int n = pp->n;
    uint8_t(*bids)[THAW_KEY_BYTES] = NULL;
    uint8_t sid[THAW_KEY_BYTES];
    int rc = THAW_ENOTFOUND;

    memset(out, 0, sizeof *out);
    if (block_tokens == 0 || n <= 1)
        return THAW_ENOTFOUND;
    uint32_t last = (uint32_t)n - 1; /* one token left to decode */
    if (!(bids = malloc(((size_t)last / block_tokens + 1) * sizeof *bids)))
        return THAW_ENOMEM;
    thaw_blocks_ids(binding, block_tokens, toks, (int)last, bids);
    /* deepest first: one hash of at most B tokens and one index probe per
     * position; a snapshot found bad (removed on the way) or whose blocks
     * are gone lets the next shallower one try */
    int tries = 0;
    for (uint32_t p = last; p >= 1 && tries < 4; p--) {
        thaw_snapshots_id(binding, block_tokens, p >= block_tokens ? bids[p / block_tokens - 1] : NULL, toks, p, sid);
        if (!thaw_tiers_has(c, ram, sid))
            continue;
        tries++;
        struct thaw_snapshot_view v;
        void *snap = NULL;
        size_t n_snap = 0;
        if ((rc = thaw_tiers_fetch(c, ram, sid, &snap, &n_snap)) != 0) {
            rc = rc == THAW_ENOMEM ? rc : THAW_ENOTFOUND;
            if (rc == THAW_ENOMEM)
                break;
            continue;
        }
        if (thaw_snapshots_parse(snap, n_snap, &v) != 0 || v.n_tokens != p || v.block_tokens != block_tokens) {
            thaw_blob_unref(snap);
            thaw_disk_cache_remove(c, sid); /* does not fit its name: never again */
            rc = THAW_ENOTFOUND;
            continue;
        }
        rc = thaw_blocks_load_at(c, ram, binding, block_tokens, toks, (int)p, v.tail, v.tail_size, v.rec, v.rec_size,
                                 pp->frame, out);
        thaw_blob_unref(snap);
        if (rc == 0 || (rc != THAW_ENOTFOUND && rc != THAW_ECORRUPT))
            break;
        rc = THAW_ENOTFOUND;
    }
    free(bids);
    return rc;
}
