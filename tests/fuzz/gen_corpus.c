/* gen_corpus.c — writes the binary seed corpora of the fuzz targets, made by
 * the code that writes those files in the server, so that the seeds follow
 * the formats when they change.
 *
 *   gen_corpus OUTDIR   writes OUTDIR/fuzz_idx/<name>.idx and
 *                       OUTDIR/fuzz_kvstate/<name>.kv, .ckpt (directories made)
 *
 * Where each seed comes from:
 *   .idx   thaw_disk_cache_store() into a scratch cache directory under
 *          $TMPDIR (removed afterwards), then the <key>.idx it committed is
 *          copied: the real encoder (static in cache_disk.c), the real
 *          checksums of real parts. The clock and fingerprint are fixed, so
 *          a second run writes the same bytes.
 *   .ckpt  thaw_ckpt_serialize() of a hand-filled list.
 *   .kv    built here after the layout in kvstate.h: its only writer,
 *          thaw_kvstate_capture(), needs a llama context. State bytes are
 *          a fake pattern (llama's own are opaque to the parser).
 *   *-v2   a valid seed with format version 2 (and, for .idx, its
 *          self-checksum fixed up): the THAW_EVERSION paths.
 *
 * scripts/fuzz.sh builds and runs this into build-fuzz/ on every run, and
 * into tests/fuzz/corpus/ with --regen-seeds. Returns 0, or 1 with a message.
 */
#include "blob.h"
#include "cache_disk.h"
#include "error.h"
#include "kvstate.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define KV_MAGIC 0x31564b54u /* "TKV1", kvstate.h */
#define FIXED_NOW 1767225600 /* 2026-01-01T00:00:00Z: `created` in every .idx */

static const char *out_root;

/* Prints what failed; err is -errno or a thaw code (error.h). Returns 1. */
static int fail(const char *what, const char *path, int err)
{
    fprintf(stderr, "gen_corpus: %s %s: %s\n", what, path ? path : "", thaw_strerror(err));
    return 1;
}

static int mkdir_p(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return fail("mkdir", path, -errno);
    return 0;
}

static int write_seed(const char *target, const char *name, const void *data, size_t n)
{
    char path[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s/%s", out_root, target, name);
    if (!(f = fopen(path, "wb")))
        return fail("open", path, -errno);
    if (fwrite(data, 1, n, f) != n || fclose(f) != 0)
        return fail("write", path, errno ? -errno : -EIO);
    return 0;
}

/* Deterministic filler: what a state dump looks like to a parser (noise). */
static void fill(uint8_t *b, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b[i] = (uint8_t)(seed >> 16);
    }
}

/* ---- .kv ------------------------------------------------------------------ */

/* A .kv blob (kvstate.h layout) of n_tok tokens and n_state state bytes in
 * a blob (blob.h); *n gets its size. NULL when out of memory. */
static uint8_t *make_kv(uint32_t version, uint32_t n_tok, uint64_t n_state, size_t *n)
{
    uint32_t h[4] = {KV_MAGIC, version, n_tok, 0};
    size_t len = 24 + (size_t)n_tok * 4 + n_state;
    uint8_t *b = thaw_blob_alloc(len);

    if (!b)
        return NULL;
    memcpy(b, h, 16);
    memcpy(b + 16, &n_state, 8);
    for (uint32_t i = 0; i < n_tok; i++) {
        int32_t tok = (int32_t)((i * 7919u + 151643u) % 151936u); /* plausible vocab ids */
        memcpy(b + 24 + 4 * (size_t)i, &tok, 4);
    }
    fill(b + 24 + (size_t)n_tok * 4, n_state, n_tok);
    *n = len;
    return b;
}

/* ---- .ckpt ---------------------------------------------------------------- */

/* A .ckpt blob of `count` checkpoints (thaw_ckpt_serialize), *n its size. */
static uint8_t *make_ckpt(int count, size_t *n)
{
    struct thaw_ckpt_list l = {0};
    struct thaw_ckpt c[4];
    void *blob = NULL;

    l.v = c;
    l.n = l.cap = count;
    for (int i = 0; i < count; i++) {
        c[i].n_tokens = 32 * (i + 1);
        c[i].pos_min = c[i].n_tokens > 16 ? c[i].n_tokens - 16 : 0; /* a sliding window */
        c[i].pos_max = c[i].n_tokens - 1;
        c[i].size = 24 + 8 * (size_t)i;
        c[i].data = malloc(c[i].size);
        if (c[i].data)
            fill(c[i].data, c[i].size, 100u + (uint32_t)i);
    }
    for (int i = 0; i < count; i++)
        if (!c[i].data)
            goto out;
    if (thaw_ckpt_serialize(&l, &blob, n) != 0)
        blob = NULL;
out:
    for (int i = 0; i < count; i++)
        free(c[i].data);
    return blob;
}

static int gen_kvstate(void)
{
    static const struct {
        const char *name;
        uint32_t version, n_tok;
        uint64_t n_state;
    } kvs[] = {
        {"kv-1tok.kv", 1, 1, 16},
        {"kv-8tok.kv", 1, 8, 96},
        {"kv-100tok.kv", 1, 100, 512},
        {"kv-v2.kv", 2, 4, 32},
    };
    uint8_t *b;
    size_t n;
    int rc = 0;

    for (size_t i = 0; i < sizeof kvs / sizeof kvs[0] && !rc; i++) {
        if (!(b = make_kv(kvs[i].version, kvs[i].n_tok, kvs[i].n_state, &n)))
            return fail("out of memory", NULL, THAW_ENOMEM);
        rc = write_seed("fuzz_kvstate", kvs[i].name, b, n);
        thaw_blob_unref(b);
    }
    for (int count = 1; count <= 3 && !rc; count += 2) {
        char name[32];
        if (!(b = make_ckpt(count, &n)))
            return fail("out of memory", NULL, THAW_ENOMEM);
        snprintf(name, sizeof name, "ckpt-%d.ckpt", count);
        rc = write_seed("fuzz_kvstate", name, b, n);
        if (!rc && count == 1) {
            b[4] = 2; /* format version, kvstate.h */
            rc = write_seed("fuzz_kvstate", "ckpt-v2.ckpt", b, n);
        }
        thaw_blob_unref(b);
    }
    return rc;
}

