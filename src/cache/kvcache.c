/* kvcache.c — tier policy over cache_ram.c and cache_disk.c (kvcache.h).
 *
 * Map:
 *   ---- open / close ----  the tiers, the start-up line
 *   ---- turn-end snapshots kept in the slots ----  a hybrid's, written when
 *                           the slot loses the conversation (cut, dropped,
 *                           idle, looked up from another slot); close writes
 *                           the rest, then closes the tiers
 *   ---- lookup ----        RAM, the disk writer's queue, then disk with the .kv
 *                           verified alongside; a manifest's blocks (and a
 *                           hybrid's last snapshot) assembled for the slot;
 *                           the prefix lookup; a hit handed to the caller,
 *                           who installs it and ends it (checksums waited
 *                           for, a bad entry removed, the restore counted)
 *   ---- store ----         fan-out, what RAM keeps; a capture cut into blocks,
 *                           or the blocks of the engine's source (thaw_kvcache_store)
 *   ---- metrics ----       prefetch, the shared tier's fetches, the tiers' gauges
 */
#include "cache/kvcache.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/testhooks.h"
#include "base/workers.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "cache/cache_ram.h"
#include "cache/entry_kind.h"
#include "cache/keys.h"
#include "cache/manifest.h"
#include "cache/snapshots.h"
#include "llama/kvstate.h"

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct thaw_kvcache {
    struct thaw_disk_cache *disk; /* NULL = disk tier off */
    bool disk_handle;             /* disk is a handle onto the process's store (kvcache.h: disk_store) */
    struct thaw_ram_cache *ram;   /* NULL = RAM tier off */
    struct thaw_shared *shared;   /* NULL = shared tier off (cache_shared.h) */
    struct thaw_workers *workers; /* the background pool of all tiers (workers.h); NULL: none started */
    struct thaw_metrics *metrics;
    uint8_t identity[THAW_KEY_BYTES];
    uint32_t block_tokens; /* 0: whole states (also after a layout blocks.c refused) */
    bool prefix_lookup;
    bool snapshots;    /* a hybrid: recurrent state as snapshots (snapshots.h) */
    uint32_t n_window; /* SWA models: the window (blocks.h) */
    uint32_t n_stream;
    /* a hybrid's turn-end snapshot per slot (by slot id, n_stream of them;
     * NULL without snapshots), written when the slot loses the
     * conversation (snapshots.h, "Written when"); engine thread only */
    struct thaw_snapshot_pending *pending;
    int64_t snapshot_idle_us; /* --kv-snapshot-idle; 0 = never for idleness */
    /* the block store's counters (/metrics) */
    atomic_uint_fast64_t blocks_written, blocks_skipped, blocks_dropped, store_bytes, prefix_hits, prefix_tokens;
    atomic_uint_fast64_t blocks_ahead; /* of blocks_written: submitted ahead of their turn's store */
    /* turn-end snapshots: kept in the slot, written later (handover, idle,
     * shutdown), superseded by the next turn in the same slot (never
     * written), dropped (the writer refused them) */
    atomic_uint_fast64_t turn_snaps_kept, turn_snaps_written, turn_snaps_superseded, turn_snaps_dropped;
    atomic_uint_fast64_t retains; /* retention hints applied (thaw_kvcache_retain) */
    /* the restore buffer warmed after the first store (warm_after_store) */
    struct thaw_job warm_job;
    size_t warm_bytes; /* 0: none warmed yet (at open, or queued) */
    bool warm_queued;
};

static void block_binding(const struct thaw_kvcache *c, const uint8_t ns[THAW_KEY_BYTES], uint8_t out[THAW_KEY_BYTES])
{
    thaw_keys_block_binding(c->identity, ns, out);
}

static int64_t wall_s(void)
{
    return (int64_t)time(NULL);
}

/* The RAM tier is engine-thread only; /metrics reads these copies. */
static void ram_gauges(struct thaw_kvcache *c)
{
    if (!c->ram)
        return;
    atomic_store(&c->metrics->ram_bytes, thaw_ram_cache_bytes(c->ram));
    atomic_store(&c->metrics->ram_entries, thaw_ram_cache_count(c->ram));
}

/* ---- open / close
 * ---------------------------------------------------------------- */

static void disk_log(void *ud, int level, const char *msg)
{
    (void)ud;
    thaw_log((enum thaw_log_level)level, "kv-cache: %s", msg);
}

/* THAW_HOOK_DISK_FSYNC_DELAY_MS (testhooks.h): every fsync and syncfs of the disk
 * tier first sleeps that long, a slow disk on demand. Unset, the default
 * table is used as is. */
static struct thaw_vfs slow_vfs;
static long slow_fsync_ms;

static int slow_fsync(const struct thaw_vfs *v, int fd)
{
    struct timespec ts = {slow_fsync_ms / 1000, (slow_fsync_ms % 1000) * 1000000L};

    (void)v;
    nanosleep(&ts, NULL);
    return thaw_vfs_default()->fsync(thaw_vfs_default(), fd);
}

static int slow_syncfs(const struct thaw_vfs *v, int fd)
{
    struct timespec ts = {slow_fsync_ms / 1000, (slow_fsync_ms % 1000) * 1000000L};

    (void)v;
    nanosleep(&ts, NULL);
    return thaw_vfs_default()->syncfs(thaw_vfs_default(), fd);
}

static const struct thaw_vfs *disk_vfs(void)
{
    if (!(slow_fsync_ms = thaw_test_hook(THAW_HOOK_DISK_FSYNC_DELAY_MS)))
        return NULL;
    slow_vfs = *thaw_vfs_default();
    slow_vfs.fsync = slow_fsync;
    slow_vfs.syncfs = slow_syncfs;
    return &slow_vfs;
}

/* The pool the tiers hand their background work to: a disk restore's
 * .kv verify and its blocks' checksums (one each, both at once), and the
 * shared tier's parallel GETs (THAW_SHARED_WORKERS). Without it that work
 * runs on the thread that waits for it: slower, never wrong, so a pool
 * that does not start is a warning. */
static void open_workers(struct thaw_kvcache *c, const struct thaw_kvcache_params *kp)
{
    struct thaw_workers_params wp = thaw_workers_default_params();
    int rc;

    wp.n_threads = 2;
#ifdef THAW_HAVE_SHARED
    if (kp->shared)
        wp.n_threads += THAW_SHARED_WORKERS;
#else
    (void)kp;
#endif
    if ((rc = thaw_workers_new(&wp, &c->workers)) != 0)
        LOG_WRN("kv-cache: no background threads (%s): checksums and fetches run on the threads that wait for them",
                thaw_strerror(rc));
}

/* Opens kp->disk_dir under fingerprint fp (the model's identity; none
 * for the store many models share, which is only used through handles)
 * with the pool `workers`, and logs what it holds. */
static int open_dir(const struct thaw_kvcache_params *kp, const uint8_t *fp, struct thaw_workers *workers,
                    bool many, struct thaw_disk_cache **out)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_disk_cache_stats st;
    int rc;

    p.dir = kp->disk_dir;
    p.max_bytes = kp->disk_max_bytes;
    p.ttl_s = kp->ttl_s;
    p.queue_max_bytes = kp->disk_queue_bytes;
    memcpy(p.fingerprint, fp, sizeof p.fingerprint);
    p.log = disk_log;
    p.vfs = disk_vfs();
    p.classify = thaw_entry_classify; /* blocks and what manifests name: for GC (cache_disk.h) */
    p.workers = workers;               /* a restore's block checksums */
    if ((rc = thaw_disk_cache_open(&p, out)) != 0) {
        if (rc == THAW_ELOCKED)
            LOG_ERR("cannot open --kv-cache-dir %s: it is in use by another thaw "
                    "server (%s/lock is held); give "
                    "each server its own directory",
                    p.dir, p.dir);
        else
            LOG_ERR("cannot open --kv-cache-dir %s: %s", p.dir, thaw_strerror(rc));
        return rc;
    }
    thaw_disk_cache_evict(*out);
    thaw_disk_cache_get_stats(*out, &st);
    char budget[32] = "none";
    if (kp->disk_max_bytes)
        snprintf(budget, sizeof budget, "%llu MiB", (unsigned long long)(kp->disk_max_bytes >> 20));
    LOG_INF("kv-cache: %s: %llu entries, %.1f MiB (budget %s, ttl %llus, min %d "
            "tokens)%s",
            p.dir, (unsigned long long)st.entries, (double)st.bytes / 1048576.0, budget, (unsigned long long)kp->ttl_s,
            kp->min_tokens, many ? ", one store for every model" : "");
    return 0;
}

