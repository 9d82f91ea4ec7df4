/* test_cache_disk_gc.c — roots, blocks and garbage collection in the disk
 * tier (cache_disk.c invariants 7 and 8), with a toy classify() instead of
 * llama states: a .kv starting 'B' is a block, one starting 'M' a manifest
 * (u32 n, then n block keys), anything else a whole state.
 *   - LRU and TTL evict manifests, then the blocks no manifest names; a
 *     block another manifest names stays, however old;
 *   - a corrupt block is removed at its lookup;
 *   - blocks of a store in progress (manifest queued, or held until it
 *     is) are not collected, even over budget; unnamed blocks keep a grace
 *     while there is room, none over budget; contains() restarts a block's
 *     grace; orphans of a crash go one grace later, also after a restart;
 *   - a reopen rebuilds the refcounts from the .idx records;
 *   - a crash at every system call of a store of blocks + manifest, of
 *     the writer's group commit of two conversations and a replaced whole
 *     state, and of an eviction with its collection: the directory opens
 *     clean, never a manifest naming a missing block, and nothing is left
 *     unnamed after one pass;
 *   - group commit: the fsyncs of a group (2 per entry + 3, not 4 per
 *     entry), one failure inside a group (a job's own write or fsync, a
 *     full disk, the shared directory fsync) and how each job ends, every
 *     job of the group being written found by pending() and queued() until
 *     its own commit.
 *
 * Map:
 *   ---- fixtures ----   temp dir, fake clock, toy entries, file checks
 *   ---- eviction ----   LRU, TTL, corrupt block, reopen
 *   ---- in progress ---- queued manifest, grace, contains(), orphans
 *   ---- crashes ----    store of blocks + manifest, eviction + GC
 *   ---- group commit ---- crash across a group, fsync count, failures
 *                         inside a group, pending() of a group
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/blob.h"
#include "base/error.h"
#include "base/vfs.h"
#include "cache/cache_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- fixtures ----------------------------------------------------------- */

#define BLOCK_SIZE 1000 /* bytes of a block's .kv */
#define MAN_PAD 100     /* bytes of a manifest's .kv past its keys */
#define IDX_BYTES 160   /* an .idx without meta or refs */
#define GRACE 600

struct fx {
    char dir[64];
    int64_t now; /* the fake clock, Unix seconds */
    struct thaw_disk_cache *c;
};

static int64_t fake_now(void *ud)
{
    return *(const int64_t *)ud;
}

static int toy_classify(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs)
{
    const uint8_t *b = kv;
    uint32_t k;

    (void)ud;
    if (n >= 1 && b[0] == 'B')
        return THAW_DISK_KIND_BLOCK;
    if (n >= 5 && b[0] == 'M') {
        memcpy(&k, b + 1, 4);
        if (5 + (size_t)k * THAW_KEY_BYTES <= n) {
            *refs = b + 5;
            *n_refs = k;
        }
    }
    return THAW_DISK_KIND_ROOT;
}

static struct thaw_disk_cache_params fx_params(struct fx *f)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();

    p.dir = f->dir;
    p.now = fake_now;
    p.now_ud = &f->now;
    p.classify = toy_classify;
    p.ttl_s = 0;
    p.block_grace_s = 0;
    memset(p.fingerprint, 0xab, sizeof p.fingerprint);
    return p;
}

static void fx_open_p(struct fx *f, const struct thaw_disk_cache_params *p)
{
    int r = thaw_disk_cache_open(p, &f->c);

    if (r)
        fail_msg("open %s: %s", f->dir, thaw_strerror(r));
}

static void fx_close(struct fx *f)
{
    thaw_disk_cache_close(f->c);
    f->c = NULL;
}

static void empty_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    char p[PATH_MAX];

    assert_non_null(d);
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        unlink(p);
    }
    closedir(d);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);

    if (!f)
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/thaw_gc_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    f->now = 1700000000;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;

    if (f->c)
        fx_close(f);
    empty_dir(f->dir);
    rmdir(f->dir);
    free(f);
    return 0;
}

static void key_make(uint8_t key[THAW_KEY_BYTES], unsigned n)
{
    for (int i = 0; i < THAW_KEY_BYTES; i++)
        key[i] = (uint8_t)(n * 131u + (unsigned)i * 7u + 1u);
}

/* A block's .kv: 'B' and bytes of seed n. */
static uint8_t *block_kv(unsigned n)
{
    uint8_t *b = malloc(BLOCK_SIZE);

    assert_non_null(b);
    for (size_t i = 0; i < BLOCK_SIZE; i++)
        b[i] = (uint8_t)(i * 31u + n);
    b[0] = 'B';
    return b;
}

/* A manifest's .kv naming the blocks of seeds ids[0, n). *size gets its size. */
static uint8_t *man_kv(const unsigned *ids, uint32_t n, size_t *size)
{
    size_t len = 5 + (size_t)n * THAW_KEY_BYTES + MAN_PAD;
    uint8_t *b = calloc(1, len);

    assert_non_null(b);
    b[0] = 'M';
    memcpy(b + 1, &n, 4);
    for (uint32_t i = 0; i < n; i++)
        key_make(b + 5 + (size_t)i * THAW_KEY_BYTES, ids[i]);
    *size = len;
    return b;
}

static uint64_t block_bytes(void)
{
    return BLOCK_SIZE + IDX_BYTES;
}

static uint64_t man_bytes(uint32_t n)
{
    return 5 + (uint64_t)n * THAW_KEY_BYTES + MAN_PAD + IDX_BYTES + (uint64_t)n * THAW_KEY_BYTES;
}

static int store_block(struct thaw_disk_cache *c, unsigned n)
{
    uint8_t key[THAW_KEY_BYTES], *kv = block_kv(n);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{kv, BLOCK_SIZE}, {NULL, 0}, {NULL, 0}};
    int r;

    key_make(key, n);
    r = thaw_disk_cache_store(c, key, 32, parts, NULL, 0);
    free(kv);
    return r;
}

/* Manifests are keyed 1000 + m, blocks by their seed. */
static int store_man(struct thaw_disk_cache *c, unsigned m, const unsigned *ids, uint32_t n)
{
    uint8_t key[THAW_KEY_BYTES], *kv;
    size_t size;
    int r;

    kv = man_kv(ids, n, &size);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{kv, size}, {NULL, 0}, {NULL, 0}};
    key_make(key, 1000 + m);
    r = thaw_disk_cache_store(c, key, 100, parts, NULL, 0);
    free(kv);
    return r;
}

static int has_file(const struct fx *f, unsigned n, const char *ext)
{
    uint8_t key[THAW_KEY_BYTES];
    char hex[2 * THAW_KEY_BYTES + 1], path[PATH_MAX];
    struct stat st;

    key_make(key, n);
    thaw_hex(key, THAW_KEY_BYTES, hex);
    snprintf(path, sizeof path, "%s/%s%s", f->dir, hex, ext);
    return stat(path, &st) == 0;
}

/* Committed on disk (its .idx), without touching it the way contains() does. */
static int has_block(const struct fx *f, unsigned n)
{
    return has_file(f, n, ".idx");
}

static int has_man(const struct fx *f, unsigned m)
{
    return has_file(f, 1000 + m, ".idx");
}