/* ---- .idx ----------------------------------------------------------------- */

static int64_t fixed_now(void *ud)
{
    (void)ud;
    return FIXED_NOW;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[PATH_MAX];

    if (d) {
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int read_file(const char *path, uint8_t **out, size_t *n)
{
    FILE *f = fopen(path, "rb");
    uint8_t *b = NULL;
    long len;

    if (!f)
        return fail("open", path, -errno);
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(b = malloc((size_t)len + 1)) || fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        fclose(f);
        return fail("read", path, errno ? -errno : -EIO);
    }
    fclose(f);
    *out = b;
    *n = (size_t)len;
    return 0;
}

/* One entry as the engine stores it: which parts, meta, tokens, model. */
struct idx_seed {
    const char *name;
    int parts;          /* bit p: part p present */
    uint32_t n_tokens;
    size_t n_meta;
    uint8_t fp_byte;    /* the model fingerprint, as one repeated byte */
};

static int store_one(const char *dir, const struct idx_seed *s, int version)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    struct thaw_disk_cache *c = NULL;
    uint8_t key[THAW_KEY_BYTES], *meta = NULL, *rec = NULL;
    char hex[2 * THAW_KEY_BYTES + 1], path[PATH_MAX];
    size_t n_rec = 0;
    int rc;

    p.dir = dir;
    p.now = fixed_now;
    p.flags = THAW_DISK_CACHE_NO_WRITER;
    memset(p.fingerprint, s->fp_byte, sizeof p.fingerprint);
    fill(key, sizeof key, s->n_tokens ^ (uint32_t)s->parts);
    if ((rc = thaw_disk_cache_open(&p, &c)) != 0)
        return fail("thaw_disk_cache_open", dir, rc);
    if ((s->parts & 1) && !(parts[THAW_PART_KV].data = make_kv(1, s->n_tokens, 64, &parts[THAW_PART_KV].size)))
        goto oom;
    if ((s->parts & 2) && !(parts[THAW_PART_CKPT].data = make_ckpt(2, &parts[THAW_PART_CKPT].size)))
        goto oom;
    /* the draft's state is a .kv blob too (draft.h) */
    if ((s->parts & 4) && !(parts[THAW_PART_DFT].data = make_kv(1, s->n_tokens, 32, &parts[THAW_PART_DFT].size)))
        goto oom;
    if (s->n_meta) {
        if (!(meta = malloc(s->n_meta)))
            goto oom;
        fill(meta, s->n_meta, (uint32_t)s->n_meta);
    }
    if ((rc = thaw_disk_cache_store(c, key, s->n_tokens, parts, meta, s->n_meta)) != 0) {
        rc = fail("thaw_disk_cache_store", s->name, rc);
        goto out;
    }
    thaw_hex(key, sizeof key, hex);
    snprintf(path, sizeof path, "%s/%s.idx", dir, hex);
    if ((rc = read_file(path, &rec, &n_rec)) != 0)
        goto out;
    if (version != 1) { /* the version word at offset 8, then the trailer redone */
        uint32_t v = (uint32_t)version;
        uint64_t h;
        memcpy(rec + 8, &v, 4);
        h = XXH3_64bits(rec, n_rec - 8);
        memcpy(rec + n_rec - 8, &h, 8);
    }
    rc = write_seed("fuzz_idx", s->name, rec, n_rec);
    goto out;
oom:
    rc = fail("out of memory", NULL, THAW_ENOMEM);
out:
    free(rec);
    free(meta);
    for (int i = 0; i < THAW_PART_COUNT; i++)
        thaw_blob_unref(parts[i].data);
    thaw_disk_cache_close(c);
    return rc;
}

static int gen_idx(void)
{
    static const struct idx_seed seeds[] = {
        {"kv.idx", 1, 12, 0, 0xab},
        {"kv-ckpt.idx", 3, 300, 0, 0xab},
        {"kv-ckpt-dft.idx", 7, 2048, 0, 0xab},
        {"kv-dft.idx", 5, 1, 0, 0xab},
        {"kv-meta16.idx", 1, 40, 16, 0x11},
        {"kv-meta-max.idx", 3, 7, THAW_DISK_META_MAX, 0x5c},
    };
    static const struct idx_seed v2 = {"kv-v2.idx", 1, 12, 0, 0xab};
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    int rc = 0;

    snprintf(dir, sizeof dir, "%s/thaw-gen-corpus.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return fail("mkdtemp", dir, -errno);
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0] && !rc; i++)
        rc = store_one(dir, &seeds[i], 1);
    if (!rc)
        rc = store_one(dir, &v2, 2);
    rm_tree(dir);
    return rc;
}

int main(int argc, char **argv)
{
    char path[PATH_MAX];

    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
        return 2;
    }
    out_root = argv[1];
    if (mkdir_p(out_root))
        return 1;
    snprintf(path, sizeof path, "%s/fuzz_idx", out_root);
    if (mkdir_p(path))
        return 1;
    snprintf(path, sizeof path, "%s/fuzz_kvstate", out_root);
    if (mkdir_p(path))
        return 1;
    return gen_kvstate() || gen_idx() ? 1 : 0;
}