/* The disk tier: a handle onto the process's store when there is one
 * (many models: cache_disk.h, thaw_disk_cache_handle), else the directory
 * opened for this model alone. */
static int open_disk(struct thaw_kvcache *c, const struct thaw_kvcache_params *kp)
{
    int rc;

    if (!kp->disk_store)
        return open_dir(kp, kp->identity, c->workers, false, &c->disk);
    c->disk_handle = true;
    if ((rc = thaw_disk_cache_handle(kp->disk_store, kp->identity, c->workers, &c->disk)) != 0)
        LOG_ERR("kv-cache: no handle onto --kv-cache-dir %s: %s", kp->disk_dir, thaw_strerror(rc));
    return rc;
}

int thaw_kvcache_open_store(const struct thaw_kvcache_params *p, struct thaw_disk_cache **out)
{
    static const uint8_t none[THAW_KEY_BYTES];

    /* the store's own pool would outlive no model: each handle brings its
     * model's (thaw_disk_cache_workers answers per handle) */
    return open_dir(p, none, NULL, true, out);
}

/* The largest conversation stored as blocks, and a block's bytes per
 * token: the size of the state its restore assembles. */
struct largest {
    uint32_t max_tokens;
    double block_bytes_per_token;
};

static int find_largest(void *ud, const struct thaw_disk_entry_info *e)
{
    struct largest *l = ud;
    if (!e->same_model)
        return 0;
    /* the largest rate: an SWA model's blocks come in two shapes (its
     * global and its SWA layers' rows) */
    if (e->is_block && e->n_tokens > 0 && (double)e->part_size[THAW_PART_KV] / e->n_tokens > l->block_bytes_per_token)
        l->block_bytes_per_token = (double)e->part_size[THAW_PART_KV] / e->n_tokens;
    else if (e->n_refs > 0 && e->n_tokens > l->max_tokens)
        l->max_tokens = e->n_tokens;
    return 0;
}

/* A restore from blocks assembles the state in a buffer of its own
 * (blocks.c), which in steady state comes from the blob pool with its
 * pages in. After a start there is none, and first touching the pages of
 * a large state cost more than reading it (a 2-core VM: ~0.7 GiB/s, a cold
 * NVMe read is faster). So the pool starts as it would be in steady state:
 * with a buffer for the largest conversation on disk (at most half the
 * pool). */
static void warm_restore_buffer(struct thaw_kvcache *c)
{
    struct largest l = {0, 0};

    if (!c->disk || !c->block_tokens || thaw_disk_cache_foreach(c->disk, find_largest, &l) != 0 || !l.max_tokens ||
        l.block_bytes_per_token <= 0)
        return;
    /* an SWA model's state has two sections, each at most that rate: the
     * global layers' rows of every token and the SWA layers' of the window */
    double want = l.max_tokens * l.block_bytes_per_token * (c->n_window ? 2 : 1) + ((size_t)1 << 20);
    if (want > (double)((size_t)256 << 20))
        want = (double)((size_t)256 << 20);
    int64_t t0 = thaw_now_us();
    size_t got = thaw_blob_pool_warm((size_t)want);
    c->warm_bytes = got;
    if (got)
        LOG_INF("kv-cache: a %.0f MiB restore buffer is ready (the largest stored conversation: %u tokens) in %.0f "
                "ms",
                (double)got / 1048576.0, l.max_tokens, (double)(thaw_now_us() - t0) / 1000.0);
}

static void warm_fn(void *arg)
{
    struct thaw_kvcache *c = arg;
    int64_t t0 = thaw_now_us();

    if (thaw_blob_pool_warm(c->warm_bytes))
        LOG_DBG("kv-cache: a %.1f MiB restore buffer warmed after the first store in %.1f ms",
                (double)c->warm_bytes / 1048576.0, (double)(thaw_now_us() - t0) / 1000.0);
}

/* A server that started with nothing on disk has no warm restore buffer
 * (warm_restore_buffer), so its first restore from blocks touched fresh
 * pages: 36 ms of an 18 MiB state's 40 ms on a 2-core VM, in that
 * request's time to first token. The first store of blocks says what a
 * conversation's state weighs: a worker readies a buffer of that size
 * (and a quarter more, blob.c) while the conversation's reply is read,
 * as warm_restore_buffer would have at a start after it. Once. */
static void warm_after_store(struct thaw_kvcache *c, const struct thaw_blocks_src *src, int n_tokens)
{
    if (c->warm_bytes || !c->workers || !src->size || n_tokens <= 0) /* warm_bytes: warmed or queued */
        return;
    size_t want = src->size(src->ud, 0, (uint32_t)n_tokens) + src->n_swa + ((size_t)1 << 20);
    if (want > ((size_t)256 << 20))
        want = (size_t)256 << 20;
    c->warm_bytes = want;
    c->warm_queued = true;
    (void)thaw_workers_submit(c->workers, &c->warm_job, warm_fn, c); /* refused: the close's wait runs it */
}

int thaw_kvcache_open(const struct thaw_kvcache_params *p, struct thaw_kvcache **out)
{
    struct thaw_kvcache *c = calloc(1, sizeof *c);
    int rc;

    if (!c)
        return THAW_ENOMEM;
    c->metrics = p->metrics;
    memcpy(c->identity, p->identity, THAW_KEY_BYTES);
    c->block_tokens = p->block_tokens;
    c->prefix_lookup = p->prefix_lookup;
    c->snapshots = p->snapshots;
    c->n_window = p->n_window;
    c->n_stream = p->n_stream ? p->n_stream : 1;
    c->snapshot_idle_us = (int64_t)p->snapshot_idle_s * 1000000;
    if (p->disk_dir || p->disk_store || p->shared)
        open_workers(c, p);
    if (p->ram_bytes > 0 && (rc = thaw_ram_cache_new(p->ram_bytes, p->ttl_s, &c->ram)) != 0)
        goto fail;
    if ((p->disk_dir || p->disk_store) && (rc = open_disk(c, p)) != 0)
        goto fail;
    if (c->disk && c->snapshots && p->block_tokens && !(c->pending = calloc(c->n_stream, sizeof *c->pending))) {
        rc = THAW_ENOMEM;
        goto fail;
    }
    warm_restore_buffer(c);
    if (p->shared) {
#ifdef THAW_HAVE_SHARED
        struct thaw_shared_params sp = *p->shared;
        sp.disk = c->disk;
        sp.workers = c->workers;
        sp.block_tokens = c->block_tokens;
        sp.prefix_fetch = sp.prefix_fetch && c->prefix_lookup;
        memcpy(sp.identity, c->identity, THAW_KEY_BYTES);
        if ((rc = thaw_shared_open(&sp, &c->shared)) != 0)
            goto fail;
#else
        LOG_ERR("--kv-shared: this thaw was built without libcurl, so without the shared tier");
        rc = THAW_EINVAL;
        goto fail;
#endif
    }
    *out = c;
    return 0;
fail:
    free(c->pending);
    thaw_disk_cache_close(c->disk);
    thaw_ram_cache_free(c->ram);
    thaw_workers_free(c->workers);
    free(c);
    return rc;
}

/* ---- turn-end snapshots kept in the slots -------------------------------------- */