/* The entry reads back, checksums and all. */
static int lookup_ok(struct fx *f, unsigned n)
{
    uint8_t key[THAW_KEY_BYTES];
    struct thaw_disk_entry *e = NULL; /* a miss leaves it untouched */
    int r;

    key_make(key, n);
    r = thaw_disk_cache_lookup(f->c, key, &e);
    thaw_disk_entry_release(e);
    return r == 0;
}

static struct thaw_disk_cache_stats stats(struct thaw_disk_cache *c)
{
    struct thaw_disk_cache_stats s;

    thaw_disk_cache_get_stats(c, &s);
    return s;
}

/* No temporaries, and no part file without its .idx (invariant 4). */
static void assert_dir_clean(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[PATH_MAX];
    struct stat st;

    assert_non_null(d);
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);

        if (len > 4 && !strcmp(de->d_name + len - 4, ".tmp"))
            fail_msg("leftover %s", de->d_name);
        if (len == 64 + 3 && !strcmp(de->d_name + 64, ".kv")) {
            snprintf(p, sizeof p, "%s/%.64s.idx", dir, de->d_name);
            if (stat(p, &st) != 0)
                fail_msg("%s without its .idx", de->d_name);
        }
    }
    closedir(d);
}

/* Conversations A = {0, 1}, B = {0, 2}: block 0 is shared. */
static const unsigned ids_a[] = {0, 1}, ids_b[] = {0, 2}, ids_c[] = {0, 3};

static void store_ab(struct fx *f)
{
    f->now++;
    assert_int_equal(store_block(f->c, 0), 0);
    assert_int_equal(store_block(f->c, 1), 0);
    assert_int_equal(store_man(f->c, 0, ids_a, 2), 0);
    f->now++;
    assert_int_equal(store_block(f->c, 2), 0);
    assert_int_equal(store_man(f->c, 1, ids_b, 2), 0);
}

/* ---- eviction ----------------------------------------------------------- */

/* Over budget, LRU takes the least recently used manifest and the blocks
 * only it named; a block another manifest names stays although it is the
 * oldest file. Blocks count in the bytes. The same after a restart with a
 * smaller budget: the refcounts come back from the .idx records. */
static void test_lru_evicts_manifest_then_its_blocks(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint64_t two = 3 * block_bytes() + 2 * man_bytes(2); /* A and B: blocks 0, 1, 2 */

    /* C pushes it over by one byte: evicting A alone is enough, and A's own
     * block goes too although it is young (no grace after a pass over budget) */
    p.max_bytes = two + block_bytes() + man_bytes(2) - 1;
    p.block_grace_s = GRACE;
    fx_open_p(f, &p);
    store_ab(f);
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_int_equal(stats(f->c).bytes, two);
    assert_int_equal(stats(f->c).blocks, 3);
    assert_int_equal(stats(f->c).blocks_unreferenced, 0);
    f->now++;
    assert_int_equal(store_block(f->c, 3), 0);
    assert_int_equal(store_man(f->c, 2, ids_c, 2), 0);
    assert_int_equal(thaw_disk_cache_evict(f->c), 2); /* A, then block 1 */
    assert_false(has_man(f, 0));
    assert_false(has_block(f, 1));
    assert_true(has_block(f, 0)); /* B and C name it */
    assert_true(has_block(f, 2) && has_block(f, 3) && has_man(f, 1) && has_man(f, 2));
    assert_int_equal(stats(f->c).evictions_lru, 1);
    assert_int_equal(stats(f->c).blocks_collected, 1);
    assert_int_equal(stats(f->c).block_bytes_collected, block_bytes());
    assert_int_equal(stats(f->c).bytes, two);
    assert_true(stats(f->c).bytes <= p.max_bytes);

    /* Restart with room for one conversation: B (older) goes with block 2,
     * block 0 stays for C. */
    fx_close(f);
    p.max_bytes = 2 * block_bytes() + man_bytes(2);
    fx_open_p(f, &p);
    assert_int_equal(stats(f->c).blocks_unreferenced, 0);
    assert_int_equal(thaw_disk_cache_evict(f->c), 2);
    assert_false(has_man(f, 1) || has_block(f, 2));
    assert_true(has_man(f, 2) && has_block(f, 0) && has_block(f, 3));
    assert_true(lookup_ok(f, 1002) && lookup_ok(f, 0) && lookup_ok(f, 3));
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
}

/* TTL counts from a manifest's last use; blocks have none of their own:
 * block 0, written first, lives as long as a manifest names it. The grace
 * of an unnamed block is cut to the TTL: an expired conversation's blocks
 * go with it, they do not wait out the grace (and serve it as a prefix). */
static void test_ttl_evicts_manifest_then_its_blocks(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    int64_t t0 = f->now;

    p.ttl_s = 100;
    p.block_grace_s = GRACE;
    fx_open_p(f, &p);
    store_ab(f); /* A at t0+1, B at t0+2 */
    f->now = t0 + 101;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    f->now = t0 + 102; /* A is 101 s old */
    assert_int_equal(thaw_disk_cache_evict(f->c), 2);
    assert_false(has_man(f, 0) || has_block(f, 1));
    assert_true(has_man(f, 1) && has_block(f, 0) && has_block(f, 2));
    assert_int_equal(stats(f->c).evictions_ttl, 1);
    /* B used at t0+102 (a restore): lives on, and so do its blocks */
    assert_true(lookup_ok(f, 1001));
    f->now = t0 + 150;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    f->now = t0 + 203;
    assert_int_equal(thaw_disk_cache_evict(f->c), 3);
    assert_int_equal(stats(f->c).entries, 0);
    assert_int_equal(stats(f->c).blocks_collected, 3);
}

/* A corrupt block is removed by its lookup (the caller then misses every
 * manifest naming it); the manifests stay the caller's to judge, and once
 * they go, what they named goes too. */
static void test_corrupt_block_removed(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t key[THAW_KEY_BYTES];
    char hex[65], path[PATH_MAX];
    struct thaw_disk_entry *e;
    int fd;

    fx_open_p(f, &p);
    store_ab(f);
    key_make(key, 0);
    thaw_hex(key, THAW_KEY_BYTES, hex);
    snprintf(path, sizeof path, "%s/%s.kv", f->dir, hex);
    fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "x", 1, 500), 1);
    close(fd);
    assert_int_equal(thaw_disk_cache_lookup(f->c, key, &e), THAW_ECORRUPT);
    assert_false(has_block(f, 0) || has_file(f, 0, ".kv"));
    assert_int_equal(stats(f->c).corrupt_removed, 1);
    assert_int_equal(thaw_disk_cache_lookup(f->c, key, &e), THAW_ENOTFOUND);
    /* what the caller does with a manifest whose block is gone */
    key_make(key, 1000);
    assert_int_equal(thaw_disk_cache_remove(f->c, key), 0);
    key_make(key, 1001);
    assert_int_equal(thaw_disk_cache_remove(f->c, key), 0);
    assert_int_equal(thaw_disk_cache_evict(f->c), 2); /* blocks 1 and 2 */
    assert_int_equal(stats(f->c).entries, 0);
    assert_dir_clean(f->dir);
}

