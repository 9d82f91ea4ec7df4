/* test_cache_disk.c — the on-disk store: round trips, corruption of every
 * file kind, crashes at every system call of a store, I/O errors, TTL and
 * LRU with a fake clock (across restarts), the writer queue, permissions,
 * the startup sweep, fingerprints, and a lookup racing stores.
 *
 * Map:
 *   ---- fixtures ----        temp dir, fake clock, data, file helpers
 *   ---- basics ----          round trip, miss, arguments, remove/list/verify
 *   ---- corruption ----      flipped bytes, truncation, garbage, parser fuzz
 *   ---- crashes / errors ---- fork + _exit at call N, injected -ENOSPC,
 *                             eviction to make room on a full disk
 *   ---- eviction ----        TTL, LRU, across reopen
 *   ---- writer ----          submit/flush, queue bounded by bytes, drops
 *                             logged, close drains
 *   ---- directory ----       permissions, sweep, fingerprint, lock,
 *                             READONLY changes nothing
 *   ---- concurrency ----     lookups racing stores of the same key
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/blob.h"
#include "base/error.h"
#include "base/log.h"
#include "base/vfs.h"
#include "cache/cache_disk.h"
#include "dir_snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- fixtures ----------------------------------------------------------- */

struct fx {
    char dir[64];
    int64_t now; /* the fake clock, Unix seconds */
    struct thaw_disk_cache *c;
    int n_log;
    char warns[8192]; /* WARN/ERROR lines since the last warns_clear(), '\n'-separated */
};

/* The writer thread logs too. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t fake_now(void *ud)
{
    return *(const int64_t *)ud;
}

static void test_log(void *ud, int level, const char *msg)
{
    struct fx *f = ud;

    __atomic_fetch_add(&f->n_log, 1, __ATOMIC_RELAXED);
    if (level <= THAW_LOG_WARN) {
        size_t len;

        pthread_mutex_lock(&log_mu);
        len = strlen(f->warns);
        snprintf(f->warns + len, sizeof f->warns - len, "%s\n", msg);
        pthread_mutex_unlock(&log_mu);
    }
    if (getenv("THAW_TEST_LOG"))
        fprintf(stderr, "  [log %d] %s\n", level, msg);
}

static void warns_clear(struct fx *f)
{
    pthread_mutex_lock(&log_mu);
    f->warns[0] = '\0';
    pthread_mutex_unlock(&log_mu);
}

/* Fails unless a WARN/ERROR line since warns_clear() contains every one of
 * the NULL-terminated substrings. */
static void assert_warned(struct fx *f, ...)
{
    char all[sizeof f->warns], copy[sizeof f->warns], *line, *save = NULL;
    int found = 0;
    va_list ap;

    pthread_mutex_lock(&log_mu);
    memcpy(all, f->warns, sizeof all);
    pthread_mutex_unlock(&log_mu);
    memcpy(copy, all, sizeof copy);
    for (line = strtok_r(copy, "\n", &save); line && !found; line = strtok_r(NULL, "\n", &save)) {
        const char *want;

        found = 1;
        va_start(ap, f);
        while ((want = va_arg(ap, const char *)))
            if (!strstr(line, want))
                found = 0;
        va_end(ap);
    }
    if (!found)
        fail_msg("no such warning; got:\n%s", all);
}

static struct thaw_disk_cache_params fx_params(struct fx *f)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();

    p.dir = f->dir;
    p.now = fake_now;
    p.now_ud = &f->now;
    p.log = test_log;
    p.log_ud = f;
    memset(p.fingerprint, 0xab, sizeof p.fingerprint);
    return p;
}

static void fx_open_p(struct fx *f, const struct thaw_disk_cache_params *p)
{
    int r = thaw_disk_cache_open(p, &f->c);

    if (r)
        fail_msg("open %s: %s", f->dir, thaw_strerror(r));
}

static void fx_open(struct fx *f)
{
    struct thaw_disk_cache_params p = fx_params(f);

    fx_open_p(f, &p);
}

static void fx_close(struct fx *f)
{
    thaw_disk_cache_close(f->c);
    f->c = NULL;
}

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    char sub[PATH_MAX];

    if (!d) {
        unlink(path);
        return;
    }
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
        rm_rf(sub);
    }
    closedir(d);
    rmdir(path);
}

/* Empties the directory but keeps it. */
static void empty_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    char sub[PATH_MAX];

    assert_non_null(d);
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
        rm_rf(sub);
    }
    closedir(d);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);

    if (!f)
        return -1;
    strcpy(f->dir, "/tmp/thaw-test-cd-XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    f->now = 1700000000;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;

    thaw_disk_cache_close(f->c);
    rm_rf(f->dir);
    free(f);
    return 0;
}

static void key_make(uint8_t key[THAW_KEY_BYTES], unsigned n)
{
    for (int i = 0; i < THAW_KEY_BYTES; i++)
        key[i] = (uint8_t)(n * 131u + (unsigned)i * 7u + (n >> 8));
}

/* An entry's worth of data: parts of pseudo-random bytes, meta, n_tokens. */
struct data {
    uint8_t *buf[THAW_PART_COUNT];
    size_t size[THAW_PART_COUNT];
    uint8_t meta[64];
    size_t n_meta;
    uint32_t n_tokens;
};

static void data_make(struct data *d, unsigned seed, size_t kv, size_t ckpt, size_t dft)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);

    memset(d, 0, sizeof *d);
    d->size[THAW_PART_KV] = kv;
    d->size[THAW_PART_CKPT] = ckpt;
    d->size[THAW_PART_DFT] = dft;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (!d->size[p])
            continue;
        d->buf[p] = thaw_blob_alloc(d->size[p]);
        assert_non_null(d->buf[p]);
        for (size_t i = 0; i < d->size[p]; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            d->buf[p][i] = (uint8_t)x;
        }
    }
    d->n_meta = (size_t)snprintf((char *)d->meta, sizeof d->meta, "meta of entry %u", seed);
    d->n_tokens = 1000 + seed;
}

static void data_blobs(const struct data *d, struct thaw_part_blob b[THAW_PART_COUNT])
{
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        b[p].data = d->buf[p];
        b[p].size = d->size[p];
    }
}

static void data_free(struct data *d)
{
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(d->buf[p]);
}

static int store_data(struct thaw_disk_cache *c, const uint8_t *key, const struct data *d)
{
    struct thaw_part_blob b[THAW_PART_COUNT];

    data_blobs(d, b);
    return thaw_disk_cache_store(c, key, d->n_tokens, b, d->meta, d->n_meta);
}

/* 1 if e holds exactly d (with or without its .dft per want_dft). */
static int entry_matches(const struct thaw_disk_entry *e, const struct data *d, int want_dft)
{
    size_t n, n_meta;
    const void *m;

    for (int p = 0; p < THAW_PART_COUNT; p++) {
        const void *b = thaw_disk_entry_part(e, (enum thaw_part)p, &n);
        size_t want = (p == THAW_PART_DFT && !want_dft) ? 0 : d->size[p];

        if (n != want || (want && (!b || memcmp(b, d->buf[p], want) != 0)) || (!want && b))
            return 0;
    }
    m = thaw_disk_entry_meta(e, &n_meta);
    if (n_meta != d->n_meta || (n_meta && memcmp(m, d->meta, n_meta) != 0))
        return 0;
    return thaw_disk_entry_n_tokens(e) == d->n_tokens;
}

static void file_path(const struct fx *f, const uint8_t *key, const char *ext, char *out)
{
    char hex[2 * THAW_KEY_BYTES + 1];

    thaw_hex(key, THAW_KEY_BYTES, hex);
    snprintf(out, PATH_MAX, "%s/%s%s", f->dir, hex, ext);
}

static int file_exists(const struct fx *f, const uint8_t *key, const char *ext)
{
    char path[PATH_MAX];
    struct stat st;

    file_path(f, key, ext, path);
    return stat(path, &st) == 0;
}

/* Files in dir whose name starts with key's hex. */
static int key_files(const struct fx *f, const uint8_t *key)
{
    char hex[2 * THAW_KEY_BYTES + 1];
    DIR *d = opendir(f->dir);
    struct dirent *de;
    int n = 0;

    assert_non_null(d);
    thaw_hex(key, THAW_KEY_BYTES, hex);
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, hex, strlen(hex)))
            n++;
    closedir(d);
    return n;
}

/* No *.tmp; every part file has its .idx. */
static void assert_dir_clean(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[PATH_MAX];
    struct stat st;

    assert_non_null(d);
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        const char *dot = strchr(de->d_name, '.');

        if (len > 4 && !strcmp(de->d_name + len - 4, ".tmp"))
            fail_msg("leftover temporary %s", de->d_name);
        if (dot && dot - de->d_name == 64 && strspn(de->d_name, "0123456789abcdef") == 64 &&
            strcmp(dot, ".idx") != 0) {
            snprintf(path, sizeof path, "%s/%.64s.idx", dir, de->d_name);
            if (stat(path, &st) != 0)
                fail_msg("orphan %s", de->d_name);
        }
    }
    closedir(d);
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t b;

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static off_t file_size(const char *path)
{
    struct stat st;

    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    close(fd);
}

static struct thaw_disk_cache_stats stats(struct thaw_disk_cache *c)
{
    struct thaw_disk_cache_stats s;

    thaw_disk_cache_get_stats(c, &s);
    return s;
}

/* ---- basics ------------------------------------------------------------- */

static void test_round_trip(void **state)
{
    struct fx *f = *state;
    uint8_t k[32], k2[32];
    struct data d, d2;
    struct thaw_disk_entry *e = NULL;
    struct thaw_disk_cache_stats s;
    struct thaw_part_blob b[THAW_PART_COUNT];

    key_make(k, 1);
    key_make(k2, 2);
    data_make(&d, 1, 100000, 5000, 3000);
    fx_open(f);
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 0);
    assert_int_equal(store_data(f->c, k, &d), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 1);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &d, 1));
    thaw_disk_entry_release(e);
    s = stats(f->c);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.bytes, 100000 + 5000 + 3000 + 160 + d.n_meta);
    assert_int_equal(s.stores_ok, 1);
    assert_int_equal(s.lookups, 1);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 0);

    /* Only the mandatory part, no meta. */
    data_make(&d2, 2, 777, 0, 0);
    d2.n_meta = 0;
    assert_int_equal(store_data(f->c, k2, &d2), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k2, &e), 0);
    assert_true(entry_matches(e, &d2, 0));
    assert_null(thaw_disk_entry_part(e, THAW_PART_CKPT, NULL));
    assert_null(thaw_disk_entry_meta(e, NULL));
    thaw_disk_entry_release(e);

    /* Replacing k by d2: the old .ckpt/.dft must not survive. */
    assert_int_equal(store_data(f->c, k, &d2), 0);
    assert_false(file_exists(f, k, ".ckpt"));
    assert_false(file_exists(f, k, ".dft"));
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &d2, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(stats(f->c).entries, 2);
    assert_int_equal(stats(f->c).bytes, 2 * (777 + 160));

    /* ...and it survives a restart. */
    fx_close(f);
    fx_open(f);
    assert_int_equal(stats(f->c).entries, 2);
    assert_int_equal(stats(f->c).bytes, 2 * (777 + 160));
    assert_int_equal(thaw_disk_cache_lookup(f->c, k2, &e), 0);
    assert_true(entry_matches(e, &d2, 0));
    thaw_disk_entry_release(e);

    /* The 4 KiB meta limit. */
    {
        uint8_t *big = calloc(1, THAW_DISK_META_MAX + 1);
        size_t n_meta = 0;

        data_blobs(&d, b);
        assert_int_equal(thaw_disk_cache_store(f->c, k, 1, b, big, THAW_DISK_META_MAX), 0);
        assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
        assert_non_null(thaw_disk_entry_meta(e, &n_meta));
        assert_int_equal(n_meta, THAW_DISK_META_MAX);
        thaw_disk_entry_release(e);
        assert_int_equal(thaw_disk_cache_store(f->c, k, 1, b, big, THAW_DISK_META_MAX + 1),
                         THAW_ETOOBIG);
        free(big);
    }
    data_free(&d);
    data_free(&d2);
}