/* Writes slot i's pending turn-end snapshot (why: for the log). */
static void flush_pending(struct thaw_kvcache *c, uint32_t i, const char *why)
{
    struct thaw_snapshot_pending *pd = &c->pending[i];
    uint32_t p = pd->p;
    size_t n = 0;

    if (!pd->blob)
        return;
    int rc = thaw_snapshots_flush(c->disk, pd, &n);
    if (rc == 0 && n > 0) {
        atomic_fetch_add(&c->turn_snaps_written, 1);
        atomic_fetch_add(&c->store_bytes, n);
        LOG_DBG("slot %u: turn-end snapshot at %u tokens written (%s): %.1f KiB", i, p, why, (double)n / 1024.0);
    } else if (rc != 0) {
        atomic_fetch_add(&c->turn_snaps_dropped, 1);
        LOG_DBG("slot %u: turn-end snapshot at %u tokens dropped (%s): %s", i, p, why, thaw_strerror(rc));
    }
}

void thaw_kvcache_slot_cut(struct thaw_kvcache *c, int slot_id, int p)
{
    if (!c || !c->pending || slot_id < 0 || (uint32_t)slot_id >= c->n_stream)
        return;
    const struct thaw_snapshot_pending *pd = &c->pending[slot_id];
    if (pd->blob && (p <= 0 || (uint32_t)p < pd->p))
        flush_pending(c, (uint32_t)slot_id, "the slot lost the conversation");
}

void thaw_kvcache_slot_drop(struct thaw_kvcache *c, int slot_id)
{
    if (!c || !c->pending || slot_id < 0 || (uint32_t)slot_id >= c->n_stream || !c->pending[slot_id].blob)
        return;
    LOG_DBG("slot %d: turn-end snapshot at %u tokens not kept: the next turn parts from these tokens before it",
            slot_id, c->pending[slot_id].p);
    thaw_snapshots_pending_drop(&c->pending[slot_id]);
    atomic_fetch_add(&c->turn_snaps_superseded, 1);
}

int64_t thaw_kvcache_flush_idle(struct thaw_kvcache *c)
{
    int64_t next = -1, now = thaw_now_us();

    if (!c || !c->pending || c->snapshot_idle_us <= 0)
        return -1;
    for (uint32_t i = 0; i < c->n_stream; i++) {
        const struct thaw_snapshot_pending *pd = &c->pending[i];
        if (!pd->blob)
            continue;
        int64_t due = pd->since_us + c->snapshot_idle_us - now;
        if (due <= 0)
            flush_pending(c, i, "the slot was idle for --kv-snapshot-idle");
        else if (next < 0 || due < next)
            next = due;
    }
    return next;
}

/* A lookup of a manifest whose last snapshot a slot still keeps (the same
 * conversation on another slot): written first, so the lookup finds it in
 * the writer's queue. */
static void flush_named(struct thaw_kvcache *c, const void *manifest, size_t n_manifest)
{
    const uint8_t *snaps;
    uint32_t n_snaps;

    if (!c->pending || thaw_manifest_snaps(manifest, n_manifest, &snaps, &n_snaps) != 0 || n_snaps == 0)
        return;
    for (uint32_t i = 0; i < c->n_stream; i++)
        if (c->pending[i].blob &&
            memcmp(c->pending[i].id, snaps + (size_t)(n_snaps - 1) * THAW_KEY_BYTES, THAW_KEY_BYTES) == 0)
            flush_pending(c, i, "another slot looks it up");
}

void thaw_kvcache_close(struct thaw_kvcache *c)
{
    if (!c)
        return;
#ifdef THAW_HAVE_SHARED
    if (c->shared) {
        /* the last turns go to the store before this replica does, so the
         * others can continue those conversations (bounded: a store that
         * does not answer does not hold the shutdown for long) */
        thaw_disk_cache_flush(c->disk);
        int left = thaw_shared_flush(c->shared, 10000);
        if (left)
            LOG_WRN("shared tier: %d uploads not done at shutdown: the other replicas will prefill those turns", left);
    }
    thaw_shared_close(c->shared); /* before the disk tier it reads and writes */
#endif
    if (c->pending) {
        /* each slot's last turn end, so that those conversations resume
         * there after the restart; bounded by the slots, one snapshot each */
        uint64_t bytes = 0;
        uint32_t n = 0;
        for (uint32_t i = 0; i < c->n_stream; i++)
            if (c->pending[i].blob) {
                bytes += c->pending[i].size;
                n++;
            }
        if (n) {
            char size[24];
            thaw_fmt_bytes(bytes, size);
            LOG_INF("kv-cache: writing %u turn-end snapshots the slots kept (%s) before exit", n, size);
            thaw_disk_cache_flush(c->disk); /* room in the writer's queue */
            for (uint32_t i = 0; i < c->n_stream; i++)
                flush_pending(c, i, "shutdown");
        }
        free(c->pending);
        c->pending = NULL;
    }
    if (c->disk) {
        struct thaw_disk_cache_stats st;
        char size[24];
        thaw_disk_cache_get_stats(c->disk, &st);
        if (st.queue_len) {
            thaw_fmt_bytes(st.queue_bytes, size);
            LOG_INF("kv-cache: writing the %llu stores still queued (%s) before exit", (unsigned long long)st.queue_len,
                    size);
        }
    }
    if (c->disk_handle)
        thaw_disk_cache_flush(c->disk); /* a handle's close leaves the store's queue to its writer: this
                                         * model's stores are on disk before it is gone (an unload is a
                                         * clean shutdown of its engine, DESIGN §16) */
    thaw_disk_cache_close(c->disk); /* writes what is still queued (its own directory) */
    thaw_ram_cache_free(c->ram);
    if (c->warm_queued)
        thaw_workers_wait(c->workers, &c->warm_job);
    thaw_workers_free(c->workers); /* after every tier that hands it work */
    free(c);
}

bool thaw_kvcache_enabled(const struct thaw_kvcache *c)
{
    return c && (c->disk || c->ram);
}

/* ---- lookup
 * ------------------------------------------------------------------------ */

/* Where a hit's parts come from, and so what ending it releases and what
 * a bad one removes. */
enum held_kind {
    HELD_RAM,     /* a RAM entry: references to its parts */
    HELD_PENDING, /* a store the disk writer still holds: references */
    HELD_DISK,    /* a disk entry: mapped, its .kv verified alongside */
    HELD_PREFIX,  /* blocks of a prefix lookup */
};

struct thaw_kvcache_held {
    enum held_kind kind;
    uint8_t key[THAW_KEY_BYTES]; /* RAM, pending and disk hits' */
    int slot_id, n_past;
    int64_t t0, t_asm0, t_asm1, t_inst; /* lookup, assembly start and end, install end */
    void *refs[THAW_PART_COUNT];        /* RAM and pending hits' references */
    struct thaw_disk_entry *de;         /* a disk hit's */
    struct thaw_job vj;                 /* its .kv's checksum, on a worker */
    struct thaw_disk_cache *vdisk;
    int vrc;
    bool verifying;
    bool has_bs; /* a manifest's blocks (or a prefix's) were assembled into bs */
    struct thaw_blocks_state bs;
    void *snap_ckpt; /* a hybrid's snapshots standing in for the .ckpt */
    uint32_t block_tokens;
    bool snapshot; /* a prefix hit ending at a hybrid's snapshot */
    /* a deferred hit (thaw_kvcache_find_deferred): the entry's parts as
     * found, what thaw_kvcache_hit_prepare made of them, and its checks'
     * verdict, which thaw_kvcache_hit_end then takes instead of waiting */
    struct thaw_part_blob in[THAW_PART_COUNT];
    int prep_rc;
    bool checked;
    int check_rc;
};

static void verify_main(void *arg)
{
    struct thaw_kvcache_held *k = arg;

    k->vrc = thaw_disk_entry_verify(k->vdisk, k->de);
}

