/* test_cache_cli.c — `thaw cache ...` on a directory with something wrong in
 * it, without a model or a server (tests/e2e/test_cache_cli.py runs the real
 * binary on a directory a server filled).
 *
 * What is checked: ls, stats and verify (plain and --dry-run) change nothing
 * at all — file list, inodes, modes, sizes, mtimes, ctimes, bytes, and the
 * directory's own mode and times — on a directory holding a corrupt entry of
 * each kind, *.tmp files and an orphan; they exit 1 while something is
 * unreadable or corrupt and 0 once it is clean; verify --fix (and its alias
 * --repair) removes the bad entries and sweeps the leftovers; --fix with
 * --dry-run is a usage error.
 *
 * Map:
 *   ---- fixtures ----   temp dir, entries, running the command, snapshots
 *   ---- tests ----
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/blob.h"
#include "base/error.h"
#include "cache/cache_disk.h"
#include "cache/entry_kind.h"
#include "cache/manifest.h"
#include "cli/cache_cli.h"
#include "dir_snapshot.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixtures ----------------------------------------------------------- */

struct fx {
    char dir[64];
    char out[64];      /* file the command's stdout goes to */
    char err[64];      /* and its stderr */
    char text[16384];  /* stdout then stderr of the last run */
    uint8_t key[4][THAW_KEY_BYTES];
    char hex[4][2 * THAW_KEY_BYTES + 1];
};

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

static void path_of(const struct fx *f, int i, const char *ext, char out[PATH_MAX])
{
    snprintf(out, PATH_MAX, "%s/%s%s", f->dir, f->hex[i], ext);
}