static void test_missing(void **state)
{
    struct fx *f = *state;
    uint8_t k[32];
    struct thaw_disk_entry *e = NULL;

    key_make(k, 9);
    fx_open(f);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_null(e);
    assert_int_equal(thaw_disk_cache_remove(f->c, k), THAW_ENOTFOUND);
    assert_int_equal(stats(f->c).misses, 1);
    assert_int_equal(stats(f->c).lookups, 1);
}

/* Prefetch advises the kernel about each present part file, from the index
 * alone: no lookup is counted, nothing is verified. */
static void test_prefetch(void **state)
{
    struct fx *f = *state;
    uint8_t k[32], k2[32];
    char path[PATH_MAX];
    struct data d;

    key_make(k, 31);
    key_make(k2, 32);
    data_make(&d, 31, 50000, 700, 0);
    fx_open(f);
    assert_int_equal(thaw_disk_cache_prefetch(f->c, k), 0);
    assert_int_equal(store_data(f->c, k, &d), 0);
    assert_int_equal(thaw_disk_cache_prefetch(f->c, k), 2); /* .kv and .ckpt; no .dft stored */
    assert_int_equal(thaw_disk_cache_prefetch(f->c, k2), 0);
    assert_int_equal(thaw_disk_cache_prefetch(NULL, k), 0);
    assert_int_equal(thaw_disk_cache_prefetch(f->c, NULL), 0);
    assert_int_equal(stats(f->c).lookups, 0);
    /* a part gone behind the cache's back: the others are still advised */
    file_path(f, k, ".kv", path);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(thaw_disk_cache_prefetch(f->c, k), 1);
    assert_int_equal(thaw_disk_cache_remove(f->c, k), 0);
    assert_int_equal(thaw_disk_cache_prefetch(f->c, k), 0);
    data_free(&d);
}

static void test_bad_arguments(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_disk_cache *c = NULL;
    uint8_t k[32];
    struct data d;
    struct thaw_part_blob b[THAW_PART_COUNT];
    struct thaw_disk_entry *e;

    key_make(k, 3);
    data_make(&d, 3, 1000, 0, 0);
    p.ttl_s = -1;
    assert_int_equal(thaw_disk_cache_open(&p, &c), THAW_EINVAL);
    p = fx_params(f);
    p.dir = "";
    assert_int_equal(thaw_disk_cache_open(&p, &c), THAW_EINVAL);
    assert_null(c);
    p = fx_params(f);
    p.max_bytes = 1000; /* the entry alone is 1000 + 160 + meta */
    fx_open_p(f, &p);
    data_blobs(&d, b);
    assert_int_equal(thaw_disk_cache_store(f->c, k, 1, b, NULL, 0), THAW_ETOOBIG);
    b[THAW_PART_KV].size = 0;
    assert_int_equal(thaw_disk_cache_store(f->c, k, 1, b, NULL, 0), THAW_EINVAL);
    data_blobs(&d, b);
    assert_int_equal(thaw_disk_cache_store(f->c, k, 1, b, NULL, 5), THAW_EINVAL);
    assert_int_equal(thaw_disk_cache_store(f->c, NULL, 1, b, NULL, 0), THAW_EINVAL);
    assert_int_equal(thaw_disk_cache_lookup(f->c, NULL, &e), THAW_EINVAL);
    assert_int_equal(key_files(f, k), 0);
    data_free(&d);
}

struct listing {
    int n;
    uint8_t keys[8][32];
    uint32_t tokens[8];
};

static int list_cb(void *ud, const struct thaw_disk_entry_info *info)
{
    struct listing *l = ud;

    if (l->n < 8) {
        memcpy(l->keys[l->n], info->key, 32);
        l->tokens[l->n] = info->n_tokens;
    }
    l->n++;
    return 0;
}

static void test_remove_list_verify(void **state)
{
    struct fx *f = *state;
    uint8_t k[3][32];
    struct data d[3];
    struct listing l = {0};
    struct thaw_disk_entry *e;
    char path[PATH_MAX];
    unsigned bad;

    fx_open(f);
    for (unsigned i = 0; i < 3; i++) {
        key_make(k[i], 10 + i);
        data_make(&d[i], 10 + i, 4000, 2000, 1000);
        f->now++;
        assert_int_equal(store_data(f->c, k[i], &d[i]), 0);
    }
    /* Most recently used first: touch 0. */
    f->now++;
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[0], &e), 0);
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_foreach(f->c, list_cb, &l), 0);
    assert_int_equal(l.n, 3);
    assert_memory_equal(l.keys[0], k[0], 32);
    assert_memory_equal(l.keys[1], k[2], 32);
    assert_memory_equal(l.keys[2], k[1], 32);
    assert_int_equal(l.tokens[1], d[2].n_tokens);

    /* verify: good, then a flipped .kv without and with fix. */
    assert_int_equal(thaw_disk_cache_verify(f->c, k[1], 0, &bad), 0);
    assert_int_equal(bad, 0);
    file_path(f, k[1], ".kv", path);
    flip_byte(path, 123);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[1], 0, &bad), THAW_ECORRUPT);
    assert_int_equal(bad, THAW_DISK_BAD_PART(THAW_PART_KV));
    assert_int_equal(key_files(f, k[1]), 4);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[1], 1, &bad), THAW_ECORRUPT);
    assert_int_equal(key_files(f, k[1]), 0);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[1], 1, &bad), THAW_ENOTFOUND);
    /* A bad .dft alone: usable, dft dropped with fix. */
    file_path(f, k[2], ".dft", path);
    flip_byte(path, 5);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[2], 1, &bad), 0);
    assert_int_equal(bad, THAW_DISK_BAD_PART(THAW_PART_DFT));
    assert_false(file_exists(f, k[2], ".dft"));
    assert_int_equal(thaw_disk_cache_verify(f->c, k[2], 1, &bad), 0);
    assert_int_equal(bad, 0);

    /* remove: .idx and parts gone, a miss after. */
    assert_int_equal(thaw_disk_cache_remove(f->c, k[0]), 0);
    assert_int_equal(key_files(f, k[0]), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[0], &e), THAW_ENOTFOUND);
    assert_int_equal(stats(f->c).entries, 1);
    for (int i = 0; i < 3; i++)
        data_free(&d[i]);
}

/* ---- corruption --------------------------------------------------------- */

/* Stores d under k, damages file ext by `how` (flip at off, or truncate to
 * off when truncate), and expects a lookup to miss with ECORRUPT and the
 * entry to be gone; for .dft: a hit without it. */
static void damage_and_lookup(struct fx *f, const uint8_t *k, const struct data *d,
                              const char *ext, off_t off, int truncate_it)
{
    char path[PATH_MAX];
    struct thaw_disk_entry *e = NULL;
    struct thaw_disk_cache_stats before, after;
    int is_dft = !strcmp(ext, ".dft");

    assert_int_equal(store_data(f->c, k, d), 0);
    file_path(f, k, ext, path);
    if (off < 0)
        off += file_size(path);
    if (truncate_it)
        assert_int_equal(truncate(path, off), 0);
    else
        flip_byte(path, off);
    before = stats(f->c);
    if (is_dft) {
        assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
        assert_true(entry_matches(e, d, 0));
        thaw_disk_entry_release(e);
        assert_false(file_exists(f, k, ".dft"));
        assert_true(file_exists(f, k, ".idx"));
        after = stats(f->c);
        assert_int_equal(after.dft_dropped, before.dft_dropped + 1);
        assert_int_equal(after.bytes, before.bytes - d->size[THAW_PART_DFT]);
        /* The rewritten .idx no longer names it: a clean hit. */
        assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
        assert_true(entry_matches(e, d, 0));
        thaw_disk_entry_release(e);
        assert_int_equal(stats(f->c).dft_dropped, after.dft_dropped);
        assert_int_equal(thaw_disk_cache_verify(f->c, k, 0, NULL), 0);
    } else {
        assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ECORRUPT);
        assert_int_equal(key_files(f, k), 0);
        after = stats(f->c);
        assert_int_equal(after.corrupt_removed, before.corrupt_removed + 1);
        assert_int_equal(after.entries, before.entries - 1);
        assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    }
}

static void test_corrupt_each_file(void **state)
{
    struct fx *f = *state;
    static const char *const exts[] = {".idx", ".kv", ".ckpt", ".dft"};
    /* Offsets: first byte, the middle, the last byte (negative: from end). */
    static const off_t flips[] = {0, 9, 20, 90, 150, -1};
    uint8_t k[32];
    struct data d;

    key_make(k, 20);
    data_make(&d, 20, 70000, 9000, 5000);
    fx_open(f);
    for (size_t x = 0; x < 4; x++) {
        for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++)
            damage_and_lookup(f, k, &d, exts[x], flips[i], 0);
        damage_and_lookup(f, k, &d, exts[x], 0, 1);  /* emptied */
        damage_and_lookup(f, k, &d, exts[x], 100, 1); /* truncated */
        damage_and_lookup(f, k, &d, exts[x], -1, 1);  /* one byte short */
    }
    /* Every single byte of the .idx. */
    {
        char path[PATH_MAX];
        off_t n;

        assert_int_equal(store_data(f->c, k, &d), 0);
        file_path(f, k, ".idx", path);
        n = file_size(path);
        for (off_t off = 0; off < n; off++)
            damage_and_lookup(f, k, &d, ".idx", off, 0);
    }
    data_free(&d);
}

/* DEFER_KV: the lookup hands out an unverified .kv; verify() catches the
 * flipped byte, removes the entry and turns the hit into a miss. */