/* A manifest in parts: its blocks (and a hybrid's last snapshot) read and
 * assembled for the slot into k->bs, which the hit's parts then name; a
 * whole state: the parts as they are. Returns 0 or an error (a block is
 * gone: THAW_ECORRUPT, this manifest is no use). */
static int assemble(struct thaw_kvcache *c, struct thaw_kvcache_held *k,
                    const struct thaw_part_blob in[THAW_PART_COUNT], struct thaw_part_blob out[THAW_PART_COUNT])
{
    memcpy(out, in, sizeof(struct thaw_part_blob) * THAW_PART_COUNT);
    if (!c->disk || !thaw_manifest_is(in[THAW_PART_KV].data, in[THAW_PART_KV].size))
        return 0;
    struct thaw_kvlayout_frame f = {.seq_id = k->slot_id, .n_stream = c->n_stream, .stream = (uint32_t)k->slot_id};
    const void *man = in[THAW_PART_KV].data;
    size_t n_man = in[THAW_PART_KV].size;
    const uint8_t *snaps;
    uint32_t n_snaps = 0;

    k->t_asm0 = thaw_now_us();
    /* a hybrid's manifest names snapshots: the last one ends the state */
    int rc = thaw_manifest_snaps(man, n_man, &snaps, &n_snaps);
    if (rc == 0 && n_snaps)
        rc = thaw_snapshots_load(c->disk, c->ram, man, n_man, &f, &k->bs);
    else if (rc == 0)
        rc = thaw_blocks_load(c->disk, c->ram, man, n_man, &f, &k->bs);
    if (rc != 0)
        return rc == THAW_ENOTFOUND ? THAW_ECORRUPT : rc;
    k->has_bs = true;
    k->t_asm1 = thaw_now_us();
    out[THAW_PART_KV] = (struct thaw_part_blob){k->bs.kv, k->bs.n_kv};
    if (!out[THAW_PART_CKPT].data &&
        thaw_snapshots_ckpts(c->disk, c->ram, man, n_man, f.seq_id, &k->snap_ckpt, &out[THAW_PART_CKPT].size) == 0)
        out[THAW_PART_CKPT].data = k->snap_ckpt;
    return 0;
}

static struct thaw_kvcache_held *held_new(enum held_kind kind, const uint8_t *key, int slot_id, int n_past)
{
    struct thaw_kvcache_held *k = calloc(1, sizeof(*k));

    if (!k)
        return NULL;
    k->kind = kind;
    if (key)
        memcpy(k->key, key, THAW_KEY_BYTES);
    k->slot_id = slot_id;
    k->n_past = n_past;
    k->t0 = thaw_now_us();
    return k;
}

/* Waits for the checksums still running and releases what the hit held. */
static void held_free(struct thaw_kvcache *c, struct thaw_kvcache_held *k)
{
    if (!k)
        return;
    if (k->verifying)
        thaw_workers_wait(c->workers, &k->vj);
    thaw_disk_entry_release(k->de);
    if (k->has_bs)
        thaw_blocks_state_free(&k->bs);
    thaw_blob_unref(k->snap_ckpt);
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(k->refs[p]);
    free(k);
}

/* Removes the entry a bad or unusable hit came from. */
static void held_remove(struct thaw_kvcache *c, const struct thaw_kvcache_held *k)
{
    if (k->kind == HELD_RAM) {
        thaw_ram_cache_remove(c->ram, k->key);
        ram_gauges(c);
    } else if (k->kind == HELD_DISK) {
        thaw_disk_cache_remove(c->disk, k->key);
    }
}

/* What a hit came from, for the log: "disk entry <key>", "prefix blocks". */
static const char *held_name(const struct thaw_kvcache_held *k, char out[40])
{
    static const char *const what[] = {"RAM entry", "queued store", "disk entry", "prefix blocks"};
    char hex[17];

    if (k->kind == HELD_PREFIX)
        return what[k->kind];
    thaw_keys_short(k->key, hex);
    snprintf(out, 40, "%s %s", what[k->kind], hex);
    return out;
}

/* A found entry's parts (references taken or the entry's own mapping)
 * assembled into the hit; a failure ends it as a miss, removing the entry.
 * Returns as thaw_kvcache_find. */
/* An assembly that failed (rc): the hit ends as a miss, removing the entry. */
static int unusable(struct thaw_kvcache *c, struct thaw_kvcache_held *k, int rc)
{
    char name[40];

    LOG_WRN("slot %d: %s unusable (%s): %s, serving by prefill", k->slot_id, held_name(k, name), thaw_strerror(rc),
            k->kind == HELD_PENDING ? "skipped" : "removed");
    if (k->verifying) { /* a bad .kv removes itself (cache_disk.h) */
        thaw_workers_wait(c->workers, &k->vj);
        k->verifying = false;
    }
    held_remove(c, k);
    held_free(c, k);
    return THAW_ENOTFOUND;
}

/* Whether a found entry's hit has work that can run off the engine
 * thread: blocks to read and assemble, or a checksum running. */
static bool heavy(const struct thaw_kvcache *c, const struct thaw_kvcache_held *k,
                  const struct thaw_part_blob in[THAW_PART_COUNT])
{
    return k->verifying || (c->disk && thaw_manifest_is(in[THAW_PART_KV].data, in[THAW_PART_KV].size));
}

static int found(struct thaw_kvcache *c, struct thaw_kvcache_held *k, const struct thaw_part_blob in[THAW_PART_COUNT],
                 const char *source, bool defer, struct thaw_kvcache_hit *h)
{
    if (c->disk && thaw_manifest_is(in[THAW_PART_KV].data, in[THAW_PART_KV].size))
        flush_named(c, in[THAW_PART_KV].data, in[THAW_PART_KV].size); /* the slots' kept snapshots: engine thread */
    if (defer && heavy(c, k, in)) {
        memcpy(k->in, in, sizeof k->in);
        h->deferred = true;
    } else {
        int rc = assemble(c, k, in, h->parts);
        if (rc != 0)
            return unusable(c, k, rc);
    }
#ifdef THAW_HAVE_SHARED
    /* fetched from the shared tier into the local one just before (its
     * files, or still the writer's) */
    if ((k->kind == HELD_DISK || k->kind == HELD_PENDING) && thaw_shared_taken(c->shared, k->key))
        source = "shared";
#endif
    h->source = source;
    h->held = k;
    return 0;
}

static int find(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], int slot_id, int n_past, bool defer,
                struct thaw_kvcache_hit *h)
{
    char hex[17];
    int64_t t0 = thaw_now_us();