static int referrers_cb(void *ud, const struct thaw_disk_entry_info *info)
{
    uint32_t *out = ud;
    uint8_t key[THAW_KEY_BYTES];

    for (unsigned n = 0; n < 4; n++) {
        key_make(key, n);
        if (!memcmp(key, info->key, THAW_KEY_BYTES)) {
            assert_true(info->is_block);
            out[n] = info->referrers;
        }
    }
    if (!info->is_block)
        assert_int_equal(info->n_refs, 2);
    return 0;
}

/* A restart rebuilds who names what: listing, then a removal collects only
 * the block nobody else names. */
static void test_reopen_rebuilds_refcounts(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint32_t refs[4] = {9, 9, 9, 9};
    uint8_t key[THAW_KEY_BYTES];

    fx_open_p(f, &p);
    store_ab(f);
    fx_close(f);
    fx_open_p(f, &p);
    assert_int_equal(stats(f->c).entries, 5);
    assert_int_equal(stats(f->c).blocks, 3);
    assert_int_equal(stats(f->c).block_bytes, 3 * block_bytes());
    assert_int_equal(thaw_disk_cache_foreach(f->c, referrers_cb, refs), 0);
    assert_int_equal(refs[0], 2);
    assert_int_equal(refs[1], 1);
    assert_int_equal(refs[2], 1);
    assert_int_equal(refs[3], 9); /* never stored */
    key_make(key, 1000);
    assert_int_equal(thaw_disk_cache_remove(f->c, key), 0);
    assert_int_equal(stats(f->c).blocks_unreferenced, 1);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_false(has_block(f, 1));
    assert_true(has_block(f, 0) && has_block(f, 2) && lookup_ok(f, 0));
}

/* ---- in progress -------------------------------------------------------- */

/* A vfs that holds the creation of one key's temporaries (those ending in
 * ext, if set: one of them) at a gate: the writer stops inside that store
 * while the test looks at the index. Changing ext lets a held writer on
 * to the next temporary that matches. */
struct gate {
    struct thaw_vfs vfs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char hex[65];
    const char *ext; /* NULL: any .tmp */
    int closed, waiting;
    int arrived; /* times a temporary was held */
};

static int gate_holds(const struct gate *g, const char *path)
{
    return g->closed && strstr(path, g->ext ? g->ext : ".tmp");
}

static int gate_open(const struct thaw_vfs *v, const char *path, int flags, mode_t mode)
{
    struct gate *g = (struct gate *)v;

    if ((flags & O_CREAT) && strstr(path, g->hex)) {
        pthread_mutex_lock(&g->mu);
        if (gate_holds(g, path)) {
            g->waiting++;
            g->arrived++;
            pthread_cond_broadcast(&g->cv);
            while (gate_holds(g, path))
                pthread_cond_wait(&g->cv, &g->mu);
            g->waiting--;
        }
        pthread_mutex_unlock(&g->mu);
    }
    return thaw_vfs_default()->open(thaw_vfs_default(), path, flags, mode);
}

/* Until the gate has held a temporary n times. */
static void gate_wait_arrived(struct gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->arrived < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_set(struct gate *g, int closed)
{
    pthread_mutex_lock(&g->mu);
    g->closed = closed;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static int submit_man(struct thaw_disk_cache *c, unsigned m, const unsigned *ids, uint32_t n)
{
    uint8_t key[THAW_KEY_BYTES], *kv;
    size_t size;
    int r;

    kv = man_kv(ids, n, &size);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{thaw_blob_alloc(size), size}, {NULL, 0}, {NULL, 0}};
    memcpy(parts[0].data, kv, size);
    free(kv);
    key_make(key, 1000 + m);
    r = thaw_disk_cache_submit(c, key, 100, parts, NULL, 0);
    if (r)
        thaw_blob_unref(parts[0].data);
    return r;
}

/* Blocks commit before their manifest. While the manifest waits in the
 * writer's queue (here behind another store held at a gate), it names them:
 * not collected, even with no grace and a budget they exceed. */
static void test_queued_manifest_keeps_its_blocks(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct gate g; /* outlives a failed assertion: teardown closes */
    static const unsigned ids_x[] = {7};
    uint8_t key[THAW_KEY_BYTES];

    g.vfs = *thaw_vfs_default();
    g.vfs.open = gate_open;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    key_make(key, 1009);
    thaw_hex(key, THAW_KEY_BYTES, g.hex);
    g.closed = 1;
    p.vfs = &g.vfs;
    p.max_bytes = block_bytes() + 1; /* one entry fits, two blocks are over budget */
    fx_open_p(f, &p);
    assert_int_equal(submit_man(f->c, 9, ids_x, 1), 0); /* held at the gate: the writer is busy */
    pthread_mutex_lock(&g.mu);
    while (!g.waiting)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    /* Results are only looked at once the gate is open: a failed assertion
     * must not leave the writer held (close waits for it). */
    int r[5], kept, unref, kept5;
    r[0] = store_block(f->c, 0);
    r[1] = store_block(f->c, 1);
    r[2] = submit_man(f->c, 0, ids_a, 2); /* waiting behind manifest 9 */
    r[3] = thaw_disk_cache_evict(f->c);
    kept = has_block(f, 0) && has_block(f, 1);
    unref = (int)stats(f->c).blocks_unreferenced;
    /* a block no queued store names goes at once (grace 0) */
    (void)store_block(f->c, 5);
    r[4] = thaw_disk_cache_evict(f->c);
    kept5 = has_block(f, 5);
    gate_set(&g, 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], 0);
    assert_int_equal(r[3], 0);
    assert_true(kept);
    assert_int_equal(unref, 0);
    assert_int_equal(r[4], 1);
    assert_false(kept5);
    /* committed, then evicted by the writer's own pass (over budget): each
     * manifest with its blocks, and nothing is left that nothing names */
    assert_int_equal(stats(f->c).entries, 0);
    assert_int_equal(stats(f->c).blocks_unreferenced, 0);
    assert_dir_clean(f->dir);
}

/* The grace: unnamed blocks (written before their manifest, fetched for a
 * prefix; here, for 599 s) survive a pass within budget; contains()
 * (a store that skips a block it finds present) restarts it; blocks that
 * never get a manifest (a crash between) go one grace after their last use
 * — after a restart, counted from the .idx's mtime. Over budget there is
 * no grace: a store in progress holds its blocks (thaw_disk_cache_hold),
 * and the blocks of a conversation just evicted must not cost the next
 * conversation its place. */