static void test_deferred_verify(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_entry *e = NULL;
    struct thaw_disk_cache_stats st;
    char path[PATH_MAX];
    uint8_t k[32];
    struct data d;

    key_make(k, 21);
    data_make(&d, 21, 70000, 9000, 0);
    fx_open(f);
    assert_int_equal(store_data(f->c, k, &d), 0);
    /* intact: verify passes and the bytes are the stored ones */
    assert_int_equal(thaw_disk_cache_lookup_ex(f->c, k, THAW_DISK_LOOKUP_DEFER_KV, &e), 0);
    assert_int_equal(thaw_disk_entry_verify(f->c, e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    /* damaged: the lookup still hits (unverified), verify says corrupt */
    file_path(f, k, ".kv", path);
    flip_byte(path, 12345);
    e = NULL;
    assert_int_equal(thaw_disk_cache_lookup_ex(f->c, k, THAW_DISK_LOOKUP_DEFER_KV, &e), 0);
    assert_int_equal(thaw_disk_entry_verify(f->c, e), THAW_ECORRUPT);
    thaw_disk_entry_release(e);
    assert_int_equal(key_files(f, k), 0);
    st = stats(f->c);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.corrupt_removed, 1);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    data_free(&d);
}

static void test_corrupt_while_closed(void **state)
{
    struct fx *f = *state;
    uint8_t k1[32], k2[32], k3[32];
    struct data d;
    char path[PATH_MAX];
    struct thaw_disk_entry *e;

    key_make(k1, 30);
    key_make(k2, 31);
    key_make(k3, 32);
    data_make(&d, 30, 50000, 3000, 2000);
    fx_open(f);
    assert_int_equal(store_data(f->c, k1, &d), 0);
    assert_int_equal(store_data(f->c, k2, &d), 0);
    assert_int_equal(store_data(f->c, k3, &d), 0);
    fx_close(f);
    file_path(f, k1, ".kv", path);
    assert_int_equal(truncate(path, 100), 0); /* caught by the open's size check */
    file_path(f, k2, ".ckpt", path);
    flip_byte(path, 77); /* caught by the lookup's checksum */
    file_path(f, k3, ".dft", path);
    assert_int_equal(unlink(path), 0); /* the .dft alone: entry kept */
    fx_open(f);
    assert_int_equal(stats(f->c).corrupt_removed, 1);
    assert_int_equal(key_files(f, k1), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k1, &e), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k2, &e), THAW_ECORRUPT);
    assert_int_equal(key_files(f, k2), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k3, &e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(stats(f->c).corrupt_removed, 2);
    data_free(&d);
}

static void test_garbage_files(void **state)
{
    struct fx *f = *state;
    uint8_t k[8][32], buf[8192];
    char path[PATH_MAX];
    struct thaw_disk_entry *e;
    struct data d;

    key_make(k[7], 47);
    data_make(&d, 47, 3000, 0, 0);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int i = 0; i < 7; i++)
        key_make(k[i], 40 + i);
    file_path(f, k[0], ".idx", path);
    write_bytes(path, buf, 0);
    file_path(f, k[1], ".idx", path);
    write_bytes(path, buf, 152);
    file_path(f, k[2], ".idx", path);
    write_bytes(path, buf, sizeof buf);
    memcpy(buf, "THAWIDX\0\1\0\0\0", 12); /* another version (1: before blocks): removed too */
    file_path(f, k[3], ".idx", path);
    write_bytes(path, buf, 300);
    memcpy(buf, "THAWIDX\0\2\0\0\0", 12); /* right magic, garbage after */
    file_path(f, k[4], ".idx", path);
    write_bytes(path, buf, 160);
    file_path(f, k[5], ".idx", path);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    file_path(f, k[6], ".idx", path);
    assert_int_equal(mkdir(path, 0700), 0);
    file_path(f, k[6], ".kv", path);
    assert_int_equal(mkdir(path, 0700), 0);

    fx_open(f);
    assert_int_equal(stats(f->c).entries, 0);
    for (int i = 0; i < 7; i++)
        assert_int_equal(thaw_disk_cache_lookup(f->c, k[i], &e), THAW_ENOTFOUND);
    assert_false(file_exists(f, k[3], ".idx"));
    assert_false(file_exists(f, k[1], ".idx"));
    assert_false(file_exists(f, k[4], ".idx"));
    /* The store still works, and never writes through a planted link. */
    {
        char target[PATH_MAX];

        snprintf(target, sizeof target, "%s/target", f->dir);
        file_path(f, k[7], ".kv.tmp", path);
        assert_int_equal(symlink(target, path), 0);
        assert_int_equal(store_data(f->c, k[7], &d), 0);
        assert_int_equal(access(target, F_OK), -1);
        assert_int_equal(thaw_disk_cache_lookup(f->c, k[7], &e), 0);
        assert_true(entry_matches(e, &d, 0));
        thaw_disk_entry_release(e);
    }
    data_free(&d);
}

static void test_idx_parse_fuzz(void **state)
{
    struct fx *f = *state;
    uint8_t k[32], rec[4096 + 200], m[4096 + 200];
    struct thaw_disk_idx idx;
    struct data d;
    char path[PATH_MAX];
    size_t n;
    int fd;
    uint64_t x = 88172645463325252ull;

    key_make(k, 50);
    data_make(&d, 50, 1000, 100, 10);
    fx_open(f);
    assert_int_equal(store_data(f->c, k, &d), 0);
    file_path(f, k, ".idx", path);
    fd = open(path, O_RDONLY);
    n = (size_t)read(fd, rec, sizeof rec);
    close(fd);
    assert_int_equal(n, 160 + d.n_meta);
    assert_int_equal(thaw_disk_idx_parse(rec, n, &idx), 0);
    assert_memory_equal(idx.key, k, 32);
    assert_int_equal(idx.n_tokens, d.n_tokens);
    assert_int_equal(idx.size[THAW_PART_CKPT], 100);
    assert_int_equal(idx.created, f->now);
    assert_int_equal(thaw_disk_idx_parse(NULL, 0, &idx), THAW_ECORRUPT);
    /* Random mutations and lengths: never a crash, never accepted. */
    for (int it = 0; it < 20000; it++) {
        size_t len = n, flips;

        memcpy(m, rec, n);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        flips = 1 + x % 4;
        for (size_t j = 0; j < flips; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            m[x % n] ^= (uint8_t)(1u << (x >> 32) % 8);
        }
        if (it % 3 == 0)
            len = (size_t)(x >> 40) % sizeof m;
        if (len == n && !memcmp(m, rec, n))
            continue;
        if (thaw_disk_idx_parse(m, len, &idx) == 0)
            fail_msg("mutated record accepted (iteration %d)", it);
    }
    data_free(&d);
}

/* ---- crashes / errors --------------------------------------------------- */

/* Number of vfs calls one store of d makes (replacing or not). */
static unsigned long count_store_calls(struct fx *f, const uint8_t *k, const struct data *d,
                                       const struct data *old)
{
    struct thaw_vfs_fault *ft;
    struct thaw_disk_cache_params p = fx_params(f);
    unsigned long n;

    empty_dir(f->dir);
    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);
    if (old)
        assert_int_equal(store_data(f->c, k, old), 0);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(store_data(f->c, k, d), 0);
    n = thaw_vfs_fault_calls(ft, THAW_VFS_ANY);
    fx_close(f);
    thaw_vfs_fault_free(ft);
    return n;
}

static void crash_run(struct fx *f, const uint8_t *k, const struct data *d, const struct data *old)
{
    unsigned long n_calls = count_store_calls(f, k, d, old), first_hit = 0;
    struct thaw_disk_entry *e;

    assert_true(n_calls >= 20);
    for (unsigned long n = 1; n <= n_calls; n++) {
        pid_t pid;
        int status, r;

        empty_dir(f->dir);
        if (old) {
            fx_open(f);
            assert_int_equal(store_data(f->c, k, old), 0);
            fx_close(f);
        }
        fflush(NULL);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            struct thaw_vfs_fault *ft;
            struct thaw_disk_cache_params p = fx_params(f);
            struct thaw_disk_cache *c;

            p.log = NULL;
            if (thaw_vfs_fault_new(NULL, &ft))
                _exit(2);
            p.vfs = thaw_vfs_fault_vfs(ft);
            if (thaw_disk_cache_open(&p, &c))
                _exit(3);
            thaw_vfs_fault_arm(ft, THAW_VFS_ANY, n, THAW_VFS_CRASH, 0);
            (void)store_data(c, k, d);
            _exit(4); /* the crash never came */
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 137);

        /* Recovery: the sweep leaves a clean directory, and the key holds
         * all of d, all of old, or nothing — never a mix or garbage. */
        fx_open(f);
        assert_dir_clean(f->dir);
        r = thaw_disk_cache_lookup(f->c, k, &e);
        assert_int_equal(stats(f->c).corrupt_removed, 0);
        if (r == 0) {
            int is_new = entry_matches(e, d, 1);
            int is_old = old && entry_matches(e, old, 1);

            thaw_disk_entry_release(e);
            if (!is_new && !is_old)
                fail_msg("crash at call %lu: entry is neither the old nor the new one", n);
            if (is_new && !first_hit)
                first_hit = n;
            if (!is_new && first_hit)
                fail_msg("crash at call %lu: new entry lost after it was committed", n);
            if (is_old && n > 1)
                fail_msg("crash at call %lu: old entry survived its .idx unlink", n);
        } else {
            assert_int_equal(r, THAW_ENOTFOUND);
            if (first_hit)
                fail_msg("crash at call %lu: miss after commit at %lu", n, first_hit);
        }
        fx_close(f);
    }
    /* The commit point exists and is late: only the final fsyncs follow the
     * .idx rename (open dir, fsync, close). */
    assert_int_equal(first_hit, n_calls - 2);
}

static void test_crash_new_entry(void **state)
{
    struct fx *f = *state;
    uint8_t k[32];
    struct data d;

    key_make(k, 60);
    data_make(&d, 60, 30000, 4000, 2000);
    crash_run(f, k, &d, NULL);
    data_free(&d);
}

static void test_crash_replace(void **state)
{
    struct fx *f = *state;
    uint8_t k[32];
    struct data d, old;

    key_make(k, 61);
    data_make(&d, 61, 30000, 4000, 2000);
    data_make(&old, 62, 20000, 3000, 1000);
    crash_run(f, k, &d, &old);
    data_free(&d);
    data_free(&old);
}

/* Every call of a store failing once, with and without an entry to replace:
 * the store reports the error, nothing of the key remains, the cache keeps
 * working. */