    memset(h, 0, sizeof(*h));
    thaw_keys_short(key, hex);
    if (c->ram) {
        if (thaw_ram_cache_evict(c->ram, wall_s()) > 0)
            ram_gauges(c);
        const struct thaw_ram_entry *re = thaw_ram_cache_get(c->ram, key, wall_s());
        if (re) {
            struct thaw_kvcache_held *k = held_new(HELD_RAM, key, slot_id, n_past);
            if (!k)
                return THAW_ENOTFOUND;
            k->t0 = t0;
            for (int p = 0; p < THAW_PART_COUNT; p++)
                k->refs[p] = re->parts[p].data ? thaw_blob_ref(re->parts[p].data) : NULL;
            /* a manifest: its blocks from RAM, else from disk */
            return found(c, k, re->parts, "ram", defer, h);
        }
    }
    if (!c->disk)
        return THAW_ENOTFOUND;
    struct thaw_part_blob pend[THAW_PART_COUNT];
    thaw_disk_cache_evict(c->disk);
    /* A store still in the writer's queue: the turn that follows its reply
     * at once would miss the files, which are not written yet. Checked
     * before the index: a job leaves the queue only once its entry is
     * committed. */
    if (thaw_disk_cache_pending(c->disk, key, pend) == 0) {
        struct thaw_kvcache_held *k = held_new(HELD_PENDING, key, slot_id, n_past);
        if (!k) {
            for (int p = 0; p < THAW_PART_COUNT; p++)
                thaw_blob_unref(pend[p].data);
            return THAW_ENOTFOUND;
        }
        k->t0 = t0;
        for (int p = 0; p < THAW_PART_COUNT; p++)
            k->refs[p] = pend[p].data;
        LOG_DBG("slot %d: %s found in the disk writer's queue", slot_id, hex);
        return found(c, k, pend, "disk", defer, h);
    }
    struct thaw_disk_entry *de = NULL;
    int64_t t_lookup = thaw_now_us();
    int rc = thaw_disk_cache_lookup_ex(c->disk, key, THAW_DISK_LOOKUP_DEFER_KV, &de);
    LOG_DBG("slot %d: disk lookup %.2f ms (eviction %.2f ms)", slot_id, (double)(thaw_now_us() - t_lookup) / 1000.0,
            (double)(t_lookup - t0) / 1000.0);
    if (rc == THAW_ECORRUPT)
        LOG_WRN("slot %d: disk entry %s failed verification: removed, serving by prefill", slot_id, hex);
    if (rc != 0)
        return THAW_ENOTFOUND;
    struct thaw_kvcache_held *k = held_new(HELD_DISK, key, slot_id, n_past);
    if (!k) {
        thaw_disk_entry_release(de);
        return THAW_ENOTFOUND;
    }
    k->t0 = t0;
    k->de = de;
    k->vdisk = c->disk;
    struct thaw_part_blob parts[THAW_PART_COUNT];
    for (int p = 0; p < THAW_PART_COUNT; p++)
        parts[p].data = (void *)thaw_disk_entry_part(de, (enum thaw_part)p, &parts[p].size);
    /* the .kv's checksum runs on the other core while the caller installs */
    if (thaw_workers_submit(c->workers, &k->vj, verify_main, k) == 0) {
        k->verifying = true;
    } else {
        thaw_workers_wait(c->workers, &k->vj); /* no pool: checked here, first */
        if (k->vrc != 0) {
            LOG_WRN("slot %d: disk entry %s failed verification: removed, serving by prefill", slot_id, hex);
            held_free(c, k);
            return THAW_ENOTFOUND;
        }
    }
    return found(c, k, parts, "disk", defer, h);
}

int thaw_kvcache_find(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], int slot_id, int n_past,
                      struct thaw_kvcache_hit *h)
{
    return find(c, key, slot_id, n_past, false, h);
}

int thaw_kvcache_find_deferred(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], int slot_id, int n_past,
                               struct thaw_kvcache_hit *h)
{
    return find(c, key, slot_id, n_past, true, h);
}

void thaw_kvcache_hit_prepare(struct thaw_kvcache *c, struct thaw_kvcache_hit *h)
{
    struct thaw_kvcache_held *k = h->held;

    if (!k || !h->deferred)
        return;
    if ((k->prep_rc = assemble(c, k, k->in, h->parts)) != 0)
        return; /* thaw_kvcache_hit_ready removes the entry (the RAM tier's: engine thread) */
    /* the checks the install would have run beside: here, off the engine */
    if (k->verifying) {
        thaw_workers_wait(c->workers, &k->vj);
        k->verifying = false;
        k->check_rc = k->vrc; /* a bad .kv removes itself (cache_disk.h) */
    }
    if (!k->check_rc && k->has_bs && thaw_blocks_state_check(&k->bs) != 0)
        k->check_rc = THAW_ECORRUPT; /* the bad block is removed */
    k->checked = true;
}

int thaw_kvcache_hit_ready(struct thaw_kvcache *c, struct thaw_kvcache_hit *h)
{
    struct thaw_kvcache_held *k = h->held;
    char name[40];

    if (!k || !h->deferred)
        return 0;
    h->deferred = false;
    if (k->prep_rc != 0) {
        h->held = NULL;
        return unusable(c, k, k->prep_rc);
    }
    if (k->check_rc != 0) {
        LOG_WRN("slot %d: %s failed verification: removed, serving by prefill", k->slot_id, held_name(k, name));
        h->held = NULL;
        held_free(c, k);
        return THAW_ENOTFOUND;
    }
    return 0;
}

int thaw_kvcache_find_prefix(struct thaw_kvcache *c, const uint8_t ns[THAW_KEY_BYTES], const thaw_token *prompt,
                             int n_prompt, int slot_id, int n_past, struct thaw_kvcache_hit *h)
{
    struct thaw_kvlayout_frame f = {.seq_id = slot_id, .n_stream = c->n_stream, .stream = (uint32_t)slot_id};
    uint8_t binding[THAW_KEY_BYTES];

    memset(h, 0, sizeof(*h));
    if (!c->disk || !c->block_tokens || !(c->prefix_lookup || c->snapshots) || n_prompt - 1 <= n_past ||
        (!c->snapshots && (n_prompt - 1) / (int)c->block_tokens * (int)c->block_tokens <= n_past))
        return THAW_ENOTFOUND; /* no run of blocks could beat what the slot holds */
    struct thaw_kvcache_held *k = held_new(HELD_PREFIX, NULL, slot_id, n_past);
    if (!k)
        return THAW_ENOTFOUND;
    k->block_tokens = c->block_tokens;
    k->snapshot = c->snapshots;
    block_binding(c, ns, binding);
    /* a hybrid resumes at its deepest snapshot, a dense or SWA model after its
     * longest run of blocks (an SWA model's with its window's SWA blocks) */
    const struct thaw_blocks_prefix_params pp = {
        .disk = c->disk,
        .ram = c->ram,
        .binding = binding,
        .block_tokens = c->block_tokens,
        .n_window = c->n_window,
        .toks = prompt,
        .n = n_prompt,
        .frame = &f,
    };
    k->t_asm0 = thaw_now_us();
    int rc = c->snapshots ? thaw_snapshots_prefix(&pp, &k->bs) : thaw_blocks_prefix(&pp, &k->bs);
    k->t_asm1 = thaw_now_us();
    if (rc != 0) {
        if (rc != THAW_ENOTFOUND)
            LOG_WRN("slot %d: prefix blocks unusable (%s): serving by prefill", slot_id, thaw_strerror(rc));
        free(k);
        return THAW_ENOTFOUND;
    }
    k->has_bs = true;
    if (k->bs.n_tokens <= n_past) {
        held_free(c, k);
        return THAW_ENOTFOUND;
    }
    h->parts[THAW_PART_KV] = (struct thaw_part_blob){k->bs.kv, k->bs.n_kv};
    h->source = "blocks";
    h->held = k;
    return 0;
}