static void test_grace_keeps_store_in_progress(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t key[THAW_KEY_BYTES];
    int64_t t0 = f->now, t1;
    static const unsigned ids_d[] = {5, 6};

    p.block_grace_s = GRACE;
    fx_open_p(f, &p);
    assert_int_equal(store_block(f->c, 0), 0);
    assert_int_equal(store_block(f->c, 1), 0);
    f->now = t0 + GRACE - 1;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_int_equal(stats(f->c).blocks_unreferenced, 2);
    key_make(key, 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, key), 1); /* found present: about to be named */
    f->now = t0 + GRACE;
    assert_int_equal(thaw_disk_cache_evict(f->c), 1); /* block 1 */
    assert_false(has_block(f, 1));
    assert_true(has_block(f, 0));
    f->now = t0 + 2 * GRACE - 2; /* block 0 was found present at t0 + GRACE - 1 */
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    fx_close(f);

    /* crash leftovers: reopened, an unnamed block's grace runs from its
     * .idx mtime (t0 here: the in-memory touch is gone with the process) */
    f->now = t0 + GRACE - 1;
    fx_open_p(f, &p);
    assert_int_equal(store_block(f->c, 3), 0); /* at t0 + GRACE - 1 */
    assert_int_equal(stats(f->c).blocks_unreferenced, 2);
    f->now = t0 + GRACE;
    assert_int_equal(thaw_disk_cache_evict(f->c), 1); /* block 0, not 3 */
    assert_false(has_block(f, 0));
    assert_true(has_block(f, 3));
    f->now = t0 + 2 * GRACE - 1;
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(stats(f->c).entries, 0);
    assert_int_equal(stats(f->c).blocks_collected, 2);
    fx_close(f);

    /* Over budget the grace is off: what nothing names or holds goes at
     * once, before any conversation; a store's held blocks stay. */
    static const unsigned ids_e[] = {5};
    p.max_bytes = 2 * block_bytes() + man_bytes(2) + man_bytes(1); /* D = {5, 6}, E = {5} */
    t1 = f->now = t0 + 10 * GRACE;
    fx_open_p(f, &p);
    assert_int_equal(store_block(f->c, 5), 0);
    assert_int_equal(store_block(f->c, 6), 0);
    assert_int_equal(store_man(f->c, 3, ids_d, 2), 0);
    f->now = t1 + 1;
    assert_int_equal(store_man(f->c, 4, ids_e, 1), 0);
    assert_int_equal(thaw_disk_cache_evict(f->c), 0); /* at the budget, not over */
    key_make(key, 7);
    thaw_disk_cache_hold(f->c, key, 1);               /* a store in progress: block 7, its manifest to come */
    assert_int_equal(store_block(f->c, 7), 0);        /* over budget now */
    assert_int_equal(thaw_disk_cache_evict(f->c), 2); /* D, the LRU, then block 6; 7 is held */
    assert_true(has_block(f, 7) && has_man(f, 4) && has_block(f, 5));
    assert_false(has_man(f, 3) || has_block(f, 6));
    thaw_disk_cache_unhold(f->c, key, 1);             /* the store gave up */
    assert_int_equal(store_block(f->c, 8), 0);        /* nothing names it either */
    assert_int_equal(thaw_disk_cache_evict(f->c), 2); /* blocks 7 and 8, long before their grace; E stays */
    assert_false(has_block(f, 7) || has_block(f, 8));
    assert_true(has_man(f, 4) && has_block(f, 5));
    assert_true(stats(f->c).bytes <= p.max_bytes);
}

/* ---- crashes ------------------------------------------------------------ */

/* Blocks 0, 1, then manifest A naming them: the way the writer runs one
 * conversation's store. */
static void store_conversation(struct thaw_disk_cache *c)
{
    (void)store_block(c, 0);
    (void)store_block(c, 1);
    (void)store_man(c, 0, ids_a, 2);
}

static unsigned long count_calls(struct fx *f, void (*run)(struct fx *f, struct thaw_disk_cache *c),
                                 const struct thaw_disk_cache_params *base)
{
    struct thaw_disk_cache_params p = *base;
    struct thaw_vfs_fault *ft;
    unsigned long n;

    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    run(f, f->c);
    n = thaw_vfs_fault_calls(ft, THAW_VFS_ANY);
    fx_close(f);
    thaw_vfs_fault_free(ft);
    return n;
}

/* Runs run() in a child that crashes at its nth system call. */
static void crash_at(struct fx *f, void (*run)(struct fx *f, struct thaw_disk_cache *c),
                     const struct thaw_disk_cache_params *base, unsigned long n)
{
    pid_t pid;
    int status;

    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct thaw_disk_cache_params p = *base;
        struct thaw_vfs_fault *ft;

        if (thaw_vfs_fault_new(NULL, &ft))
            _exit(2);
        p.vfs = thaw_vfs_fault_vfs(ft);
        if (thaw_disk_cache_open(&p, &f->c))
            _exit(3);
        thaw_vfs_fault_arm(ft, THAW_VFS_ANY, n, THAW_VFS_CRASH, 0);
        run(f, f->c);
        _exit(4); /* the crash never came */
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 137);
}

static void run_store(struct fx *f, struct thaw_disk_cache *c)
{
    (void)f;
    store_conversation(c);
}

/* A crash at every system call of a conversation's store: it opens clean;
 * a manifest that committed has every block, readable; the commit is the
 * manifest's .idx rename (late); and after one pass nothing unnamed is
 * left (the blocks of a store that never committed its manifest). */
static void test_crash_store_blocks_then_manifest(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    unsigned long n_calls = count_calls(f, run_store, &p), first_hit = 0;

    assert_true(n_calls >= 60);
    for (unsigned long n = 1; n <= n_calls; n++) {
        empty_dir(f->dir);
        crash_at(f, run_store, &p, n);
        fx_open_p(f, &p);
        assert_dir_clean(f->dir);
        if (has_man(f, 0)) {
            if (!has_block(f, 0) || !has_block(f, 1))
                fail_msg("crash at call %lu: a manifest names a missing block", n);
            assert_true(lookup_ok(f, 1000) && lookup_ok(f, 0) && lookup_ok(f, 1));
            if (!first_hit)
                first_hit = n;
        } else if (first_hit) {
            fail_msg("crash at call %lu: manifest lost after its commit at %lu", n, first_hit);
        }
        assert_int_equal(stats(f->c).corrupt_removed, 0);
        (void)thaw_disk_cache_evict(f->c);
        if (has_man(f, 0))
            assert_int_equal(stats(f->c).entries, 3);
        else
            assert_int_equal(stats(f->c).entries, 0); /* no block outlives its store */
        assert_dir_clean(f->dir);
        fx_close(f);
    }
    /* only the directory fsync (open, fsync, close) follows the commit */
    assert_int_equal(first_hit, n_calls - 2);
}

static void run_evict(struct fx *f, struct thaw_disk_cache *c)
{
    (void)f;
    (void)thaw_disk_cache_evict(c);
}

/* A crash at every system call of an eviction that takes A and collects
 * block 1: B and its blocks are untouched; A either stays whole or goes,
 * and a block it left behind is collected by the next pass; never a
 * manifest without its blocks. */
static void test_crash_evict_and_collect(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f), tight;
    unsigned long n_calls;

    tight = p;
    tight.max_bytes = 3 * block_bytes() + 2 * man_bytes(2) - 1;
    fx_open_p(f, &p);
    store_ab(f);
    fx_close(f);
    n_calls = count_calls(f, run_evict, &tight);
    assert_true(n_calls >= 6); /* two entries' .idx and parts, and no more */
    for (unsigned long n = 1; n <= n_calls; n++) {
        empty_dir(f->dir);
        fx_open_p(f, &p);
        store_ab(f);
        fx_close(f);
        crash_at(f, run_evict, &tight, n);
        fx_open_p(f, &p);
        assert_dir_clean(f->dir);
        assert_true(lookup_ok(f, 1001) && lookup_ok(f, 0) && lookup_ok(f, 2));
        if (has_man(f, 0) && !has_block(f, 1))
            fail_msg("crash at call %lu: block collected before its manifest went", n);
        if (has_man(f, 0))
            assert_true(lookup_ok(f, 1000) && lookup_ok(f, 1));
        (void)thaw_disk_cache_evict(f->c);
        assert_int_equal(has_block(f, 1), has_man(f, 0)); /* nothing unnamed is left */
        assert_int_equal(stats(f->c).blocks_unreferenced, 0);
        fx_close(f);
    }
}