static void test_io_error_each_call(void **state)
{
    struct fx *f = *state;
    uint8_t k[32], k2[32];
    struct data d, old;
    struct thaw_vfs_fault *ft;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_disk_entry *e;
    unsigned long n_calls;

    key_make(k, 70);
    key_make(k2, 71);
    data_make(&d, 70, 20000, 3000, 1000);
    data_make(&old, 71, 10000, 2000, 500);
    for (int replace = 0; replace < 2; replace++) {
        n_calls = count_store_calls(f, k, &d, replace ? &old : NULL);
        empty_dir(f->dir);
        assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
        p.vfs = thaw_vfs_fault_vfs(ft);
        fx_open_p(f, &p);
        for (unsigned long n = 1; n <= n_calls; n++) {
            uint64_t failures = stats(f->c).store_failures;

            if (replace)
                assert_int_equal(store_data(f->c, k, &old), 0);
            thaw_vfs_fault_arm(ft, THAW_VFS_ANY, n, THAW_VFS_FAIL_ONCE, -ENOSPC);
            assert_int_equal(store_data(f->c, k, &d), -ENOSPC);
            assert_int_equal(thaw_vfs_fault_fired(ft), 1);
            thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
            assert_int_equal(stats(f->c).store_failures, failures + 1);
            assert_int_equal(key_files(f, k), 0);
            assert_int_equal(thaw_disk_cache_contains(f->c, k), 0);
            assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
            assert_int_equal(stats(f->c).entries, 0);
        }
        /* Still working. */
        assert_int_equal(store_data(f->c, k2, &d), 0);
        assert_int_equal(thaw_disk_cache_lookup(f->c, k2, &e), 0);
        assert_true(entry_matches(e, &d, 1));
        thaw_disk_entry_release(e);
        assert_int_equal(thaw_disk_cache_remove(f->c, k2), 0);
        fx_close(f);
        thaw_vfs_fault_free(ft);
    }
    data_free(&d);
    data_free(&old);
}

static void test_disk_full_then_freed(void **state)
{
    struct fx *f = *state;
    uint8_t k[32];
    struct data d;
    struct thaw_vfs_fault *ft;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_disk_entry *e;

    key_make(k, 80);
    data_make(&d, 80, 20000, 0, 0);
    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);
    /* The disk stays full: every write from the first on. */
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 1, THAW_VFS_FAIL_FROM, -ENOSPC);
    for (int i = 0; i < 3; i++)
        assert_int_equal(store_data(f->c, k, &d), -ENOSPC);
    /* fsync failing (e.g. EIO after writeback error). */
    thaw_vfs_fault_arm(ft, THAW_VFS_FSYNC, 1, THAW_VFS_FAIL_FROM, -EIO);
    assert_int_equal(store_data(f->c, k, &d), -EIO);
    assert_int_equal(key_files(f, k), 0);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(store_data(f->c, k, &d), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &d, 1));
    thaw_disk_entry_release(e);
    assert_int_equal(stats(f->c).store_failures, 4);
    assert_int_equal(stats(f->c).stores_ok, 1);
    fx_close(f);
    thaw_vfs_fault_free(ft);
    data_free(&d);
}

/* A full disk costs the least recently used entry, not the state being
 * stored: the store removes what it wrote, evicts, and starts over. */
static void test_enospc_evicts_lru(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_vfs_fault *ft;
    struct thaw_part_blob b[THAW_PART_COUNT];
    struct thaw_disk_entry *e;
    struct thaw_disk_cache_stats st;
    uint8_t k[5][32];
    struct data old, d, copy, d2;

    for (int i = 0; i < 5; i++)
        key_make(k[i], 300 + (unsigned)i);
    data_make(&old, 300, 5000, 0, 0);
    data_make(&d, 303, 4000, 0, 0); /* smaller than one old entry: one eviction */
    data_make(&d2, 304, 3000, 0, 0);
    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);
    for (int i = 0; i < 3; i++) { /* k0 the least recently used */
        f->now++;
        assert_int_equal(store_data(f->c, k[i], &old), 0);
    }

    /* Through the writer: the first write of the store fails. Only the
     * writer does I/O until the flush returns. */
    data_make(&copy, 303, 4000, 0, 0);
    data_blobs(&copy, b);
    warns_clear(f);
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 1, THAW_VFS_FAIL_ONCE, -ENOSPC);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[3], copy.n_tokens, b, copy.meta, copy.n_meta), 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(thaw_vfs_fault_fired(ft), 1);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    st = stats(f->c);
    assert_int_equal(st.stores_ok, 4);
    assert_int_equal(st.store_failures, 0);
    assert_int_equal(st.evictions_enospc, 1);
    assert_int_equal(st.evictions_lru, 0);
    assert_int_equal(st.entries, 3);
    assert_int_equal(key_files(f, k[0]), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[1]), 1); /* memory only: LRU order kept */
    assert_int_equal(thaw_disk_cache_contains(f->c, k[2]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[3]), 1);
    assert_dir_clean(f->dir);
    assert_warned(f, "No space left on device", "evicted 1 least recently used entry",
                  "retrying (1/3)", NULL);

    /* Synchronous, EDQUOT, failing late: at the .idx's write (the 2nd; the
     * entry is one part). k1 is now the least recently used. */
    warns_clear(f);
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 2, THAW_VFS_FAIL_ONCE, -EDQUOT);
    assert_int_equal(store_data(f->c, k[4], &d2), 0);
    assert_int_equal(thaw_vfs_fault_fired(ft), 1);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(stats(f->c).evictions_enospc, 2);
    assert_int_equal(key_files(f, k[1]), 0);
    assert_warned(f, "evicted 1 least recently used entry", NULL);
    assert_dir_clean(f->dir);

    /* What is left is whole, and survives a restart. */
    fx_close(f);
    fx_open_p(f, &p);
    assert_int_equal(stats(f->c).swept_files, 0);
    assert_int_equal(stats(f->c).entries, 3);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[2], &e), 0);
    assert_true(entry_matches(e, &old, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[3], &e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[4], &e), 0);
    assert_true(entry_matches(e, &d2, 0));
    thaw_disk_entry_release(e);
    fx_close(f);
    thaw_vfs_fault_free(ft);
    data_free(&old);
    data_free(&d);
    data_free(&d2);
}

/* A disk that stays full: with nothing to evict the store fails at once;
 * otherwise it gives up after THAW_DISK_ENOSPC_ROUNDS rounds. Either way
 * nothing of the new key is left and what was not evicted is intact. */
static void test_enospc_bounded(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_vfs_fault *ft;
    struct thaw_disk_entry *e;
    uint8_t k[6][32], kn[32];
    struct data old, d;

    for (int i = 0; i < 6; i++)
        key_make(k[i], 310 + (unsigned)i);
    key_make(kn, 320);
    data_make(&old, 310, 5000, 600, 0);
    data_make(&d, 320, 4000, 500, 0);
    assert_int_equal(thaw_vfs_fault_new(NULL, &ft), 0);
    p.vfs = thaw_vfs_fault_vfs(ft);
    fx_open_p(f, &p);

    /* Replacing the only entry: it is the key being written, never a
     * victim, so there is nothing to evict. */
    assert_int_equal(store_data(f->c, k[5], &old), 0);
    warns_clear(f);
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 1, THAW_VFS_FAIL_FROM, -ENOSPC);
    assert_int_equal(store_data(f->c, k[5], &d), -ENOSPC);
    assert_int_equal(thaw_vfs_fault_fired(ft), 1);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(stats(f->c).evictions_enospc, 0);
    assert_int_equal(key_files(f, k[5]), 0);
    assert_int_equal(stats(f->c).entries, 0);
    assert_dir_clean(f->dir);
    assert_warned(f, "no entry left to evict", NULL);
    assert_warned(f, "store of", "failed", "No space left on device", NULL);

    /* Five entries, and every write fails: one eviction per round. */
    for (int i = 0; i < 5; i++) {
        f->now++;
        assert_int_equal(store_data(f->c, k[i], &old), 0);
    }
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 1, THAW_VFS_FAIL_FROM, -ENOSPC);
    assert_int_equal(store_data(f->c, kn, &d), -ENOSPC);
    assert_int_equal(thaw_vfs_fault_fired(ft), 1 + THAW_DISK_ENOSPC_ROUNDS);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(stats(f->c).evictions_enospc, THAW_DISK_ENOSPC_ROUNDS);
    assert_int_equal(stats(f->c).store_failures, 2);
    for (int i = 0; i < THAW_DISK_ENOSPC_ROUNDS; i++)
        assert_int_equal(key_files(f, k[i]), 0);
    assert_int_equal(key_files(f, kn), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, kn), 0);
    assert_dir_clean(f->dir);
    assert_int_equal(stats(f->c).entries, 5 - THAW_DISK_ENOSPC_ROUNDS);
    for (int i = THAW_DISK_ENOSPC_ROUNDS; i < 5; i++) {
        assert_int_equal(thaw_disk_cache_lookup(f->c, k[i], &e), 0);
        assert_true(entry_matches(e, &old, 1));
        thaw_disk_entry_release(e);
    }
    /* Other errors are not a full disk: no eviction. */
    thaw_vfs_fault_arm(ft, THAW_VFS_WRITE, 1, THAW_VFS_FAIL_ONCE, -EIO);
    assert_int_equal(store_data(f->c, kn, &d), -EIO);
    thaw_vfs_fault_arm(ft, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(stats(f->c).evictions_enospc, THAW_DISK_ENOSPC_ROUNDS);
    assert_int_equal(stats(f->c).entries, 5 - THAW_DISK_ENOSPC_ROUNDS);
    fx_close(f);
    thaw_vfs_fault_free(ft);
    data_free(&old);
    data_free(&d);
}

/* ---- eviction ----------------------------------------------------------- */

static void test_ttl(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t a[32], b[32];
    struct data d;
    struct thaw_disk_entry *e;
    int64_t t0 = f->now;

    key_make(a, 90);
    key_make(b, 91);
    data_make(&d, 90, 5000, 0, 0);
    p.ttl_s = 600;
    /* Stored and never used: expires ttl after the store, restart or not. */
    fx_open_p(f, &p);
    assert_int_equal(store_data(f->c, a, &d), 0);
    fx_close(f);
    f->now = t0 + 600;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    fx_close(f);
    f->now = t0 + 601;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, a), 0);
    f->now = t0;
    assert_int_equal(store_data(f->c, a, &d), 0);
    assert_int_equal(store_data(f->c, b, &d), 0);
    f->now = t0 + 300;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, a, &e), 0); /* last use of a: t0+300 */
    thaw_disk_entry_release(e);
    f->now = t0 + 600; /* exactly ttl: not more */
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    f->now = t0 + 601;
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, b), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, a), 1);
    assert_int_equal(stats(f->c).evictions_ttl, 2);
    assert_int_equal(stats(f->c).entries, 1);

    /* Last use survives the restart (the .idx mtime): a lives until
     * t0+300+600 whatever its creation time. */
    fx_close(f);
    f->now = t0 + 900;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, a), 1);
    fx_close(f);
    f->now = t0 + 901;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, a), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, a, &e), THAW_ENOTFOUND);

    /* ttl 0: no limit. */
    fx_close(f);
    p.ttl_s = 0;
    fx_open_p(f, &p);
    assert_int_equal(store_data(f->c, a, &d), 0);
    f->now += 100LL * 365 * 86400;
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    data_free(&d);
}