int thaw_kvcache_hit_end(struct thaw_kvcache *c, struct thaw_kvcache_hit *h, int installed)
{
    struct thaw_kvcache_held *k = h->held;
    int bad = 0;
    char name[40];

    if (!k)
        return installed;
    h->held = NULL;
    k->t_inst = thaw_now_us();
    if (k->checked) { /* checked before the install, off the engine (thaw_kvcache_hit_prepare) */
        bad = k->check_rc;
    } else {
        if (k->verifying) {
            thaw_workers_wait(c->workers, &k->vj);
            k->verifying = false;
            bad = k->vrc; /* a bad .kv removes itself (cache_disk.h) */
        }
        /* the blocks' checksums ran alongside */
        if (!bad && k->has_bs && thaw_blocks_state_check(&k->bs) != 0)
            bad = THAW_ECORRUPT; /* the bad block is removed */
    }
    if (k->has_bs && k->kind != HELD_PREFIX)
        LOG_DBG("slot %d: %.1f MiB of state, %d blocks read from files: assembled in %.1f ms, installed in %.1f ms, "
                "checksums waited for %.1f ms",
                k->slot_id, (double)k->bs.n_kv / 1048576.0, k->bs.n_blocks, (double)(k->t_asm1 - k->t_asm0) / 1000.0,
                (double)(k->t_inst - k->t_asm1) / 1000.0, (double)(thaw_now_us() - k->t_inst) / 1000.0);
    int got = installed;
    if (bad) {
        if (k->kind == HELD_DISK && k->vrc)
            LOG_WRN("slot %d: %s failed verification: removed, serving by prefill", k->slot_id, held_name(k, name));
        else
            LOG_WRN("slot %d: %s unusable (%s): serving by prefill", k->slot_id, held_name(k, name),
                    thaw_strerror(bad));
        got = bad;
    } else if (installed < 0) {
        LOG_WRN("slot %d: %s unusable (%s): %s, serving by prefill", k->slot_id, held_name(k, name),
                thaw_strerror(installed), k->kind == HELD_RAM || k->kind == HELD_DISK ? "removed" : "skipped");
        held_remove(c, k);
    }
    if (got > k->n_past) { /* the caller counts the outcome, once per request */
        int64_t us = thaw_now_us() - k->t0;
        h->restore_ms = (double)us / 1000.0;
        atomic_fetch_add(&c->metrics->restore_us, (uint64_t)us);
        if (k->kind == HELD_PREFIX) {
            LOG_INF("slot %d: %d prompt tokens from %d stored blocks%s (prefix lookup)", k->slot_id, got,
                    got / (int)k->block_tokens, k->snapshot ? " and a snapshot" : "");
            atomic_fetch_add(&c->prefix_hits, 1);
            atomic_fetch_add(&c->prefix_tokens, (uint64_t)(got - k->n_past));
        }
    }
    held_free(c, k);
    return got;
}

/* ---- store
 * ------------------------------------------------------------------------- */

static void count_blocks(struct thaw_kvcache *c, const struct thaw_blocks_stats *st)
{
    atomic_fetch_add(&c->blocks_written, st->written);
    atomic_fetch_add(&c->blocks_skipped, st->skipped);
    atomic_fetch_add(&c->blocks_dropped, st->dropped);
    atomic_fetch_add(&c->store_bytes, st->bytes_written);
}

/* The disk's copy of a capture: its blocks (those the disk does not hold)
 * go to the writer now, and the manifest replaces the .kv part. Returns 0
 * (w[THAW_PART_KV] is the manifest, the caller's reference to the .kv
 * dropped), 1 (store the whole state: blocks are off or the layout is
 * unknown) or an error (the store is dropped). */
static int to_blocks(struct thaw_kvcache *c, int slot_id, const uint8_t ns[THAW_KEY_BYTES],
                     struct thaw_part_blob w[THAW_PART_COUNT])
{
    struct thaw_kvstate_view v;
    struct thaw_blocks_stats st;
    uint8_t binding[THAW_KEY_BYTES];
    void *man;
    size_t n_man;
    int rc;

    if (!c->block_tokens)
        return 1;
    if ((rc = thaw_kvstate_parse(w[THAW_PART_KV].data, w[THAW_PART_KV].size, &v)) != 0)
        return rc;
    block_binding(c, ns, binding);
    const struct thaw_blocks_store_params bp = {
        .disk = c->disk,
        .ram = c->ram,
        .binding = binding,
        .block_tokens = c->block_tokens,
        .toks = v.tokens,
        .n = v.n_tokens,
        .state = v.state,
        .n_state = v.n_state,
        .window = c->n_window,
    };
    rc = THAW_ELAYOUT;
    if (c->snapshots) {
        /* not with a shared tier: its upload of this turn reads the
         * manifest's entries from the disk now (cache_shared.c) */
        bool keep = c->pending && !c->shared && slot_id >= 0 && (uint32_t)slot_id < c->n_stream;
        struct thaw_snapshot_pending pd;
        rc = thaw_snapshots_store(&bp, w[THAW_PART_CKPT].data, w[THAW_PART_CKPT].size, &man, &n_man, keep ? &pd : NULL,
                                  &st);
        if (rc == 0 && keep) {
            /* the slot still held its last pending one's prefix (a cut
             * below it would have written it): this turn supersedes it */
            if (c->pending[slot_id].blob)
                atomic_fetch_add(&c->turn_snaps_superseded, 1);
            thaw_snapshots_pending_drop(&c->pending[slot_id]);
            if (pd.blob) {
                pd.since_us = thaw_now_us();
                c->pending[slot_id] = pd;
                atomic_fetch_add(&c->turn_snaps_kept, 1);
            }
        }
        if (rc == THAW_ELAYOUT) {
            LOG_WRN("kv-cache: this hybrid's state layout is not one snapshots know: its recurrent state goes in "
                    "each manifest, and no prefix lookup");
            c->snapshots = false;
        } else if (rc == 0) {
            /* the manifest names the checkpoints as snapshots: no second copy in .ckpt */
            thaw_blob_unref(w[THAW_PART_CKPT].data);
            w[THAW_PART_CKPT].data = NULL;
            w[THAW_PART_CKPT].size = 0;
        }
    }
    if (rc == THAW_ELAYOUT)
        rc = thaw_blocks_store(&bp, &man, &n_man, &st);
    count_blocks(c, &st);
    if (rc == THAW_ELAYOUT) {
        LOG_WRN("kv-cache: this model's state layout cannot be cut into blocks: whole states from now on");
        c->block_tokens = 0;
        return 1;
    }
    if (rc != 0)
        return rc;
    LOG_DBG("slot %d: %u blocks written, %u already stored, manifest %.1f KiB", slot_id, st.written, st.skipped,
            (double)n_man / 1024.0);
    thaw_blob_unref(w[THAW_PART_KV].data);
    w[THAW_PART_KV].data = man;
    w[THAW_PART_KV].size = n_man;
    return 0;
}

int thaw_kvcache_cuts_blocks(const struct thaw_kvcache *c)
{
    return c->disk && c->block_tokens;
}

uint32_t thaw_kvcache_block_tokens(const struct thaw_kvcache *c)
{
    return c->disk ? c->block_tokens : 0;
}

/* The RAM tier's entry for a hint over the n blocks at ids: named by the
 * last one, whose id chains all before it (DESIGN §9). */
static void retain_key(const uint8_t *ids, uint32_t n, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)"thaw.retain.v1", 14);
    crypto_generichash_update(&st, ids + (size_t)(n - 1) * THAW_KEY_BYTES, THAW_KEY_BYTES);
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

/* A store's retention hints (kvcache.h): over its manifest's first blocks
 * (ids, n_ids; NULL without blocks: the entry `key` itself, RAM only). */
static void apply_retains(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], const uint8_t *ids,
                          uint32_t n_ids, const struct thaw_kvcache_retain *retain, int n_retain, bool disk, bool ram)
{
    for (int i = 0; i < n_retain; i++) {
        uint32_t nb = ids && c->block_tokens ? (uint32_t)retain[i].n_tokens / c->block_tokens : 0;
        uint8_t rk[THAW_KEY_BYTES];

        if (nb > n_ids)
            nb = n_ids;
        if (ids && nb == 0)
            continue; /* covers less than a block */
        if (disk && nb)
            thaw_disk_cache_retain(c->disk, ids, nb, retain[i].until);
        if (ram && c->ram) {
            if (nb)
                retain_key(ids, nb, rk);
            (void)thaw_ram_cache_retain(c->ram, nb ? rk : key, nb ? ids : NULL, nb, retain[i].until, wall_s());
        }
        atomic_fetch_add(&c->retains, 1);
    }
}