static int exists(const struct fx *f, int i, const char *ext)
{
    char path[PATH_MAX];

    path_of(f, i, ext, path);
    return access(path, F_OK) == 0;
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    close(fd);
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

/* Four entries stored through the store itself: 0 and 1 stay good, 2 gets
 * a flipped .kv byte (only a checksum finds it), 3 a flipped .idx byte
 * (found at open). Plus *.tmp files and an orphan part of a fifth key. */
static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_disk_cache *c = NULL;
    char path[PATH_MAX];
    int fd;

    if (!f)
        return -1;
    strcpy(f->dir, "/tmp/thaw-test-cli-XXXXXX");
    strcpy(f->out, "/tmp/thaw-test-cli-out-XXXXXX");
    strcpy(f->err, "/tmp/thaw-test-cli-err-XXXXXX");
    if (!mkdtemp(f->dir) || (fd = mkstemp(f->out)) < 0)
        return -1;
    close(fd);
    if ((fd = mkstemp(f->err)) < 0)
        return -1;
    close(fd);
    p.dir = f->dir;
    p.flags = THAW_DISK_CACHE_NO_WRITER;
    if (thaw_disk_cache_open(&p, &c))
        return -1;
    for (int i = 0; i < 4; i++) {
        struct thaw_part_blob b[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
        uint8_t *kv = thaw_blob_alloc(6000);

        if (!kv)
            return -1;
        for (int j = 0; j < THAW_KEY_BYTES; j++)
            f->key[i][j] = (uint8_t)(0x10 * (i + 1) + j);
        thaw_hex(f->key[i], THAW_KEY_BYTES, f->hex[i]);
        for (int j = 0; j < 6000; j++)
            kv[j] = (uint8_t)(j * 7 + i);
        b[THAW_PART_KV].data = kv;
        b[THAW_PART_KV].size = 6000;
        if (thaw_disk_cache_store(c, f->key[i], 100 + (uint32_t)i, b, NULL, 0))
            return -1;
        thaw_blob_unref(kv);
    }
    thaw_disk_cache_close(c);
    path_of(f, 2, ".kv", path);
    flip_byte(path, 4321);
    path_of(f, 3, ".idx", path);
    flip_byte(path, 40);
    path_of(f, 0, ".kv.tmp", path);
    write_bytes(path, "interrupted", 11);
    snprintf(path, sizeof path, "%s/%s.idx.tmp", f->dir,
             "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee");
    write_bytes(path, "interrupted", 11);
    snprintf(path, sizeof path, "%s/%s.ckpt", f->dir,
             "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
    write_bytes(path, "orphan", 6);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;

    rm_rf(f->dir);
    unlink(f->out);
    unlink(f->err);
    free(f);
    return 0;
}

static size_t slurp(const char *path, char *to, size_t cap)
{
    FILE *in = fopen(path, "r");
    size_t n;

    assert_non_null(in);
    n = fread(to, 1, cap - 1, in);
    fclose(in);
    to[n] = '\0';
    return n;
}

/* Runs `thaw cache <args...> (NULL-terminated)` with DIR substituted for
 * "DIR"; its stdout and stderr land in f->text. Returns its exit status. */
static int run(struct fx *f, ...)
{
    char *argv[16];
    int argc = 0, saved_out, saved_err, fd_out, fd_err, status;
    size_t n;
    va_list ap;
    char *a;

    argv[argc++] = "cache";
    va_start(ap, f);
    while ((a = va_arg(ap, char *)) && argc < 15)
        argv[argc++] = !strcmp(a, "DIR") ? f->dir : a;
    va_end(ap);
    argv[argc] = NULL;

    fflush(stdout);
    fflush(stderr);
    fd_out = open(f->out, O_WRONLY | O_TRUNC);
    fd_err = open(f->err, O_WRONLY | O_TRUNC);
    assert_true(fd_out >= 0 && fd_err >= 0);
    saved_out = dup(1);
    saved_err = dup(2);
    dup2(fd_out, 1);
    dup2(fd_err, 2);
    status = thaw_cache_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    close(fd_out);
    close(fd_err);
    n = slurp(f->out, f->text, sizeof f->text);
    slurp(f->err, f->text + n, sizeof f->text - n);
    if (getenv("THAW_TEST_LOG"))
        fprintf(stderr, "  [thaw cache %s -> %d]\n%s", argv[1], status, f->text);
    return status;
}

static void assert_said(const struct fx *f, const char *what)
{
    if (!strstr(f->text, what))
        fail_msg("expected \"%s\" in:\n%s", what, f->text);
}


/* ---- tests -------------------------------------------------------------- */

/* ls, stats, verify and verify --dry-run report and exit 1, but leave every
 * byte, name and time as it was; a loose directory mode is only warned of. */
static void test_readers_change_nothing(void **state)
{
    struct fx *f = *state;
    struct snap before, after;
    char shown[17];

    assert_int_equal(chmod(f->dir, 0750), 0);
    snap_take(f->dir, &before);

    assert_int_equal(run(f, "verify", "DIR", NULL), 1);
    snprintf(shown, sizeof shown, "%.16s", f->hex[2]);
    assert_said(f, shown); /* the bad checksum, by key */
    snprintf(shown, sizeof shown, "%.16s", f->hex[3]);
    assert_said(f, shown); /* the bad .idx, found at open */
    assert_said(f, "--fix removes it");
    assert_said(f, "4 checked: 2 ok, 2 corrupt");
    snap_take(f->dir, &after);
    snap_assert_same(&before, &after, "verify");

    assert_int_equal(run(f, "verify", "DIR", "--dry-run", NULL), 1);
    snap_take(f->dir, &after);
    snap_assert_same(&before, &after, "verify --dry-run");

    /* The .idx found corrupt at open cannot be listed: still exit 1. */
    assert_int_equal(run(f, "ls", "DIR", NULL), 1);
    snprintf(shown, sizeof shown, "%.16s", f->hex[0]);
    assert_said(f, shown); /* what could be read is still listed */
    assert_said(f, "3 entries");
    assert_said(f, "1 unreadable or corrupt");
    assert_int_equal(run(f, "stats", "DIR", NULL), 1);
    assert_said(f, "entries           3");
    assert_said(f, "unreadable        1");
    snap_take(f->dir, &after);
    snap_assert_same(&before, &after, "ls/stats");
}

/* --fix removes what verify reported and sweeps the leftovers; the result
 * verifies, lists and counts clean (exit 0). --repair is the same. */
static void test_fix(void **state)
{
    struct fx *f = *state;
    char path[PATH_MAX];

    assert_int_equal(run(f, "verify", "DIR", "--fix", "--dry-run", NULL), 2);
    assert_true(exists(f, 2, ".idx"));

    assert_int_equal(run(f, "verify", "DIR", "--fix", NULL), 1);
    assert_said(f, "removed");
    for (int i = 2; i < 4; i++) {
        assert_false(exists(f, i, ".idx"));
        assert_false(exists(f, i, ".kv"));
    }
    assert_true(exists(f, 0, ".idx") && exists(f, 0, ".kv"));
    assert_true(exists(f, 1, ".idx") && exists(f, 1, ".kv"));
    assert_false(exists(f, 0, ".kv.tmp"));
    snprintf(path, sizeof path, "%s/%s.ckpt", f->dir,
             "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
    assert_int_equal(access(path, F_OK), -1);

    assert_int_equal(run(f, "verify", "DIR", NULL), 0);
    assert_said(f, "2 checked: 2 ok, 0 corrupt");
    assert_int_equal(run(f, "verify", "DIR", "--repair", NULL), 0);
    assert_int_equal(run(f, "ls", "DIR", NULL), 0);
    assert_int_equal(run(f, "stats", "DIR", NULL), 0);

    /* --repair removes as --fix does. */
    path_of(f, 1, ".kv", path);
    flip_byte(path, 10);
    assert_int_equal(run(f, "verify", "DIR", "--repair", NULL), 1);
    assert_false(exists(f, 1, ".idx"));
    assert_true(exists(f, 0, ".idx"));
}

/* Stores kv (n bytes) under key with the entry kinds the server gives
 * (entry_kind.h) and the model fingerprint fp. */
static void put(const char *dir, const uint8_t key[THAW_KEY_BYTES], const void *kv, size_t n, uint8_t fp)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_disk_cache *c = NULL;
    struct thaw_part_blob b[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};

    p.dir = dir;
    p.flags = THAW_DISK_CACHE_NO_WRITER;
    p.classify = thaw_entry_classify;
    memset(p.fingerprint, fp, sizeof p.fingerprint);
    assert_int_equal(thaw_disk_cache_open(&p, &c), 0);
    b[THAW_PART_KV].data = (void *)kv;
    b[THAW_PART_KV].size = n;
    assert_int_equal(thaw_disk_cache_store(c, key, 64, b, NULL, 0), 0);
    thaw_disk_cache_close(c);
}

/* stats on a hybrid's store (issue #38): a manifest names its blocks and
 * then its snapshots, and stats counts each as the kind it is on disk; it
 * said "missing blocks" for every snapshot (it knew only the magics of
 * blocks, manifests and whole states, and read .kv files itself). A named
 * block that is gone is still reported; another model's entries count the
 * same (the directory holds both). */
static void test_stats_counts_snapshots_a_manifest_names(void **state)
{
    struct fx *f = *state;
    uint8_t block[2][THAW_KEY_BYTES], snap[THAW_KEY_BYTES], man_key[THAW_KEY_BYTES];
    uint8_t blk[200] = "TKB1", sn[200] = {0};
    const uint32_t snap_head[] = {0x314e5354u, 1, 64, 32, 0, 0, 168, 0}; /* "TSN1": no tail, 168 bytes of state */
    int32_t toks[64] = {0};
    void *man = NULL;
    size_t n_man;
    char dir[64] = "/tmp/thaw-test-cli-hybrid-XXXXXX", setup_dir[sizeof f->dir];

    assert_non_null(mkdtemp(dir));
    memcpy(setup_dir, f->dir, sizeof setup_dir);
    memcpy(f->dir, dir, sizeof f->dir); /* what run() calls DIR */
    memset(block[0], 0xb0, THAW_KEY_BYTES);
    memset(block[1], 0xb1, THAW_KEY_BYTES);
    memset(snap, 0x5a, THAW_KEY_BYTES);
    memset(man_key, 0xee, THAW_KEY_BYTES);
    memcpy(sn, snap_head, sizeof snap_head);
    uint8_t ids[2][THAW_KEY_BYTES];
    memcpy(ids, block, sizeof ids);
    struct thaw_manifest m = {
        .version = THAW_MANIFEST_V1,
        .n_tokens = 64,
        .block_tokens = 32,
        .n_blocks = 2,
        .tokens = toks,
        .ids = ids[0],
        .n_snaps = 1,
        .snaps = snap,
    };
    assert_int_equal(thaw_manifest_encode(&m, &man, &n_man, NULL), 0);
    put(dir, block[0], blk, sizeof blk, 0);
    put(dir, block[1], blk, sizeof blk, 7); /* another model's: counted all the same */
    put(dir, snap, sn, sizeof sn, 0);
    put(dir, man_key, man, n_man, 0);
    thaw_blob_unref(man);

    assert_int_equal(run(f, "stats", "DIR", NULL), 0);
    assert_said(f, "conversations     1 (1 as manifests of blocks");
    assert_said(f, "blocks            2,");
    assert_said(f, "snapshots         1,");
    if (strstr(f->text, "missing"))
        fail_msg("nothing is missing:\n%s", f->text);
    /* a block gone: the manifest's conversation misses, and stats says so */
    assert_int_equal(run(f, "rm", "DIR", "b1b1b1b1", NULL), 0);
    assert_int_equal(run(f, "stats", "DIR", NULL), 0);
    assert_said(f, "blocks            1,");
    assert_said(f, "missing blocks    1 ");
    rm_rf(dir);
    memcpy(f->dir, setup_dir, sizeof f->dir);
}

static void test_usage(void **state)
{
    struct fx *f = *state;

    assert_int_equal(run(f, "ls", "DIR", "--fix", NULL), 2); /* verify's only */
    assert_int_equal(run(f, "verify", NULL), 2);
    assert_int_equal(run(f, "--help", NULL), 0);
    assert_said(f, "--fix");
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_readers_change_nothing),
        T(test_fix),
        T(test_stats_counts_snapshots_a_manifest_names),
        T(test_usage),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