static void test_lru(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t k[4][32];
    struct data d;
    struct thaw_disk_entry *e;
    uint64_t one;

    data_make(&d, 100, 10000, 1000, 0);
    one = 10000 + 1000 + 160 + d.n_meta;
    for (int i = 0; i < 4; i++)
        key_make(k[i], 100 + (unsigned)i);
    p.max_bytes = 3 * one;
    p.ttl_s = 0;
    fx_open_p(f, &p);
    for (int i = 0; i < 3; i++) { /* A, B, C at t+1, t+2, t+3 */
        f->now++;
        assert_int_equal(store_data(f->c, k[i], &d), 0);
        assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    }
    assert_int_equal(stats(f->c).bytes, 3 * one);
    f->now++; /* A used at t+4: B is now the least recently used */
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[0], &e), 0);
    thaw_disk_entry_release(e);
    f->now++; /* D at t+5: over budget by one */
    assert_int_equal(store_data(f->c, k[3], &d), 0);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, k[1]), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[0]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[2]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[3]), 1);
    assert_int_equal(stats(f->c).evictions_lru, 1);
    assert_int_equal(stats(f->c).bytes, 3 * one);

    /* Across a restart with a smaller budget: A (t+4), D (t+5), C used at
     * t+6 -> A is evicted, although it was stored first and C before D. */
    fx_close(f);
    p.max_bytes = 2 * one;
    fx_open_p(f, &p);
    f->now++;
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[2], &e), 0);
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, k[0]), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[2]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[3]), 1);
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    data_free(&d);
}

/* Entries stored in one second come back after a restart in the order they
 * were stored, not in key order: the mtime carries the order within the
 * second (whole seconds put the newest conversation first in line for the
 * budget when its key sorted low). */
static void test_lru_within_a_second(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    uint8_t k[3][32], t[32];
    struct data d;
    uint64_t one;

    data_make(&d, 100, 10000, 1000, 0);
    one = 10000 + 1000 + 160 + d.n_meta;
    for (int i = 0; i < 3; i++)
        key_make(k[i], 300 + (unsigned)i);
    for (int i = 0; i < 3; i++) /* stored highest key first */
        for (int j = i + 1; j < 3; j++)
            if (memcmp(k[i], k[j], 32) < 0) {
                memcpy(t, k[i], 32);
                memcpy(k[i], k[j], 32);
                memcpy(k[j], t, 32);
            }
    p.ttl_s = 0;
    fx_open_p(f, &p);
    for (int i = 0; i < 3; i++)
        assert_int_equal(store_data(f->c, k[i], &d), 0);
    fx_close(f);
    p.max_bytes = 2 * one;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_evict(f->c), 1);
    assert_int_equal(key_files(f, k[0]), 0);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[1]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[2]), 1);
    data_free(&d);
}

/* ---- writer ------------------------------------------------------------- */

static void test_writer_submit_flush(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct data d[8];
    uint8_t k[8][32];
    struct thaw_disk_entry *e;

    assert_int_equal(p.queue_max_bytes, 1u << 30); /* the default */
    fx_open_p(f, &p);
    for (unsigned i = 0; i < 8; i++) {
        struct thaw_part_blob b[THAW_PART_COUNT];
        struct data copy;

        key_make(k[i], 110 + i);
        data_make(&d[i], 110 + i, 8000 + i, 500, i % 2 ? 300 : 0);
        data_make(&copy, 110 + i, 8000 + i, 500, i % 2 ? 300 : 0);
        data_blobs(&copy, b);
        assert_int_equal(thaw_disk_cache_submit(f->c, k[i], copy.n_tokens, b, copy.meta,
                                                copy.n_meta),
                         0);
        for (int q = 0; q < THAW_PART_COUNT; q++)
            assert_null(b[q].data); /* ownership moved; the cache frees */
    }
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).stores_ok, 8);
    for (unsigned i = 0; i < 8; i++) {
        assert_int_equal(thaw_disk_cache_lookup(f->c, k[i], &e), 0);
        assert_true(entry_matches(e, &d[i], 1));
        thaw_disk_entry_release(e);
    }
    /* close() drains what is still queued. */
    for (unsigned i = 0; i < 4; i++) {
        struct thaw_part_blob b[THAW_PART_COUNT];
        struct data copy;

        data_make(&copy, 200 + i, 3000, 0, 0);
        data_blobs(&copy, b);
        assert_int_equal(thaw_disk_cache_remove(f->c, k[i]), 0);
        assert_int_equal(thaw_disk_cache_submit(f->c, k[i], 7, b, NULL, 0), 0);
    }
    fx_close(f);
    fx_open(f);
    assert_int_equal(stats(f->c).entries, 8);
    for (int i = 0; i < 8; i++)
        data_free(&d[i]);
}

/* A vfs whose creation of *.tmp files waits at a gate: holds the writer
 * thread mid-store so that the queue fills deterministically. */
struct gate {
    struct thaw_vfs vfs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int closed;
    int waiting;
    int reads; /* opens without O_CREAT (under mu) */
};

static int gate_open(const struct thaw_vfs *v, const char *path, int flags, mode_t mode)
{
    struct gate *g = (struct gate *)v;
    size_t len = strlen(path);

    if ((flags & O_CREAT) && len > 4 && !strcmp(path + len - 4, ".tmp")) {
        pthread_mutex_lock(&g->mu);
        g->waiting++;
        pthread_cond_broadcast(&g->cv);
        while (g->closed)
            pthread_cond_wait(&g->cv, &g->mu);
        g->waiting--;
        pthread_mutex_unlock(&g->mu);
    } else if (!(flags & O_CREAT)) {
        pthread_mutex_lock(&g->mu);
        g->reads++;
        pthread_mutex_unlock(&g->mu);
    }
    return thaw_vfs_default()->open(thaw_vfs_default(), path, flags, mode);
}

/* A store the writer still holds (being written, or waiting) is served
 * from its own blobs by thaw_disk_cache_pending: a turn sent right after
 * its reply must not miss it. Once written, only the index has it. */
static void test_writer_pending_serves_queued_stores(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct gate g; /* outlives a failed test: teardown still closes */
    struct data d[2], want[2];
    uint8_t k[4][32];
    struct thaw_part_blob b[THAW_PART_COUNT], got[2][THAW_PART_COUNT], none[THAW_PART_COUNT];
    int r[3];

    g.vfs = *thaw_vfs_default();
    g.vfs.open = gate_open;
    g.reads = 0;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.closed = 1;
    g.waiting = 0;
    p.vfs = &g.vfs;
    fx_open_p(f, &p);
    for (unsigned i = 0; i < 4; i++)
        key_make(k[i], 140 + i);
    for (unsigned i = 0; i < 2; i++) {
        data_make(&d[i], 140 + i, 4000 + i, i == 1 ? 300 : 0, 0);
        data_make(&want[i], 140 + i, 4000 + i, i == 1 ? 300 : 0, 0);
    }
    /* k0: taken by the writer, which blocks at the gate; k1: waiting */
    data_blobs(&d[0], b);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[0], 1, b, NULL, 0), 0);
    pthread_mutex_lock(&g.mu);
    while (g.waiting == 0)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    data_blobs(&d[1], b);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[1], 1, b, NULL, 0), 0);
    r[0] = thaw_disk_cache_pending(f->c, k[0], got[0]);
    r[1] = thaw_disk_cache_pending(f->c, k[1], got[1]);
    r[2] = thaw_disk_cache_pending(f->c, k[3], none); /* never submitted */
    /* Open the gate before asserting, so that a failure cannot hang close. */
    pthread_mutex_lock(&g.mu);
    g.closed = 0;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    thaw_disk_cache_flush(f->c); /* the writer drops its references: ours keep the bytes */
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], THAW_ENOTFOUND);
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < THAW_PART_COUNT; q++) {
            assert_int_equal(got[i][q].size, want[i].size[q]);
            if (want[i].size[q])
                assert_memory_equal(got[i][q].data, want[i].buf[q], want[i].size[q]);
            else
                assert_null(got[i][q].data);
            thaw_blob_unref(got[i][q].data);
        }
    for (int q = 0; q < THAW_PART_COUNT; q++)
        assert_null(none[q].data);
    /* written: the index serves it, the queue no longer does */
    assert_int_equal(thaw_disk_cache_contains(f->c, k[0]), 1);
    assert_int_equal(thaw_disk_cache_pending(f->c, k[0], got[0]), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_pending(f->c, k[1], got[1]), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_pending(NULL, k[0], got[0]), THAW_EINVAL);
    fx_close(f);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    for (int i = 0; i < 2; i++)
        data_free(&want[i]); /* d's blobs went to the writer */
}

static void test_writer_queue_full(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct gate g; /* outlives a failed test: teardown still closes */
    struct data d[4];
    uint8_t k[4][32];
    struct thaw_part_blob b[THAW_PART_COUNT];
    struct thaw_disk_entry *e;
    struct thaw_disk_cache_stats held;
    int r, n_reads;

    g.vfs = *thaw_vfs_default();
    g.vfs.open = gate_open;
    g.reads = 0;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.closed = 1;
    g.waiting = 0;
    p.vfs = &g.vfs;
    p.queue_max_bytes = 3 * (4000 + 160); /* the one being written + 2 waiting */
    fx_open_p(f, &p);
    for (unsigned i = 0; i < 4; i++) {
        key_make(k[i], 120 + i);
        data_make(&d[i], 120 + i, 4000, 0, 0);
    }
    /* 1st: taken by the writer, which then blocks at the gate. */
    data_blobs(&d[0], b);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[0], 1, b, NULL, 0), 0);
    d[0].buf[0] = NULL;
    pthread_mutex_lock(&g.mu);
    while (g.waiting == 0)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    /* 2nd, 3rd: queued. 4th: the queue is full. */
    for (int i = 1; i < 3; i++) {
        data_blobs(&d[i], b);
        assert_int_equal(thaw_disk_cache_submit(f->c, k[i], 1, b, NULL, 0), 0);
        d[i].buf[0] = NULL;
    }
    data_blobs(&d[3], b);
    warns_clear(f);
    r = thaw_disk_cache_submit(f->c, k[3], 1, b, "m", 1);
    held = stats(f->c);
    /* A queued store is no lookup target yet; one mid-write is busy: both
     * miss without touching the disk. */
    n_reads = g.reads;
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[0], &e), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[1], &e), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[0]), 0);
    n_reads = g.reads - n_reads;
    /* Open the gate before asserting, so that a failure cannot hang close. */
    pthread_mutex_lock(&g.mu);
    g.closed = 0;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    assert_int_equal(r, THAW_EBUSY);
    assert_ptr_equal(b[THAW_PART_KV].data, d[3].buf[0]); /* still the caller's */
    assert_int_equal(held.stores_dropped, 1);
    assert_int_equal(held.queue_bytes, 3 * (4000 + 160));
    assert_int_equal(held.queue_len, 3);
    assert_warned(f, "dropped store", "writer queue full", "12.2 KiB in 3 stores", "budget 12.2 KiB",
                  NULL);
    assert_int_equal(n_reads, 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).stores_ok, 3);
    assert_int_equal(stats(f->c).queue_bytes, 0);
    assert_int_equal(stats(f->c).queue_len, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(thaw_disk_cache_contains(f->c, k[i]), 1);
    assert_int_equal(thaw_disk_cache_contains(f->c, k[3]), 0);
    fx_close(f);
    data_free(&d[3]);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);

    /* No writer thread: submit refuses, the caller keeps the buffers. */
    p = fx_params(f);
    p.flags = THAW_DISK_CACHE_NO_WRITER;
    fx_open_p(f, &p);
    data_make(&d[0], 130, 100, 0, 0);
    data_blobs(&d[0], b);
    warns_clear(f);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[0], 1, b, NULL, 0), THAW_EINVAL);
    assert_non_null(b[0].data);
    assert_int_equal(stats(f->c).stores_dropped, 1);
    assert_warned(f, "dropped store", "no writer thread", NULL);
    data_free(&d[0]);
}