/* ---- group commit ------------------------------------------------------- */

/* What the writer takes as one group: everything submitted while it is
 * paused (thaw_disk_cache_pause), committed at the flush. */
/* unsynced: thaw_disk_cache_submit_unsynced (a block ahead of its manifest) */
static int submit_blob_as(struct thaw_disk_cache *c, unsigned key_n, const uint8_t *kv, size_t size,
                          uint32_t n_tokens, int unsynced)
{
    uint8_t key[THAW_KEY_BYTES];
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{thaw_blob_alloc(size), size}, {NULL, 0}, {NULL, 0}};
    int r;

    assert_non_null(parts[0].data);
    memcpy(parts[0].data, kv, size);
    key_make(key, key_n);
    r = unsynced ? thaw_disk_cache_submit_unsynced(c, key, n_tokens, parts)
                 : thaw_disk_cache_submit(c, key, n_tokens, parts, NULL, 0);
    if (r)
        thaw_blob_unref(parts[0].data);
    return r;
}

static int submit_blob(struct thaw_disk_cache *c, unsigned key_n, const uint8_t *kv, size_t size, uint32_t n_tokens)
{
    return submit_blob_as(c, key_n, kv, size, n_tokens, 0);
}

/* unsynced: as a block written ahead of its manifest */
static int submit_block_as(struct thaw_disk_cache *c, unsigned n, int unsynced)
{
    uint8_t *kv = block_kv(n);
    int r = submit_blob_as(c, n, kv, BLOCK_SIZE, 32, unsynced);

    free(kv);
    return r;
}

static int submit_block(struct thaw_disk_cache *c, unsigned n)
{
    return submit_block_as(c, n, 0);
}

/* A whole state (a root naming nothing): 'W' and bytes of seed. Keyed
 * 2000 + n. */
static uint8_t *whole_kv(unsigned seed)
{
    uint8_t *b = block_kv(seed + 100);

    b[0] = 'W';
    return b;
}

static int submit_whole(struct thaw_disk_cache *c, unsigned n, unsigned seed)
{
    uint8_t *kv = whole_kv(seed);
    int r = submit_blob(c, 2000 + n, kv, BLOCK_SIZE, 50);

    free(kv);
    return r;
}

static int store_whole(struct thaw_disk_cache *c, unsigned n, unsigned seed)
{
    uint8_t key[THAW_KEY_BYTES], *kv = whole_kv(seed);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{kv, BLOCK_SIZE}, {NULL, 0}, {NULL, 0}};
    int r;

    key_make(key, 2000 + n);
    r = thaw_disk_cache_store(c, key, 50, parts, NULL, 0);
    free(kv);
    return r;
}

/* Which seed the whole state 2000 + n holds: the seed, 0 for a miss, -1 for
 * anything else. */
static int whole_seed(struct fx *f, unsigned n, unsigned seed_a, unsigned seed_b)
{
    uint8_t key[THAW_KEY_BYTES], *a = whole_kv(seed_a), *b = whole_kv(seed_b);
    struct thaw_disk_entry *e;
    const void *kv;
    size_t size;
    int r;

    key_make(key, 2000 + n);
    if (thaw_disk_cache_lookup(f->c, key, &e) != 0) {
        r = 0;
        goto out;
    }
    kv = thaw_disk_entry_part(e, THAW_PART_KV, &size);
    r = size != BLOCK_SIZE ? -1 : !memcmp(kv, a, size) ? (int)seed_a : !memcmp(kv, b, size) ? (int)seed_b : -1;
    thaw_disk_entry_release(e);
out:
    free(a);
    free(b);
    return r;
}

/* Two conversations and a whole state replacing an older one, in one
 * group: A = blocks {0, 1} + manifest 0, B = block 2 + manifest 1 naming
 * {0, 2} (block 0 still queued: blocks.c does not submit it twice), and
 * whole state 0 at seed 2 over the seed 1 already on disk. */
static const unsigned ids_g[] = {0, 2};

static void submit_group(struct thaw_disk_cache *c)
{
    thaw_disk_cache_pause(c, 1);
    (void)submit_block(c, 0);
    (void)submit_block(c, 1);
    (void)submit_man(c, 0, ids_a, 2);
    (void)submit_block(c, 2);
    (void)submit_man(c, 1, ids_g, 2);
    (void)submit_whole(c, 0, 2);
    thaw_disk_cache_flush(c); /* ends the pause: one group of six */
}

static void run_group(struct fx *f, struct thaw_disk_cache *c)
{
    (void)f;
    submit_group(c);
}

/* A crash at every system call of the writer's group commit: the directory
 * opens clean; no root of the group is committed before every block of it
 * is (the blocks' .idx and the sync that covers them come first: invariant 7),
 * so a committed manifest always has its blocks; the replaced whole state
 * is the old one up to its .idx unlink, then nothing, then the new one
 * (invariant 3); a commit is never lost at a later point; the last commit
 * is the last .idx rename (only the group's last syncfs follows); and after
 * one pass no block is left that nothing names. */
static void test_crash_group_commit(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    unsigned long n_calls, first_new = 0, last_old = 0, first_all = 0;
    unsigned long first_man[2] = {0, 0};

    fx_open_p(f, &p);
    assert_int_equal(store_whole(f->c, 0, 1), 0);
    fx_close(f);
    n_calls = count_calls(f, run_group, &p);
    assert_true(n_calls >= 40);
    for (unsigned long n = 1; n <= n_calls; n++) {
        int man[2], blocks, w;

        empty_dir(f->dir);
        fx_open_p(f, &p);
        assert_int_equal(store_whole(f->c, 0, 1), 0);
        fx_close(f);
        crash_at(f, run_group, &p, n);
        fx_open_p(f, &p);
        assert_dir_clean(f->dir);
        blocks = has_block(f, 0) + has_block(f, 1) + has_block(f, 2);
        for (int m = 0; m < 2; m++) {
            man[m] = has_man(f, (unsigned)m);
            if (man[m] && !first_man[m])
                first_man[m] = n;
            if (!man[m] && first_man[m])
                fail_msg("crash at call %lu: manifest %d lost after its commit at %lu", n, m, first_man[m]);
        }
        w = whole_seed(f, 0, 1, 2);
        if (w < 0)
            fail_msg("crash at call %lu: the whole state is neither the old one nor the new one", n);
        if (w == 1) {
            if (last_old + 1 != n)
                fail_msg("crash at call %lu: the old whole state is back after its .idx went", n);
            last_old = n;
        }
        if (w == 2 && !first_new)
            first_new = n;
        if (w != 2 && first_new)
            fail_msg("crash at call %lu: the new whole state lost after its commit at %lu", n, first_new);
        if ((man[0] || man[1] || w == 2) && blocks != 3)
            fail_msg("crash at call %lu: a root committed before every block of its group", n);
        if (man[0])
            assert_true(lookup_ok(f, 1000) && lookup_ok(f, 0) && lookup_ok(f, 1));
        if (man[1])
            assert_true(lookup_ok(f, 1001) && lookup_ok(f, 0) && lookup_ok(f, 2));
        if (man[0] && man[1] && w == 2 && !first_all)
            first_all = n;
        assert_int_equal(stats(f->c).corrupt_removed, 0);
        (void)thaw_disk_cache_evict(f->c);
        /* no block outlives its store: what nothing names is collected */
        assert_int_equal(stats(f->c).blocks_unreferenced, 0);
        assert_int_equal(has_block(f, 1), man[0]);
        assert_int_equal(has_block(f, 2), man[1]);
        assert_int_equal(has_block(f, 0), man[0] || man[1]);
        /* roots, and blocks: 1 and 2 with their manifest, 0 with either */
        assert_int_equal(stats(f->c).entries,
                         (uint64_t)(man[0] + man[1] + (w != 0) + man[0] + man[1] + (man[0] || man[1])));
        assert_dir_clean(f->dir);
        fx_close(f);
    }
    assert_true(last_old >= 1); /* the store began with the old .idx's unlink, not before */
    assert_true(first_new > last_old + 1);
    assert_true(first_man[0] && first_man[1]);
    /* only the group's last sync (syncfs, close) follows the last commit */
    assert_int_equal(first_all, n_calls - 1);
}