/* cut: parts[THAW_PART_KV] is a manifest already (its blocks are queued) */
static const char *store(struct thaw_kvcache *c, int slot_id, const uint8_t key[THAW_KEY_BYTES],
                         const uint8_t ns[THAW_KEY_BYTES], int n_tokens, struct thaw_part_blob parts[THAW_PART_COUNT],
                         const uint8_t *supersedes, bool cut, bool local_only, const struct thaw_kvcache_retain *retain,
                         int n_retain)
{
    const char *where = c->disk && c->ram ? "ram+disk" : c->disk ? "disk" : c->ram ? "ram" : "none";
    void *man_ram = NULL;
    size_t n_man_ram = 0;
    char hex[17];
    int rc;

    thaw_keys_short(key, hex);
    if (c->disk) {
        /* with both tiers, both hold a reference to the same bytes */
        struct thaw_part_blob w[THAW_PART_COUNT];
        for (int p = 0; p < THAW_PART_COUNT; p++) {
            w[p] = parts[p];
            if (c->ram && parts[p].data)
                thaw_blob_ref(parts[p].data);
        }
        rc = cut ? 0 : to_blocks(c, slot_id, ns, w);
        /* blocks with their SWA rows rebuild the window wherever a restore
         * needs it: checkpoints (a window each) would copy it again */
        if (rc == 0 && w[THAW_PART_CKPT].data &&
            thaw_manifest_swa_rows(w[THAW_PART_KV].data, w[THAW_PART_KV].size)) {
            thaw_blob_unref(w[THAW_PART_CKPT].data);
            if (c->ram)
                thaw_blob_unref(parts[THAW_PART_CKPT].data); /* its own reference to the same bytes */
            w[THAW_PART_CKPT] = parts[THAW_PART_CKPT] = (struct thaw_part_blob){NULL, 0};
        }
        /* with blocks the RAM tier keeps the manifest (its blocks are
         * held there once each), not a second whole copy of the state */
        if (rc == 0 && c->ram) {
            man_ram = thaw_blob_ref(w[THAW_PART_KV].data);
            n_man_ram = w[THAW_PART_KV].size;
        }
        /* its blocks are held until the manifest is queued (blocks.h): the
         * ids live in the manifest, which the writer may free once it has it */
        void *held = NULL;
        const uint8_t *held_ids = NULL;
        uint32_t n_held = 0;
        if (rc == 0 && thaw_manifest_ids(w[THAW_PART_KV].data, w[THAW_PART_KV].size, &held_ids, &n_held) == 0)
            held = thaw_blob_ref(w[THAW_PART_KV].data);
        if (rc < 0)
            LOG_WRN("slot %d: store of %s to disk dropped: its blocks could not be queued (%s)", slot_id, hex,
                    thaw_strerror(rc));
        else
            rc = thaw_disk_cache_submit(c->disk, key, (uint32_t)n_tokens, w, NULL, 0);
#ifdef THAW_HAVE_SHARED
        if (rc == 0 && !local_only)
            thaw_shared_upload(c->shared, key, ns);
#else
        (void)local_only;
#endif
        if (rc != 0) {
            /* the cache logged why (queue bytes, shutdown, ...) */
            LOG_DBG("slot %d: store of %s to disk dropped: %s", slot_id, hex, thaw_strerror(rc));
            for (int p = 0; p < THAW_PART_COUNT; p++)
                thaw_blob_unref(w[p].data); /* on failure the reference stayed here */
        }
        if (held) {
            if (rc == 0)
                apply_retains(c, key, held_ids, n_held, retain, n_retain, true, false);
            thaw_disk_cache_unhold(c->disk, held_ids, n_held);
            thaw_blob_unref(held);
        }
        if (!c->ram)
            memset(parts, 0, THAW_PART_COUNT * sizeof *parts); /* moved to the writer, or dropped just above */
    }
    if (c->ram) {
        const uint8_t *ids = NULL;
        uint32_t n_ids = 0;
        if (man_ram) {
            thaw_blob_unref(parts[THAW_PART_KV].data); /* the whole state: the manifest and blocks stand for it */
            parts[THAW_PART_KV].data = man_ram;
            parts[THAW_PART_KV].size = n_man_ram;
            if (thaw_manifest_ids(man_ram, n_man_ram, &ids, &n_ids) != 0)
                ids = NULL, n_ids = 0;
        }
        if (thaw_ram_cache_put_refs(c->ram, key, parts, ids, n_ids, wall_s()) != 0)
            LOG_DBG("slot %d: %s does not fit the RAM tier (--cache-ram)", slot_id, hex);
        else
            apply_retains(c, key, man_ram ? ids : NULL, n_ids, retain, n_retain, false, true);
        memset(parts, 0, THAW_PART_COUNT * sizeof *parts); /* the RAM tier's now */
    } else if (!c->disk) {
        for (int p = 0; p < THAW_PART_COUNT; p++)
            thaw_blob_unref(parts[p].data);
        memset(parts, 0, THAW_PART_COUNT * sizeof *parts);
    }
    /* The previous turn's entry is a prefix of this one: keep it in RAM
     * only while the disk cannot serve it (a regenerated reply looks it
     * up again). Frees memory for more conversations, and a mapping the
     * next capture reuses (blob.h). */
    if (c->ram && c->disk && supersedes && memcmp(supersedes, key, THAW_KEY_BYTES) != 0 &&
        thaw_disk_cache_contains(c->disk, supersedes))
        thaw_ram_cache_remove(c->ram, supersedes);
    ram_gauges(c);
    return where;
}

/* The blocks of toks[0, n) cut from src and handed to the writer
 * (thaw_blocks_store), counted; with ahead, only the whole ones, unsynced,
 * and no manifest. */
static int cut_blocks(struct thaw_kvcache *c, const uint8_t ns[THAW_KEY_BYTES], const thaw_token *toks, int n,
                      const struct thaw_blocks_src *src, bool ahead, void **man, size_t *n_man,
                      struct thaw_blocks_stats *st)
{
    uint8_t binding[THAW_KEY_BYTES];

    block_binding(c, ns, binding);
    const struct thaw_blocks_store_params bp = {
        .disk = c->disk,
        .ram = c->ram,
        .binding = binding,
        .block_tokens = c->block_tokens,
        .toks = toks,
        .n = n,
        .src = src,
        .ahead = ahead,
    };
    int rc = thaw_blocks_store(&bp, man, n_man, st);
    count_blocks(c, st);
    return rc;
}

/* The blocks of a source (the KV cache's memory) and their manifest, for
 * store(). 0 (parts[THAW_PART_KV] is the manifest) or an error (nothing
 * stored, nothing held). */
static int src_blocks(struct thaw_kvcache *c, const struct thaw_kvcache_store_params *p,
                      struct thaw_part_blob parts[THAW_PART_COUNT])
{
    struct thaw_blocks_stats st;
    void *man;
    size_t n_man;

    int rc = cut_blocks(c, p->ns, p->toks, p->n_tokens, p->src, false, &man, &n_man, &st);
    if (rc != 0) {
        if (rc != THAW_ENOTFOUND)
            LOG_DBG("slot %d: blocks from the cache's memory failed (%s): capturing", p->slot_id, thaw_strerror(rc));
        return rc;
    }
    LOG_DBG("slot %d: %u blocks cut from the cache's memory, %u already stored, manifest %.1f KiB", p->slot_id,
            st.written, st.skipped, (double)n_man / 1024.0);
    parts[THAW_PART_KV].data = man;
    parts[THAW_PART_KV].size = n_man;
    return 0;
}

static const char *store_batched(struct thaw_kvcache *c, const struct thaw_kvcache_store_params *p,
                                 struct thaw_part_blob parts[THAW_PART_COUNT])
{
    if (!p->src)
        return store(c, p->slot_id, p->key, p->ns, p->n_tokens, parts, p->supersedes, false, p->local_only,
                     p->retain, p->n_retain);
    if (!thaw_kvcache_cuts_blocks(c) || parts[THAW_PART_KV].data || src_blocks(c, p, parts) != 0)
        return NULL;
    warm_after_store(c, p->src, p->n_tokens);
    return store(c, p->slot_id, p->key, p->ns, p->n_tokens, parts, p->supersedes, true, p->local_only, p->retain,
                 p->n_retain);
}

/* A turn's new blocks and its manifest reach the writer as one batch: one
 * group commit, two syncs, however the writer's wake-ups fall (without it
 * the first block alone was often a group of its own: a third sync). */