static void gate_init(struct gate *g)
{
    g->vfs = *thaw_vfs_default();
    g->vfs.open = gate_open;
    g->reads = 0;
    g->waiting = 0;
    g->closed = 0;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void gate_set(struct gate *g, int closed)
{
    pthread_mutex_lock(&g->mu);
    g->closed = closed;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Until the writer is held at the (closed) gate. */
static void gate_wait_writer(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (g->waiting == 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Submits a new entry of one kv part of kv bytes, no meta (kv + 160 bytes
 * in the queue), under key n. The submit's return; the data is freed or
 * handed over either way. */
static int submit_new(struct fx *f, unsigned n, size_t kv)
{
    struct thaw_part_blob b[THAW_PART_COUNT];
    uint8_t k[32];
    struct data d;
    int r;

    key_make(k, n);
    data_make(&d, n, kv, 0, 0);
    data_blobs(&d, b);
    r = thaw_disk_cache_submit(f->c, k, d.n_tokens, b, NULL, 0);
    if (r == 0)
        memset(d.buf, 0, sizeof d.buf); /* moved to the cache */
    data_free(&d);
    return r;
}

/* The queue is bounded by bytes: many stores wait under the default budget
 * (a count of 4 dropped 37 of 48 with four conversations), a store that
 * would go past the budget is dropped while smaller ones still fit, and one
 * larger than the whole budget goes when the writer holds nothing. Every
 * assertion comes after the gate is open, so a failure cannot hang close. */
static void test_writer_queue_bytes(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct gate g; /* outlives a failed test: teardown still closes */
    struct thaw_disk_cache_stats st;
    int r[48], n_bad = 0;
    uint8_t k[32];

    gate_init(&g);
    p.vfs = &g.vfs;

    /* 1. The default budget. */
    fx_open_p(f, &p);
    gate_set(&g, 1);
    for (unsigned i = 0; i < 48; i++)
        r[i] = submit_new(f, 400 + i, 8000);
    st = stats(f->c);
    gate_set(&g, 0);
    thaw_disk_cache_flush(f->c);
    for (int i = 0; i < 48; i++)
        n_bad += r[i] != 0;
    assert_int_equal(n_bad, 0);
    assert_int_equal(st.stores_dropped, 0);
    assert_int_equal(st.queue_len, 48);
    assert_int_equal(st.queue_bytes, 48 * (8000 + 160));
    assert_int_equal(stats(f->c).stores_ok, 48);
    assert_int_equal(stats(f->c).queue_bytes, 0);
    assert_int_equal(stats(f->c).queue_len, 0);
    fx_close(f);

    /* 2. A budget of 10000 bytes, the writer held on the first store. */
    empty_dir(f->dir);
    p.queue_max_bytes = 10000;
    fx_open_p(f, &p);
    warns_clear(f);
    gate_set(&g, 1);
    r[0] = submit_new(f, 500, 4000); /* 4160 held */
    if (r[0] == 0)
        gate_wait_writer(&g);
    r[1] = submit_new(f, 501, 4000); /* 8320 */
    r[2] = submit_new(f, 502, 2000); /* 10480 > 10000: dropped */
    r[3] = submit_new(f, 503, 1500); /* 9980: fits */
    r[4] = submit_new(f, 504, 100);  /* 10240: dropped */
    st = stats(f->c);
    gate_set(&g, 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], THAW_EBUSY);
    assert_int_equal(r[3], 0);
    assert_int_equal(r[4], THAW_EBUSY);
    assert_int_equal(st.queue_bytes, 4160 + 4160 + 1660);
    assert_int_equal(st.queue_len, 3);
    assert_int_equal(st.stores_dropped, 2);
    assert_warned(f, "dropped store", "(2.1 KiB)", "writer queue full", "8.1 KiB in 2 stores",
                  "budget 9.8 KiB", NULL);
    assert_warned(f, "dropped store", "(260 B)", "9.7 KiB in 3 stores", NULL);
    assert_int_equal(stats(f->c).stores_ok, 3);
    key_make(k, 502);
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 0);
    key_make(k, 503);
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 1);

    /* 3. Larger than the whole budget: taken when nothing is held, and
     * then it is the backlog. */
    gate_set(&g, 1);
    r[0] = submit_new(f, 510, 30000);
    if (r[0] == 0)
        gate_wait_writer(&g);
    r[1] = submit_new(f, 511, 100);
    st = stats(f->c);
    gate_set(&g, 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], THAW_EBUSY);
    assert_int_equal(st.queue_bytes, 30160);
    assert_int_equal(stats(f->c).stores_ok, 4);
    assert_int_equal(stats(f->c).stores_dropped, 3);
    key_make(k, 510);
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 1);
    assert_int_equal(submit_new(f, 512, 30000), 0); /* idle again */
    thaw_disk_cache_flush(f->c);
    assert_int_equal(stats(f->c).stores_ok, 5);
    fx_close(f);

    /* 4. 0: no limit. */
    empty_dir(f->dir);
    p.queue_max_bytes = 0;
    fx_open_p(f, &p);
    gate_set(&g, 1);
    r[0] = submit_new(f, 520, 30000);
    if (r[0] == 0)
        gate_wait_writer(&g);
    r[1] = submit_new(f, 521, 30000);
    gate_set(&g, 0);
    thaw_disk_cache_flush(f->c);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_int_equal(stats(f->c).stores_ok, 2);
    fx_close(f);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* ---- directory ---------------------------------------------------------- */

static void assert_mode(const char *path, mode_t want)
{
    struct stat st;

    assert_int_equal(stat(path, &st), 0);
    if ((st.st_mode & 07777) != want)
        fail_msg("%s: mode %04o, want %04o", path, (unsigned)(st.st_mode & 07777),
                 (unsigned)want);
}

static void test_permissions(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    char sub[PATH_MAX], deep[PATH_MAX], path[PATH_MAX];
    uint8_t k[32];
    struct data d;
    mode_t old_umask = umask(0); /* 0600/0700 must not come from the umask */

    key_make(k, 140);
    data_make(&d, 140, 1000, 100, 10);
    snprintf(sub, sizeof sub, "%s/a", f->dir);
    snprintf(deep, sizeof deep, "%s/a/b/", f->dir);
    p.dir = deep;
    fx_open_p(f, &p);
    assert_int_equal(store_data(f->c, k, &d), 0);
    assert_mode(sub, 0700);
    assert_mode(deep, 0700);
    snprintf(path, sizeof path, "%.4000s/lock", deep);
    assert_mode(path, 0600);
    for (int i = 0; i < 4; i++) {
        static const char *const ext[] = {".kv", ".ckpt", ".dft", ".idx"};
        char hex[65];

        thaw_hex(k, 32, hex);
        snprintf(path, sizeof path, "%.4000s/%s%s", deep, hex, ext[i]);
        assert_mode(path, 0600);
    }
    fx_close(f);
    /* A looser directory is tightened at open. */
    assert_int_equal(chmod(deep, 0755), 0);
    fx_open_p(f, &p);
    assert_mode(deep, 0700);
    fx_close(f);
    /* A read-only opener only warns. */
    assert_int_equal(chmod(deep, 0750), 0);
    p.flags = THAW_DISK_CACHE_READONLY;
    fx_open_p(f, &p);
    assert_mode(deep, 0750);
    fx_close(f);
    /* Not a directory. */
    snprintf(path, sizeof path, "%s/file", f->dir);
    write_bytes(path, "x", 1);
    p.dir = path;
    p.flags = 0;
    assert_int_equal(thaw_disk_cache_open(&p, &f->c), -ENOTDIR);
    umask(old_umask);
    data_free(&d);
}

static void test_startup_sweep(void **state)
{
    struct fx *f = *state;
    uint8_t k[5][32];
    char path[PATH_MAX], hex[65];
    struct data d;
    struct thaw_disk_entry *e;

    for (int i = 0; i < 5; i++)
        key_make(k[i], 150 + (unsigned)i);
    data_make(&d, 150, 2000, 100, 0);
    fx_open(f);
    assert_int_equal(store_data(f->c, k[4], &d), 0); /* a real entry, no .dft */
    fx_close(f);
    file_path(f, k[0], ".kv.tmp", path);
    write_bytes(path, "tmp", 3);
    file_path(f, k[0], ".idx.tmp", path);
    write_bytes(path, "tmp", 3);
    file_path(f, k[1], ".kv", path); /* a part without .idx */
    write_bytes(path, "orphan", 6);
    file_path(f, k[2], ".ckpt", path);
    write_bytes(path, "orphan", 6);
    file_path(f, k[2], ".dft", path);
    write_bytes(path, "orphan", 6);
    file_path(f, k[4], ".dft", path); /* a part its .idx does not list */
    write_bytes(path, "stray", 5);
    snprintf(path, sizeof path, "%s/README", f->dir); /* not ours */
    write_bytes(path, "hi", 2);
    thaw_hex(k[3], 32, hex);
    for (char *c = hex; *c; c++)
        if (*c >= 'a')
            *c = (char)(*c - 'a' + 'A');
    snprintf(path, sizeof path, "%s/%s.kv", f->dir, hex); /* not ours either */
    write_bytes(path, "x", 1);

    fx_open(f);
    assert_int_equal(stats(f->c).swept_files, 6);
    assert_int_equal(key_files(f, k[0]), 0);
    assert_int_equal(key_files(f, k[1]), 0);
    assert_int_equal(key_files(f, k[2]), 0);
    assert_false(file_exists(f, k[4], ".dft"));
    assert_true(file_exists(f, k[4], ".idx"));
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/README", f->dir);
    assert_int_equal(access(path, F_OK), 0);
    assert_dir_clean(f->dir);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[4], &e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    data_free(&d);
}