/* syncs of one group of N blocks and their manifest (one part each): two
 * syncfs (after the parts and the blocks' .idx, after the manifest's .idx)
 * whatever N, where per-file fsyncs took 2(N+1) + 3 and one store at a time
 * 4(N+1). Counted by the vfs (syncfs as fsync) and in the stats
 * (thaw_kv_disk_fsyncs_total). */
static void test_group_fsyncs(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    enum { N = 7 };
    static const unsigned ids[N] = {0, 1, 2, 3, 4, 5, 6};
    struct thaw_vfs_fault *ft;
    uint64_t before;

    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);
    before = stats(f->c).fsyncs;
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    thaw_disk_cache_pause(f->c, 1);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(submit_block(f->c, ids[i]), 0);
    assert_int_equal(submit_man(f->c, 0, ids, N), 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).stores_ok, N + 1);
    assert_int_equal(thaw_vfs_fault_calls(ft, THAW_VFS_FSYNC), 2);
    assert_int_equal(stats(f->c).fsyncs - before, 2);
    assert_true(lookup_ok(f, 1000) && lookup_ok(f, 0) && lookup_ok(f, N - 1));

    /* the synchronous store alone still costs four fsyncs; a group of one
     * block one sync, of one root two */
    before = stats(f->c).fsyncs;
    assert_int_equal(store_block(f->c, 20), 0);
    assert_int_equal(stats(f->c).fsyncs - before, 4);
    before = stats(f->c).fsyncs;
    assert_int_equal(submit_block(f->c, 21), 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).fsyncs - before, 1);
    before = stats(f->c).fsyncs;
    assert_int_equal(submit_man(f->c, 1, ids, 2), 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).fsyncs - before, 2);
    fx_close(f);
    thaw_vfs_fault_free(ft);
}

/* One failure inside a group of blocks 0, 1, 2 and manifest 0 naming them,
 * then how the group ends. */
struct group_fault {
    const char *what;
    enum thaw_vfs_op op;
    unsigned long nth;
    int err;
    int ok, failed;      /* the group's stores that commit / fail */
    int enospc;          /* entries evicted for room */
    int lost;            /* the store that fails: 1 = block 1, 1000 = the manifest, -1 none */
    unsigned long syncs; /* fsyncs and syncfs of the whole group, retries included */
};

/* Four entries of one part: writes 1-4 are the parts (B0 B1 B2 M), 5-7 the
 * blocks' .idx, 8 the manifest's; sync 1 (a syncfs) covers the parts and
 * the blocks' .idx, sync 2 the manifest's .idx; open 1 is the directory
 * the syncs go through. A store by itself takes 4 fsyncs. */
static const struct group_fault group_faults[] = {
    /* block 1's .kv: it fails alone, the rest commit (its manifest names a
     * missing block: the caller's miss, invariant 7) */
    {"EIO writing a block", THAW_VFS_WRITE, 2, -EIO, 3, 1, 0, 1, 2},
    /* disk full at block 1's .kv: it is scrubbed, then stored by itself
     * after the other blocks' commit, once an old root made room */
    {"ENOSPC writing a block", THAW_VFS_WRITE, 2, -ENOSPC, 4, 0, 1, -1, 2 + 4},
    /* the manifest's .idx: blocks committed, the manifest fails alone */
    {"EIO writing the manifest's .idx", THAW_VFS_WRITE, 8, -EIO, 3, 1, 0, 1000, 1},
    /* the sync after the parts and the blocks' .idx: every job by itself */
    {"EIO syncing the parts and the blocks' .idx", THAW_VFS_FSYNC, 1, -EIO, 4, 0, 0, -1, 1 + 4 * 4},
    /* after the manifest's .idx: the blocks committed, the manifest by itself */
    {"EIO syncing the manifest's .idx", THAW_VFS_FSYNC, 2, -EIO, 4, 0, 0, -1, 2 + 4},
    /* no directory to sync through: every job by itself, with its fsyncs */
    {"EIO opening the directory for the syncs", THAW_VFS_OPEN, 1, -EIO, 4, 0, 0, -1, 4 * 4},
};

static void test_group_errors(void **state)
{
    struct fx *f = *state;
    static const unsigned ids[] = {0, 1, 2};

    for (size_t t = 0; t < sizeof group_faults / sizeof *group_faults; t++) {
        const struct group_fault *g = &group_faults[t];
        struct thaw_disk_cache_params p = fx_params(f);
        struct thaw_disk_cache_stats st;
        struct thaw_vfs_fault *ft;

        print_message("  %s\n", g->what);
        empty_dir(f->dir);
        assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
        p.vfs = thaw_vfs_fault_vfs(ft);
        fx_open_p(f, &p);
        assert_int_equal(store_whole(f->c, 9, 1), 0); /* the LRU root a full disk costs */
        thaw_disk_cache_pause(f->c, 1);
        for (int i = 0; i < 3; i++)
            assert_int_equal(submit_block(f->c, ids[i]), 0);
        assert_int_equal(submit_man(f->c, 0, ids, 3), 0);
        thaw_vfs_fault_arm(ft, g->op, g->nth, THAW_VFS_FAIL_ONCE, g->err);
        thaw_disk_cache_flush(f->c);
        assert_int_equal(thaw_vfs_fault_fired(ft), 1);
        assert_int_equal(thaw_vfs_fault_calls(ft, THAW_VFS_FSYNC), g->syncs);
        st = stats(f->c);
        thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
        assert_int_equal(st.stores_ok, 1 + g->ok);
        assert_int_equal(st.store_failures, g->failed);
        assert_int_equal(st.evictions_enospc, g->enospc);
        assert_int_equal(st.queue_len, 0);
        assert_int_equal(st.queue_bytes, 0);
        assert_int_equal(has_file(f, 2009, ".idx"), !g->enospc);
        for (unsigned n = 0; n < 3; n++)
            assert_int_equal(lookup_ok(f, n), g->lost != (int)n);
        assert_int_equal(lookup_ok(f, 1000), g->lost != 1000);
        if (g->lost >= 0) /* scrubbed: .idx, parts, temporaries */
            for (int e = 0; e < 2; e++)
                assert_false(has_file(f, (unsigned)g->lost, e ? ".kv" : ".idx"));
        assert_dir_clean(f->dir);
        /* a failed manifest leaves its blocks unnamed: collected */
        (void)thaw_disk_cache_evict(f->c);
        assert_int_equal(stats(f->c).blocks_unreferenced, 0);
        assert_int_equal(stats(f->c).blocks, g->lost == 1000 ? 0 : g->lost >= 0 ? 2 : 3);
        fx_close(f);
        /* what committed survives a restart, with nothing to sweep */
        fx_open_p(f, &p);
        assert_int_equal(stats(f->c).swept_files, 0);
        assert_int_equal(lookup_ok(f, 1000), g->lost != 1000);
        fx_close(f);
        thaw_vfs_fault_free(ft);
    }
}