const char *thaw_kvcache_store(struct thaw_kvcache *c, const struct thaw_kvcache_store_params *p,
                               struct thaw_part_blob parts[THAW_PART_COUNT])
{
    thaw_disk_cache_batch_begin(c->disk);
    const char *where = store_batched(c, p, parts);
    thaw_disk_cache_batch_end(c->disk);
    return where;
}

int thaw_kvcache_store_ahead(struct thaw_kvcache *c, int slot_id, const uint8_t ns[THAW_KEY_BYTES],
                             const thaw_token *toks, const struct thaw_blocks_src *src)
{
    struct thaw_blocks_stats st;
    void *man = NULL;
    size_t n_man = 0;

    if (!c || !thaw_kvcache_cuts_blocks(c) || src->n_cells < c->block_tokens)
        return 0;
    thaw_disk_cache_batch_begin(c->disk); /* one group, as a turn's store */
    int rc = cut_blocks(c, ns, toks, (int)src->n_cells, src, true, &man, &n_man, &st);
    thaw_disk_cache_batch_end(c->disk);
    atomic_fetch_add(&c->blocks_ahead, st.written);
    if (rc != 0) {
        LOG_DBG("slot %d: blocks ahead not stored (%s): the turn's store writes them", slot_id, thaw_strerror(rc));
        return 0;
    }
    if (st.written)
        LOG_DBG("slot %d: %u blocks stored ahead of the turn's store, %u already stored", slot_id, st.written,
                st.skipped);
    return (int)st.written;
}

/* ---- metrics
 * ----------------------------------------------------------------------- */

void thaw_kvcache_prefetch(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES])
{
    if (c && c->disk && thaw_disk_cache_prefetch(c->disk, key) > 0)
        atomic_fetch_add(&c->metrics->cache_prefetches, 1);
}

int thaw_kvcache_fetch_shared(struct thaw_kvcache *c, const uint8_t *key, const uint8_t ns[THAW_KEY_BYTES],
                              const thaw_token *prompt, int n_prompt, void (*done)(void *ud), void *ud)
{
#ifdef THAW_HAVE_SHARED
    if (c && c->shared)
        return thaw_shared_fetch_async(c->shared, key, ns, prompt, n_prompt, done, ud);
#else
    (void)key, (void)ns, (void)prompt, (void)n_prompt, (void)done, (void)ud;
#endif
    (void)c;
    return THAW_ENOTFOUND;
}

void thaw_kvcache_expect(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES])
{
#ifdef THAW_HAVE_SHARED
    if (c)
        thaw_shared_expect(c->shared, key);
#else
    (void)c, (void)key;
#endif
}

void thaw_kvcache_stop_fetches(struct thaw_kvcache *c)
{
#ifdef THAW_HAVE_SHARED
    if (c)
        thaw_shared_stop(c->shared);
#else
    (void)c;
#endif
}

void thaw_kvcache_metrics(struct thaw_kvcache *c, char *buf, size_t cap, size_t *len)
{
    struct thaw_disk_cache_stats st;

    if (!c || !c->disk)
        return;
#ifdef THAW_HAVE_SHARED
    thaw_shared_metrics(c->shared, buf, cap, len);
#endif
    thaw_disk_cache_get_stats(c->disk, &st);
#define C(n, h, v) thaw_metrics_append(buf, cap, len, "thaw_kv_disk_" n, "counter", h, (double)(v))
#define G(n, h, v) thaw_metrics_append(buf, cap, len, "thaw_kv_disk_" n, "gauge", h, (double)(v))
    G("entries", "entries in --kv-cache-dir", st.entries);
    G("bytes", "bytes on disk in --kv-cache-dir", st.bytes);
    C("stores_total", "entries written", st.stores_ok);
    C("root_stores_total", "conversations' manifests (or whole states) written: each makes a turn durable",
      st.roots_ok);
    C("store_failures_total", "stores that failed (I/O error, disk full)", st.store_failures);
    C("fsyncs_total",
      "fsync and syncfs calls of the disk tier (a store waits for them; the writer's group commit syncs the "
      "filesystem twice for all the stores it commits together)",
      st.fsyncs);
    C("commit_groups_total", "group commits of the disk writer", st.groups);
    C("commit_groups_unsynced_total",
      "of them: groups of nothing but blocks written ahead of their manifest (no sync: the manifest's group "
      "syncs them)",
      st.groups_unsynced);
    C("stores_superseded_total",
      "stores taken out of the writer's queue unwritten because a newer store of the same conversation came "
      "(a reply stored early, then after its re-decode)",
      st.stores_superseded);
    C("commit_wait_seconds_total", "time the oldest store of each group commit waited in the writer's queue",
      st.group_wait_us / 1e6);
    C("commit_write_seconds_total", "time the group commits spent writing files (syncs aside)",
      st.group_write_us / 1e6);
    C("commit_sync_seconds_total", "time the group commits spent in the syncs that make them durable",
      st.group_sync_us / 1e6);
    C("stores_dropped_total",
      "stores not queued for disk (writer queue bytes full, too big, shutting "
      "down)",
      st.stores_dropped);
    G("queue_bytes", "bytes of stores waiting for or being written by the disk writer", st.queue_bytes);
    C("store_bytes_total", "bytes of blocks queued for disk (manifests and whole states aside)",
      atomic_load(&c->store_bytes));
    C("blocks_written_total", "blocks queued for disk", atomic_load(&c->blocks_written));
    C("blocks_skipped_total", "blocks not written: the disk held them already", atomic_load(&c->blocks_skipped));
    C("blocks_ahead_total",
      "of blocks_written: a prompt's blocks queued while its reply was generated, ahead of the turn's store "
      "(written without syncs; the store that names them syncs them)",
      atomic_load(&c->blocks_ahead));
    C("blocks_dropped_total", "blocks the writer refused (queue full)", atomic_load(&c->blocks_dropped));
    C("prefix_hits_total", "lookups served by a run of stored blocks (no entry for the conversation)",
      atomic_load(&c->prefix_hits));
    C("prefix_tokens_total", "prompt tokens served by prefix lookups", atomic_load(&c->prefix_tokens));
    C("turn_snapshots_kept_total",
      "a hybrid's turn-end snapshots kept in the slot instead of written with the turn (snapshots.h)",
      atomic_load(&c->turn_snaps_kept));
    C("turn_snapshots_written_total",
      "kept turn-end snapshots written once the slot lost the conversation, sat idle, or at shutdown",
      atomic_load(&c->turn_snaps_written));
    C("turn_snapshots_superseded_total",
      "kept turn-end snapshots never written: the conversation's next turn came (or will part from them before)",
      atomic_load(&c->turn_snaps_superseded));
    C("turn_snapshots_dropped_total", "kept turn-end snapshots the writer refused (queue full, shutting down)",
      atomic_load(&c->turn_snaps_dropped));
    C("retention_hints_total",
      "cache_control marks applied to a stored turn: what each covers is kept its ttl, evicted last",
      atomic_load(&c->retains));
    C("evictions_enospc_total", "entries evicted to make room when the disk was full", st.evictions_enospc);
    C("evictions_ttl_total", "conversations (manifests, whole states) evicted by --kv-cache-ttl", st.evictions_ttl);
    C("evictions_lru_total", "conversations (manifests, whole states) evicted by --kv-cache-max", st.evictions_lru);
    G("blocks", "blocks in --kv-cache-dir (counted in thaw_kv_disk_entries and _bytes)", st.blocks);
    G("blocks_unreferenced", "blocks no conversation names, kept for their grace", st.blocks_unreferenced);
    C("blocks_collected_total", "blocks removed because no conversation named them any more", st.blocks_collected);
    C("block_bytes_collected_total", "bytes of those blocks", st.block_bytes_collected);
    C("corrupt_removed_total", "entries removed because they failed verification", st.corrupt_removed);
#undef C
#undef G
    /* the RAM tier belongs to the engine thread: its gauges are not read here */
}