static void test_fingerprint_mismatch(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p1 = fx_params(f), p2 = fx_params(f);
    uint8_t k[32], k2[32];
    struct data d;
    struct thaw_disk_entry *e;
    struct listing l = {0};

    key_make(k, 160);
    key_make(k2, 161);
    data_make(&d, 160, 3000, 0, 0);
    p2.fingerprint[5] ^= 1;
    fx_open_p(f, &p1);
    assert_int_equal(store_data(f->c, k, &d), 0);
    fx_close(f);

    fx_open_p(f, &p2); /* another model on the same directory */
    assert_int_equal(thaw_disk_cache_contains(f->c, k), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_int_equal(key_files(f, k), 2); /* kept for its model */
    assert_int_equal(stats(f->c).entries, 1); /* and counted against the budget */
    assert_int_equal(thaw_disk_cache_verify(f->c, k, 1, NULL), 0);
    assert_int_equal(store_data(f->c, k2, &d), 0);
    assert_int_equal(thaw_disk_cache_foreach(f->c, list_cb, &l), 0);
    assert_int_equal(l.n, 2);
    fx_close(f);

    fx_open_p(f, &p1);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k2, &e), THAW_ENOTFOUND);
    data_free(&d);
}

static int last_used_cb(void *ud, const struct thaw_disk_entry_info *info)
{
    *(int64_t *)ud = info->last_used;
    return 0;
}

/* thaw_disk_cache_read_kv, what `thaw cache` reads entries through: a head
 * or the whole .kv of an entry of any model, READONLY too, with no lookup
 * counted and its last use unchanged; a whole read is checked against the
 * checksum (and a bad one left in place), a head cannot be. */
static void test_read_kv(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f), other = fx_params(f);
    uint8_t k[32], k2[32], head[64];
    struct data d;
    char path[PATH_MAX];
    int64_t used = 0, used_after = 0;
    size_t n = 1;

    key_make(k, 170);
    key_make(k2, 171);
    data_make(&d, 170, 5000, 300, 0);
    fx_open_p(f, &p);
    assert_int_equal(store_data(f->c, k, &d), 0);
    fx_close(f);
    other.fingerprint[0] ^= 1;
    other.flags = THAW_DISK_CACHE_READONLY;
    fx_open_p(f, &other);
    assert_int_equal(thaw_disk_cache_foreach(f->c, last_used_cb, &used), 0);
    assert_true(used > 0);
    f->now += 100;

    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, head, sizeof head, &n), 0);
    assert_int_equal(n, sizeof head);
    assert_memory_equal(head, d.buf[THAW_PART_KV], sizeof head);
    uint8_t *all = malloc(6000);
    assert_non_null(all);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, all, 6000, &n), 0);
    assert_int_equal(n, 5000);
    assert_memory_equal(all, d.buf[THAW_PART_KV], 5000);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k2, all, 6000, &n), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, NULL, 10, &n), THAW_EINVAL);
    assert_int_equal(stats(f->c).lookups, 0);
    assert_int_equal(thaw_disk_cache_foreach(f->c, last_used_cb, &used_after), 0);
    assert_int_equal(used_after, used);

    /* a byte past the head goes bad: the head still reads, the whole does not */
    file_path(f, k, ".kv", path);
    flip_byte(path, 4000);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, head, sizeof head, &n), 0);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, all, 6000, &n), THAW_ECORRUPT);
    assert_int_equal(key_files(f, k), 3); /* left in place: reading is not judging */
    fx_close(f);
    p.flags = THAW_DISK_CACHE_SHARED;
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_read_kv(f->c, k, all, 6000, &n), THAW_ECORRUPT);
    assert_int_equal(key_files(f, k), 3);
    free(all);
    data_free(&d);
}

static void test_lock_and_shared(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_disk_cache *c2 = NULL;
    uint8_t k[32];
    struct data d;
    struct thaw_disk_entry *e;
    char path[PATH_MAX];

    key_make(k, 170);
    data_make(&d, 170, 3000, 0, 0);
    fx_open(f);
    assert_int_equal(store_data(f->c, k, &d), 0);
    /* A second owner is refused. */
    assert_int_equal(thaw_disk_cache_open(&p, &c2), THAW_ELOCKED);
    assert_null(c2);
    /* A shared opener (thaw cache) sees the entry and may remove it. */
    file_path(f, k, ".kv.tmp", path);
    write_bytes(path, "in flight", 9);
    p.flags = THAW_DISK_CACHE_SHARED;
    assert_int_equal(thaw_disk_cache_open(&p, &c2), 0);
    assert_int_equal(access(path, F_OK), 0); /* not swept: the owner may be writing it */
    assert_int_equal(stats(c2).entries, 1);
    assert_int_equal(thaw_disk_cache_remove(c2, k), 0);
    thaw_disk_cache_close(c2);
    /* The owner sees it gone: a miss, forgotten. */
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_int_equal(stats(f->c).entries, 0);
    assert_int_equal(stats(f->c).corrupt_removed, 0);
    fx_close(f);
    unlink(path);
    /* Read-only: a missing directory is not created. */
    snprintf(path, sizeof path, "%s/none", f->dir);
    p.dir = path;
    p.flags = THAW_DISK_CACHE_READONLY;
    assert_int_equal(thaw_disk_cache_open(&p, &c2), -ENOENT);
    assert_int_equal(access(path, F_OK), -1);
    data_free(&d);
}


/* READONLY is a promise that nothing changes, whatever the directory holds
 * and whatever is called: corrupt entries (found at open and at lookup), a
 * bad .dft, *.tmp, orphans, a stray part, a loose mode; lookups (no
 * last-use update), verify with fix, evict past the TTL, remove, store. */
static void test_readonly_changes_nothing(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    struct thaw_disk_entry *e;
    struct thaw_disk_cache_stats st;
    struct thaw_part_blob b[THAW_PART_COUNT];
    struct snap before, after;
    char path[PATH_MAX];
    uint8_t k[9][32];
    unsigned bad;
    struct data d;

    for (int i = 0; i < 9; i++)
        key_make(k[i], 330 + (unsigned)i);
    data_make(&d, 330, 20000, 2000, 1000);
    fx_open(f);
    for (int i = 0; i < 6; i++)
        assert_int_equal(store_data(f->c, k[i], &d), 0);
    fx_close(f);
    file_path(f, k[2], ".idx", path); /* corrupt, found at open */
    flip_byte(path, 30);
    file_path(f, k[5], ".kv", path); /* wrong size, found at open */
    assert_int_equal(truncate(path, 100), 0);
    file_path(f, k[3], ".kv", path); /* found by the checksum only */
    flip_byte(path, 999);
    file_path(f, k[4], ".dft", path); /* a lookup would drop the .dft */
    flip_byte(path, 3);
    file_path(f, k[6], ".kv.tmp", path);
    write_bytes(path, "tmp", 3);
    file_path(f, k[6], ".idx.tmp", path);
    write_bytes(path, "tmp", 3);
    file_path(f, k[7], ".kv", path); /* an orphan */
    write_bytes(path, "orphan", 6);
    assert_int_equal(chmod(f->dir, 0750), 0);
    snap_take(f->dir, &before);

    f->now += 100000;
    p.flags = THAW_DISK_CACHE_READONLY;
    p.ttl_s = 10;
    p.max_bytes = 1;
    fx_open_p(f, &p);
    st = stats(f->c);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.skipped_entries, 2);
    assert_int_equal(st.swept_files, 0);
    assert_int_equal(st.corrupt_removed, 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[0], &e), 0);
    assert_true(entry_matches(e, &d, 1));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[3], &e), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[4], &e), 0);
    assert_true(entry_matches(e, &d, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup_ex(f->c, k[1], THAW_DISK_LOOKUP_DEFER_KV, &e), 0);
    assert_int_equal(thaw_disk_entry_verify(f->c, e), 0);
    thaw_disk_entry_release(e);
    for (int i = 0; i < 8; i++)
        (void)thaw_disk_cache_verify(f->c, k[i], 1, &bad);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[3], 1, &bad), THAW_ECORRUPT);
    assert_int_equal(thaw_disk_cache_verify(f->c, k[4], 1, &bad), 0);
    assert_int_equal(bad, THAW_DISK_BAD_PART(THAW_PART_DFT));
    assert_int_equal(thaw_disk_cache_evict(f->c), 0);
    assert_int_equal(thaw_disk_cache_remove(f->c, k[0]), THAW_EINVAL);
    assert_int_equal(store_data(f->c, k[8], &d), THAW_EINVAL);
    data_blobs(&d, b);
    assert_int_equal(thaw_disk_cache_submit(f->c, k[8], 1, b, NULL, 0), THAW_EINVAL);
    assert_true(thaw_disk_cache_prefetch(f->c, k[0]) > 0);
    fx_close(f);
    snap_take(f->dir, &after);
    snap_assert_same(&before, &after, "READONLY open");

    /* The same directory had plenty to change: an owner changes it. */
    p.flags = 0;
    p.ttl_s = 0;
    p.max_bytes = 0;
    fx_open_p(f, &p);
    st = stats(f->c);
    assert_int_equal(st.corrupt_removed, 2);
    assert_int_equal(st.swept_files, 3);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[3], &e), THAW_ECORRUPT);
    snap_take(f->dir, &after);
    assert_true(after.n < before.n);
    data_free(&d);
}

/* ---- concurrency -------------------------------------------------------- */

struct race {
    struct fx *f;
    const uint8_t *key;
    struct data *d[2];
    int stores;
    int failed;
};

static void *race_writer(void *arg)
{
    struct race *r = arg;

    for (int i = 0; i < r->stores; i++)
        if (store_data(r->f->c, r->key, r->d[i % 2]) != 0)
            r->failed++;
    return NULL;
}

/* Lookups on this thread, stores of the same key alternating between two
 * contents on another: every hit is exactly one of them, nothing is ever
 * judged corrupt, nothing is left behind. */
static void test_lookup_races_store(void **state)
{
    struct fx *f = *state;
    uint8_t k[32];
    struct data a, b;
    struct race r = {0};
    pthread_t t;
    int hits = 0, lookups = 0, done = 0;

    key_make(k, 180);
    data_make(&a, 180, 40000, 6000, 3000);
    data_make(&b, 181, 30000, 5000, 0);
    fx_open(f);
    r.f = f;
    r.key = k;
    r.d[0] = &a;
    r.d[1] = &b;
    r.stores = 60;
    assert_int_equal(pthread_create(&t, NULL, race_writer, &r), 0);
    while (!done) {
        struct thaw_disk_entry *e;
        int ret = thaw_disk_cache_lookup(f->c, k, &e);

        lookups++;
        if (ret == 0) {
            /* a without its .dft is legitimate: a store of b was removing
             * a's .dft while this lookup read it. */
            if (!entry_matches(e, &a, 1) && !entry_matches(e, &a, 0) && !entry_matches(e, &b, 0))
                fail_msg("lookup %d returned a mix", lookups);
            thaw_disk_entry_release(e);
            hits++;
        } else if (ret != THAW_ENOTFOUND) {
            fail_msg("lookup %d: %s", lookups, thaw_strerror(ret));
        }
        done = stats(f->c).stores_ok + stats(f->c).store_failures >= (uint64_t)r.stores;
        sched_yield(); /* under valgrind's big lock, let the writer run */
    }
    pthread_join(t, NULL);
    assert_int_equal(r.failed, 0);
    assert_int_equal(stats(f->c).corrupt_removed, 0);
    assert_int_equal(stats(f->c).dft_dropped, 0);
    assert_true(hits > 0);
    assert_dir_clean(f->dir);
    fx_close(f);
    fx_open(f);
    assert_int_equal(stats(f->c).entries, 1);
    assert_int_equal(stats(f->c).swept_files, 0);
    data_free(&a);
    data_free(&b);
}