/* Every store of the group being written stays findable until it is
 * committed or failed — pending() and queued() have its bytes, lookups
 * miss (busy) — and leaves the queue's count then, not when the group is
 * done. Held at the manifest's .kv (blocks 0 and 1 written, nothing
 * committed), then at its .idx (the blocks committed: the index has them). */
static void test_group_pending(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct gate g; /* outlives a failed assertion: teardown closes */
    struct thaw_part_blob got[2][3][THAW_PART_COUNT];
    struct thaw_disk_cache_stats held[2];
    uint8_t key[3][THAW_KEY_BYTES], *want;
    int pend[2][3], queued[2][3], found[2][3], r[3];

    g.vfs = *thaw_vfs_default();
    g.vfs.open = gate_open;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    key_make(key[0], 0);
    key_make(key[1], 1);
    key_make(key[2], 1000);
    thaw_hex(key[2], THAW_KEY_BYTES, g.hex);
    g.ext = ".kv.tmp";
    g.closed = 1;
    p.vfs = &g.vfs;
    fx_open_p(f, &p);
    thaw_disk_cache_pause(f->c, 1);
    r[0] = submit_block(f->c, 0);
    r[1] = submit_block(f->c, 1);
    r[2] = submit_man(f->c, 0, ids_a, 2);
    thaw_disk_cache_pause(f->c, 0);
    for (int stop = 0; stop < 2; stop++) {
        gate_wait_arrived(&g, stop + 1);
        held[stop] = stats(f->c);
        for (int i = 0; i < 3; i++) {
            pend[stop][i] = thaw_disk_cache_pending(f->c, key[i], got[stop][i]);
            queued[stop][i] = thaw_disk_cache_queued(f->c, key[i]);
            found[stop][i] = lookup_ok(f, i < 2 ? (unsigned)i : 1000);
        }
        pthread_mutex_lock(&g.mu);
        g.ext = ".idx.tmp"; /* on to the manifest's .idx; the second time, open */
        g.closed = stop == 0;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
    }
    thaw_disk_cache_flush(f->c);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i], 0);
        /* at the manifest's parts: all three held, none committed */
        assert_int_equal(pend[0][i], 0);
        assert_int_equal(queued[0][i], 1);
        assert_int_equal(found[0][i], 0);
        /* at its .idx: the blocks went to the index, the manifest is held */
        assert_int_equal(pend[1][i], i < 2 ? THAW_ENOTFOUND : 0);
        assert_int_equal(queued[1][i], i == 2);
        assert_int_equal(found[1][i], i < 2);
    }
    assert_int_equal(held[0].queue_len, 3);
    assert_int_equal(held[0].queue_bytes, 2 * block_bytes() + man_bytes(2));
    assert_int_equal(held[0].stores_ok, 0);
    assert_int_equal(held[1].queue_len, 1);
    assert_int_equal(held[1].queue_bytes, man_bytes(2));
    assert_int_equal(held[1].stores_ok, 2);
    want = block_kv(1);
    assert_int_equal(got[0][1][0].size, BLOCK_SIZE);
    assert_memory_equal(got[0][1][0].data, want, BLOCK_SIZE);
    free(want);
    assert_non_null(got[1][2][0].data); /* the manifest's, still held */
    for (int stop = 0; stop < 2; stop++)
        for (int i = 0; i < 3; i++)
            for (int q = 0; q < THAW_PART_COUNT; q++)
                thaw_blob_unref(got[stop][i][q].data);
    assert_int_equal(stats(f->c).stores_ok, 3);
    assert_int_equal(stats(f->c).queue_len, 0);
    assert_int_equal(stats(f->c).queue_bytes, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(thaw_disk_cache_pending(f->c, key[i], got[0][i]), THAW_ENOTFOUND);
        assert_int_equal(thaw_disk_cache_contains(f->c, key[i]), 1);
    }
    fx_close(f);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* A store made of several submits between batch_begin() and batch_end()
 * is one group, two syncs, however long its submits take: the writer,
 * idle and awake, would otherwise take the first block at once as a group
 * of its own (one sync more). */
static void test_batch_is_one_group(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static const unsigned ids[] = {0, 1, 2};
    struct thaw_disk_cache_stats st0, st1;

    fx_open_p(f, &p);
    st0 = stats(f->c);
    thaw_disk_cache_batch_begin(f->c);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(submit_block(f->c, ids[i]), 0);
        usleep(30000); /* the writer has woken for it */
    }
    thaw_disk_cache_batch_begin(f->c); /* nested: a second engine's store */
    assert_int_equal(submit_man(f->c, 0, ids, 3), 0);
    thaw_disk_cache_batch_end(f->c);
    usleep(30000);
    assert_int_equal(stats(f->c).stores_ok, st0.stores_ok); /* still one batch open */
    thaw_disk_cache_batch_end(f->c);
    thaw_disk_cache_flush(f->c);
    st1 = stats(f->c);
    assert_int_equal(st1.stores_ok - st0.stores_ok, 4);
    assert_int_equal(st1.roots_ok - st0.roots_ok, 1); /* the manifest */
    assert_int_equal(st1.groups - st0.groups, 1);
    assert_int_equal(st1.fsyncs - st0.fsyncs, 2);
    assert_true(lookup_ok(f, 1000) && lookup_ok(f, 2));
}

/* Blocks ahead (a prompt's, while its reply is generated): a group of
 * nothing else is written without a sync, live at once; the group of the
 * manifest that names them syncs twice as any turn's, which makes them
 * durable with it. Beside a synced block they sync with it. */
static void test_blocks_ahead_skip_the_syncs(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static const unsigned ids[] = {0, 1, 2};
    struct thaw_disk_cache_stats st0, st1;

    fx_open_p(f, &p);
    st0 = stats(f->c);
    thaw_disk_cache_batch_begin(f->c);
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(submit_block_as(f->c, ids[i], 1), 0);
    thaw_disk_cache_batch_end(f->c);
    thaw_disk_cache_flush(f->c);
    st1 = stats(f->c);
    assert_int_equal(st1.stores_ok - st0.stores_ok, 3);
    assert_int_equal(st1.groups - st0.groups, 1);
    assert_int_equal(st1.groups_unsynced - st0.groups_unsynced, 1);
    assert_int_equal(st1.fsyncs - st0.fsyncs, 0);
    for (unsigned i = 0; i < 3; i++)
        assert_true(lookup_ok(f, ids[i]));

    /* the turn's store: one more block and the manifest naming all four */
    static const unsigned all[] = {0, 1, 2, 3};
    st0 = st1;
    thaw_disk_cache_batch_begin(f->c);
    assert_int_equal(submit_block(f->c, 3), 0);
    assert_int_equal(submit_man(f->c, 0, all, 4), 0);
    thaw_disk_cache_batch_end(f->c);
    thaw_disk_cache_flush(f->c);
    st1 = stats(f->c);
    assert_int_equal(st1.groups - st0.groups, 1);
    assert_int_equal(st1.groups_unsynced, st0.groups_unsynced);
    assert_int_equal(st1.fsyncs - st0.fsyncs, 2);
    assert_true(lookup_ok(f, 1000));

    /* an unsynced block in a group with a synced one: one sync for both */
    st0 = st1;
    thaw_disk_cache_pause(f->c, 1);
    assert_int_equal(submit_block_as(f->c, 4, 1), 0);
    assert_int_equal(submit_block(f->c, 5), 0);
    thaw_disk_cache_pause(f->c, 0);
    thaw_disk_cache_flush(f->c);
    st1 = stats(f->c);
    assert_int_equal(st1.groups - st0.groups, 1);
    assert_int_equal(st1.groups_unsynced, st0.groups_unsynced);
    assert_int_equal(st1.fsyncs - st0.fsyncs, 1);
    assert_true(lookup_ok(f, 4) && lookup_ok(f, 5));
}

/* A root submitted while an older store of its key still waits takes its
 * place: the older one is never written (it would be overwritten at once),
 * its blocks lose its name (the newer one's counted first, so block 0,
 * named by both, never looks unnamed), its bytes leave the queue. The
 * newest store of the key is what a lookup finds before and after. */
static void test_queued_root_superseded(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static const unsigned first[] = {0, 1}, second[] = {0, 2};
    struct thaw_part_blob got[THAW_PART_COUNT];
    struct thaw_disk_cache_stats st;
    uint8_t key[THAW_KEY_BYTES];
    size_t want_n;
    uint8_t *want;

    fx_open_p(f, &p);
    key_make(key, 1000);
    thaw_disk_cache_pause(f->c, 1);
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(submit_block(f->c, i), 0);
    assert_int_equal(submit_man(f->c, 0, first, 2), 0);
    assert_int_equal(stats(f->c).queue_len, 4);
    assert_int_equal(submit_man(f->c, 0, second, 2), 0);
    st = stats(f->c);
    assert_int_equal(st.queue_len, 4);
    assert_int_equal(st.queue_bytes, 3 * block_bytes() + man_bytes(2));
    assert_int_equal(st.stores_superseded, 1);
    want = man_kv(second, 2, &want_n);
    assert_int_equal(thaw_disk_cache_pending(f->c, key, got), 0);
    assert_int_equal(got[THAW_PART_KV].size, want_n);
    assert_memory_equal(got[THAW_PART_KV].data, want, want_n);
    for (int i = 0; i < THAW_PART_COUNT; i++)
        thaw_blob_unref(got[i].data);
    thaw_disk_cache_pause(f->c, 0);
    thaw_disk_cache_flush(f->c);
    st = stats(f->c);
    assert_int_equal(st.stores_ok, 4); /* three blocks, one manifest */
    assert_int_equal(st.queue_bytes, 0);
    assert_int_equal(st.blocks_unreferenced, 1); /* block 1: the superseded one named it alone */
    {
        struct thaw_disk_entry *e = NULL;
        size_t n = 0;
        const void *kv;

        assert_int_equal(thaw_disk_cache_lookup(f->c, key, &e), 0);
        kv = thaw_disk_entry_part(e, THAW_PART_KV, &n);
        assert_int_equal(n, want_n);
        assert_memory_equal(kv, want, want_n);
        thaw_disk_entry_release(e);
    }
    free(want);
}

/* A retention hint (a cache_control mark) keeps its blocks after the
 * roots naming them went for room or TTL: over budget, roots and other
 * blocks go first; the kept blocks go only when nothing else is left, the
 * earliest deadline first; past its deadline a hint keeps nothing. */
static void test_retention_evicted_last(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t k0[THAW_KEY_BYTES], k1[THAW_KEY_BYTES];
    int64_t t0 = f->now;

    p.max_bytes = 3 * block_bytes() + 2 * man_bytes(2); /* A and B */
    p.block_grace_s = GRACE;
    fx_open_p(f, &p);
    store_ab(f); /* A = {0, 1} at t0+1, B = {0, 2} at t0+2 */
    key_make(k1, 1);
    thaw_disk_cache_retain(f->c, k1, 1, t0 + 1000); /* A's own block, as a mark on A's prefix */
    /* C needs room: A goes (LRU) but block 1 stays, kept; B next */
    f->now++;
    assert_int_equal(store_block(f->c, 3), 0);
    assert_int_equal(store_man(f->c, 2, ids_c, 2), 0);
    (void)thaw_disk_cache_evict(f->c);
    assert_false(has_man(f, 0));
    assert_true(has_block(f, 1));
    assert_false(has_man(f, 1) || has_block(f, 2)); /* B went too: block 1 is not for room */
    assert_true(has_man(f, 2) && has_block(f, 0) && has_block(f, 3));
    assert_true(stats(f->c).bytes <= p.max_bytes);
    /* a smaller budget: C goes, then (nothing else left) the kept block */
    fx_close(f);
    p.max_bytes = block_bytes();
    fx_open_p(f, &p); /* a restart forgets the hint */
    thaw_disk_cache_retain(f->c, k1, 1, t0 + 1000);
    key_make(k0, 0);
    thaw_disk_cache_retain(f->c, k0, 1, t0 + 2000); /* block 0: a later deadline */
    (void)thaw_disk_cache_evict(f->c);
    assert_false(has_man(f, 2) || has_block(f, 3));
    assert_false(has_block(f, 1)); /* the earliest deadline went */
    assert_true(has_block(f, 0));
    assert_true(stats(f->c).bytes <= p.max_bytes);
    /* unnamed and unused for longer than its grace: kept while the hint
     * lasts, collected once it is over */
    p.max_bytes = 0;
    fx_close(f);
    fx_open_p(f, &p);
    thaw_disk_cache_retain(f->c, k0, 1, t0 + 2000);
    f->now = t0 + 1999;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_true(has_block(f, 0));
    f->now++;
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_false(has_block(f, 0));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_lru_evicts_manifest_then_its_blocks),
        T(test_ttl_evicts_manifest_then_its_blocks),
        T(test_corrupt_block_removed),
        T(test_reopen_rebuilds_refcounts),
        T(test_queued_manifest_keeps_its_blocks),
        T(test_grace_keeps_store_in_progress),
        T(test_crash_store_blocks_then_manifest),
        T(test_crash_evict_and_collect),
        T(test_crash_group_commit),
        T(test_group_fsyncs),
        T(test_group_errors),
        T(test_group_pending),
        T(test_batch_is_one_group),
        T(test_blocks_ahead_skip_the_syncs),
        T(test_queued_root_superseded),
        T(test_retention_evicted_last),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