/* An .idx copied under another key's name names the wrong key: corrupt,
 * whether found at lookup or at open, even though sizes and checksums fit. */
static void test_idx_of_other_key(void **state)
{
    struct fx *f = *state;
    uint8_t k[4][32];
    struct data d;
    char from[PATH_MAX], to[PATH_MAX];
    struct thaw_disk_entry *e;

    data_make(&d, 190, 4000, 100, 0);
    for (int i = 0; i < 4; i++)
        key_make(k[i], 190 + (unsigned)i);
    fx_open(f);
    for (int i = 0; i < 4; i++)
        assert_int_equal(store_data(f->c, k[i], &d), 0);
    file_path(f, k[0], ".idx", from);
    file_path(f, k[1], ".idx", to);
    assert_int_equal(rename(from, to), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k[1], &e), THAW_ECORRUPT);
    assert_int_equal(key_files(f, k[1]), 0);
    fx_close(f);
    file_path(f, k[2], ".idx", from);
    file_path(f, k[3], ".idx", to);
    assert_int_equal(rename(from, to), 0);
    fx_open(f);
    assert_int_equal(stats(f->c).corrupt_removed, 1);
    assert_int_equal(key_files(f, k[3]), 0);
    assert_int_equal(stats(f->c).entries, 0); /* 0 lost its .idx, 2 too */
    data_free(&d);
}

/* Another model's .idx put in place under a running cache (by another
 * process): a miss, and the entry is not judged corrupt. */
static void test_fingerprint_swapped_on_disk(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p2 = fx_params(f);
    struct thaw_disk_cache *c2;
    char dir2[PATH_MAX], from[PATH_MAX], to[PATH_MAX], hex[65];
    uint8_t k[32];
    struct data d;
    struct thaw_disk_entry *e;

    key_make(k, 200);
    data_make(&d, 200, 4000, 0, 0);
    snprintf(dir2, sizeof dir2, "%s/other", f->dir);
    p2.dir = dir2;
    p2.fingerprint[0] ^= 0xff;
    assert_int_equal(thaw_disk_cache_open(&p2, &c2), 0);
    assert_int_equal(store_data(c2, k, &d), 0);
    thaw_disk_cache_close(c2);
    fx_open(f);
    assert_int_equal(store_data(f->c, k, &d), 0);
    thaw_hex(k, 32, hex);
    snprintf(from, sizeof from, "%.3000s/%s.idx", dir2, hex);
    file_path(f, k, ".idx", to);
    assert_int_equal(rename(from, to), 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_int_equal(stats(f->c).corrupt_removed, 0);
    assert_int_equal(key_files(f, k), 2);
    data_free(&d);
}

/* A vfs that runs a hook at the first read-only open of a .kv: lets a test
 * complete a whole store between a lookup's reading of the .idx and of the
 * parts, deterministically. */
struct hook {
    struct thaw_vfs vfs;
    void (*fn)(void *ud);
    void *ud;
};

static int hook_open(const struct thaw_vfs *v, const char *path, int flags, mode_t mode)
{
    struct hook *h = (struct hook *)v;
    size_t len = strlen(path);
    void (*fn)(void *) = h->fn;

    if (fn && !(flags & O_CREAT) && len > 3 && !strcmp(path + len - 3, ".kv")) {
        h->fn = NULL;
        fn(h->ud);
    }
    return thaw_vfs_default()->open(thaw_vfs_default(), path, flags, mode);
}

struct replace_ctx {
    struct fx *f;
    const uint8_t *key;
    const struct data *d;
    int ret;
};

static void replace_now(void *ud)
{
    struct replace_ctx *r = ud;

    r->ret = store_data(r->f->c, r->key, r->d);
}

static void test_lookup_sees_replacement(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f);
    static struct hook h; /* outlives a failed test: teardown still closes */
    uint8_t k[32];
    struct data a, b, b2;
    struct replace_ctx r;
    struct thaw_disk_entry *e;

    key_make(k, 210);
    data_make(&a, 210, 9000, 500, 0);
    data_make(&b, 211, 7000, 300, 0);  /* other sizes */
    data_make(&b2, 212, 7000, 300, 0); /* same sizes as b, other bytes */
    h.vfs = *thaw_vfs_default();
    h.vfs.open = hook_open;
    p.vfs = &h.vfs;
    fx_open_p(f, &p);
    assert_int_equal(store_data(f->c, k, &a), 0);
    /* The lookup reads a's .idx, then b replaces a, then it reads b's .kv:
     * a mismatch, but a race, not corruption: a miss that removes nothing. */
    r = (struct replace_ctx){f, k, &b, -1};
    h.fn = replace_now;
    h.ud = &r;
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_int_equal(r.ret, 0);
    assert_int_equal(stats(f->c).corrupt_removed, 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &b, 0));
    thaw_disk_entry_release(e);
    /* The same with equal sizes (a checksum mismatch). */
    r = (struct replace_ctx){f, k, &b2, -1};
    h.fn = replace_now;
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), THAW_ENOTFOUND);
    assert_int_equal(r.ret, 0);
    assert_int_equal(stats(f->c).corrupt_removed, 0);
    assert_int_equal(thaw_disk_cache_lookup(f->c, k, &e), 0);
    assert_true(entry_matches(e, &b2, 0));
    thaw_disk_entry_release(e);
    fx_close(f);
    data_free(&a);
    data_free(&b);
    data_free(&b2);
}

static int same_model_cb(void *ud, const struct thaw_disk_entry_info *info)
{
    *(int *)ud += info->same_model;
    return 0;
}

/* Handles (thaw_disk_cache_handle): two models on one open directory, one
 * writer. Each finds only what it stored, synchronously or through the
 * writer; the .idx carries the handle's fingerprint (a reopen under that
 * fingerprint alone finds it); stats and the writer are the store's. */
static void test_handles_share_one_store(void **state)
{
    struct fx *f = *state;
    struct thaw_disk_cache_params p = fx_params(f), pb = fx_params(f);
    struct thaw_disk_cache *a = NULL, *b = NULL, *bb = NULL;
    uint8_t fa[THAW_DISK_FINGERPRINT_SIZE], ka[32], kb[32];
    struct thaw_part_blob blobs[THAW_PART_COUNT];
    struct thaw_disk_entry *e;
    struct data da, db, copy;
    int same = 0;

    memset(fa, 0x11, sizeof fa);
    memset(pb.fingerprint, 0x22, sizeof pb.fingerprint);
    key_make(ka, 170);
    key_make(kb, 171);
    data_make(&da, 170, 3000, 200, 0);
    data_make(&db, 171, 5000, 0, 100);
    fx_open_p(f, &p);
    assert_int_equal(thaw_disk_cache_handle(f->c, fa, NULL, &a), 0);
    assert_int_equal(thaw_disk_cache_handle(f->c, pb.fingerprint, NULL, &b), 0);
    assert_int_equal(thaw_disk_cache_handle(b, pb.fingerprint, NULL, &bb), 0); /* of a handle: of its store */

    assert_int_equal(store_data(a, ka, &da), 0); /* synchronously */
    data_make(&copy, 171, 5000, 0, 100);
    data_blobs(&copy, blobs);
    assert_int_equal(thaw_disk_cache_submit(b, kb, copy.n_tokens, blobs, copy.meta, copy.n_meta), 0);
    thaw_disk_cache_flush(a); /* the one writer: b's store is written too */
    assert_int_equal(stats(f->c).stores_ok, 2);
    assert_int_equal(stats(b).entries, 2);

    assert_int_equal(thaw_disk_cache_contains(a, ka), 1);
    assert_int_equal(thaw_disk_cache_contains(a, kb), 0);
    assert_int_equal(thaw_disk_cache_has(b, ka), 0);
    assert_int_equal(thaw_disk_cache_has(bb, kb), 1);
    assert_int_equal(thaw_disk_cache_lookup(b, ka, &e), THAW_ENOTFOUND);
    assert_int_equal(thaw_disk_cache_lookup(f->c, ka, &e), THAW_ENOTFOUND); /* the store's own fingerprint */
    assert_int_equal(thaw_disk_cache_lookup(a, ka, &e), 0);
    assert_true(entry_matches(e, &da, 0));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(b, kb, &e), 0);
    assert_true(entry_matches(e, &db, 1));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_foreach(a, same_model_cb, &same), 0);
    assert_int_equal(same, 1);

    thaw_disk_cache_close(bb);
    thaw_disk_cache_close(b);
    thaw_disk_cache_close(a);
    fx_close(f);
    fx_open_p(f, &pb); /* b's entry was written under b's fingerprint */
    assert_int_equal(thaw_disk_cache_lookup(f->c, kb, &e), 0);
    assert_true(entry_matches(e, &db, 1));
    thaw_disk_entry_release(e);
    assert_int_equal(thaw_disk_cache_lookup(f->c, ka, &e), THAW_ENOTFOUND);
    data_free(&da);
    data_free(&db);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_round_trip),
        T(test_missing),
        T(test_prefetch),
        T(test_bad_arguments),
        T(test_remove_list_verify),
        T(test_corrupt_each_file),
        T(test_deferred_verify),
        T(test_corrupt_while_closed),
        T(test_garbage_files),
        T(test_idx_parse_fuzz),
        T(test_crash_new_entry),
        T(test_crash_replace),
        T(test_io_error_each_call),
        T(test_disk_full_then_freed),
        T(test_enospc_evicts_lru),
        T(test_enospc_bounded),
        T(test_ttl),
        T(test_lru),
        T(test_lru_within_a_second),
        T(test_writer_submit_flush),
        T(test_writer_queue_full),
        T(test_writer_pending_serves_queued_stores),
        T(test_writer_queue_bytes),
        T(test_permissions),
        T(test_startup_sweep),
        T(test_fingerprint_mismatch),
        T(test_read_kv),
        T(test_lock_and_shared),
        T(test_readonly_changes_nothing),
        T(test_lookup_races_store),
        T(test_idx_of_other_key),
        T(test_fingerprint_swapped_on_disk),
        T(test_handles_share_one_store),
        T(test_lookup_sees_replacement),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
