/* gen_corpus.c — writes the binary seed corpora of the fuzz targets, made by
 * the code that writes those files in the server, so that the seeds follow
 * the formats when they change.
 *
 *   gen_corpus OUTDIR   writes OUTDIR/fuzz_idx/<name>.idx,
 *                       OUTDIR/fuzz_kvstate/<name>.kv, .ckpt,
 *                       OUTDIR/fuzz_kvlayout/<name>.llstate, .tkb and
 *                       OUTDIR/fuzz_manifest/<name>.tmf (directories made)
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
 *   .llstate  a libllama sequence state built here after the layout in
 *          kvlayout.h (its writer is libllama, which needs a model): f16
 *          (and q8_0) K/V, 1-2 layers, V per row and transposed, cells with
 *          and without ext, one or three streams, with and without an SWA
 *          tail section. Each must parse with thaw_kvlayout_parse() and
 *          have the cells it was built with, or gen_corpus fails.
 *   .tkb   blocks cut from those states by thaw_kvlayout_cut().
 *   .tmf   manifests built here after the layout in blocks.h (the writer,
 *          thaw_blocks_store(), needs a disk cache with a writer thread),
 *          their tail blocks and SWA sections cut from the states above.
 *   *-v2   a valid seed with format version 2 (and, for .idx, its
 *          self-checksum fixed up): the THAW_EVERSION paths. For .idx,
 *          whose format is at version 2, that seed is *-v1 (the format
 *          before blocks) and *-v3.
 *
 * scripts/fuzz.sh builds and runs this into build-fuzz/ on every run, and
 * into tests/fuzz/corpus/ with --regen-seeds. Returns 0, or 1 with a message.
 */
#include "base/blob.h"
#include "base/error.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "llama/kvlayout.h"
#include "llama/kvstate.h"

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

/* ---- libllama states and blocks (fuzz_kvlayout) ------------------------- */

#define LLAMA_SEQ_MAGIC 0xaf143cd8u /* kvlayout.h */
#define TYPE_F16 1                  /* ggml_type: 2 bytes an element */
#define TYPE_Q8_0 8                 /* 34 bytes per block of 32 */
#define N_EMBD 8                    /* elements per cell per layer (K and V) */

/* A libllama state to build: section 0 with n_cells cells at positions
 * 0..n_cells-1, then (swa_cells > 0) an SWA section holding the last
 * swa_cells of them. */
struct state_seed {
    const char *name;
    uint32_t n_cells, n_layers, v_trans, ext, n_stream, stream, swa_cells;
    int32_t seq_id;
    int k_q8; /* K rows in q8_0 (untransposed V stays f16) */
};

struct wbuf {
    uint8_t *p;
    size_t n, cap;
};

static int wb_put(struct wbuf *w, const void *src, size_t n)
{
    if (w->cap - w->n < n) {
        size_t cap = (w->cap ? 2 * w->cap : 256) + n;
        uint8_t *p = realloc(w->p, cap);
        if (!p)
            return THAW_ENOMEM;
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
    return 0;
}

static int wb_u32(struct wbuf *w, uint32_t v)
{
    return wb_put(w, &v, 4);
}

static int wb_u64(struct wbuf *w, uint64_t v)
{
    return wb_put(w, &v, 8);
}

static int wb_fill(struct wbuf *w, size_t n, uint32_t seed)
{
    uint8_t b[4096];
    fill(b, n, seed);
    return wb_put(w, b, n);
}

/* One llama_kv_cache section (kvlayout.h) of cells at positions
 * pos0..pos0+n-1. */
static int put_section(struct wbuf *w, const struct state_seed *s, uint32_t pos0, uint32_t n, uint32_t seed)
{
    uint32_t krow = s->k_q8 ? 34 : 2 * N_EMBD, vrow = 2 * N_EMBD;
    int rc = wb_u32(w, s->n_stream);

    for (uint32_t st = 0; st < s->n_stream && !rc; st++) {
        rc = wb_u32(w, st == s->stream ? n : 0);
        if (st != s->stream || rc)
            continue;
        for (uint32_t i = 0; i < n && !rc; i++) {
            rc = wb_u32(w, pos0 + i) || wb_u32(w, 1);
            if (!rc && s->ext) /* x, y: M-RoPE image coordinates; tok */
                rc = wb_u32(w, i % 3) || wb_u32(w, i / 3) || wb_u32(w, 1000 + i);
            rc = rc || wb_u32(w, (uint32_t)s->seq_id);
        }
        rc = rc || wb_u32(w, s->v_trans) || wb_u32(w, s->n_layers);
        for (uint32_t l = 0; l < s->n_layers && !rc; l++)
            rc = wb_u32(w, s->k_q8 ? TYPE_Q8_0 : TYPE_F16) || wb_u64(w, krow) ||
                 wb_fill(w, (size_t)n * krow, seed + l);
        for (uint32_t l = 0; l < s->n_layers && !rc; l++) {
            rc = wb_u32(w, TYPE_F16);
            if (!rc && !s->v_trans)
                rc = wb_u64(w, vrow);
            else if (!rc)
                rc = wb_u32(w, 2) || wb_u32(w, N_EMBD); /* el, n_embd_v */
            rc = rc || wb_fill(w, (size_t)n * vrow, seed + 100 + l);
        }
    }
    return rc ? THAW_ENOMEM : 0;
}

/* The state s describes, verified by the parser; *out (free()) its bytes.
 * On 0 *l is the parsed layout (thaw_kvlayout_free). */
static int make_state(const struct state_seed *s, uint8_t **out, size_t *n, struct thaw_kvlayout **l)
{
    struct wbuf w = {0};
    int rc;

    if (wb_u32(&w, LLAMA_SEQ_MAGIC) || wb_u32(&w, (uint32_t)s->seq_id) || put_section(&w, s, 0, s->n_cells, 7) ||
        (s->swa_cells && put_section(&w, s, s->n_cells - s->swa_cells, s->swa_cells, 77))) {
        free(w.p);
        return fail("out of memory", NULL, THAW_ENOMEM);
    }
    if ((rc = thaw_kvlayout_parse(w.p, w.n, l)) != 0) {
        free(w.p);
        return fail("thaw_kvlayout_parse of the seed", s->name, rc);
    }
    if (thaw_kvlayout_n_cells(*l) != s->n_cells || thaw_kvlayout_n_layers(*l) != s->n_layers ||
        thaw_kvlayout_v_trans(*l) != (int)s->v_trans) {
        thaw_kvlayout_free(*l);
        free(w.p);
        return fail("the seed parses to another shape:", s->name, THAW_ELAYOUT);
    }
    *out = w.p;
    *n = w.n;
    return 0;
}

/* The block of cells [a, b) of l, written as seed `name` of `target`; with
 * version != 1 the version word is changed after the cut. */
static int cut_seed(const struct thaw_kvlayout *l, uint32_t a, uint32_t b, const char *target, const char *name,
                    uint16_t version)
{
    size_t n = thaw_kvlayout_block_size(l, a, b);
    uint8_t *blk = n ? malloc(n) : NULL;
    int rc;

    if (!blk)
        return fail("out of memory", name, THAW_ENOMEM);
    if ((rc = thaw_kvlayout_cut(l, a, b, blk, n)) != 0) {
        free(blk);
        return fail("thaw_kvlayout_cut", name, rc);
    }
    if (version != 1)
        memcpy(blk + 4, &version, 2);
    rc = write_seed(target, name, blk, n);
    free(blk);
    return rc;
}

static const struct state_seed states[] = {
    {"f16-l1-c4.llstate", 4, 1, 0, 0, 1, 0, 0, 0, 0},
    {"f16-l2-c5-vtrans.llstate", 5, 2, 1, 0, 1, 0, 0, 0, 0},
    {"f16-l2-c6-swa.llstate", 6, 2, 0, 0, 1, 0, 3, 0, 0},
    {"f16-l1-c3-vtrans-swa.llstate", 3, 1, 1, 0, 1, 0, 2, 0, 0},
    {"f16-l1-c3-ext.llstate", 3, 1, 0, 1, 1, 0, 0, 0, 0},
    {"f16-l2-c4-stream1of3.llstate", 4, 2, 1, 0, 3, 1, 0, 1, 0},
    {"q8k-l1-c2.llstate", 2, 1, 0, 0, 1, 0, 0, 0, 1},
};

static int gen_kvlayout(void)
{
    int rc = 0;

    for (size_t i = 0; i < sizeof states / sizeof states[0] && !rc; i++) {
        const struct state_seed *s = &states[i];
        struct thaw_kvlayout *l = NULL;
        uint8_t *b = NULL;
        size_t n;
        char name[64];
        if ((rc = make_state(s, &b, &n, &l)) != 0)
            return rc;
        rc = write_seed("fuzz_kvlayout", s->name, b, n);
        /* blocks: the first cell, and the rest (pos0 > 0) */
        snprintf(name, sizeof name, "%.*s-first.tkb", (int)(strlen(s->name) - 8), s->name);
        rc = rc || cut_seed(l, 0, 1, "fuzz_kvlayout", name, 1);
        snprintf(name, sizeof name, "%.*s-rest.tkb", (int)(strlen(s->name) - 8), s->name);
        rc = rc || cut_seed(l, 1, s->n_cells, "fuzz_kvlayout", name, 1);
        if (i == 0) {
            rc = rc || cut_seed(l, 0, s->n_cells, "fuzz_kvlayout", "f16-l1-c4-all.tkb", 1);
            rc = rc || cut_seed(l, 0, s->n_cells, "fuzz_kvlayout", "f16-l1-c4-v2.tkb", 2);
        }
        thaw_kvlayout_free(l);
        free(b);
    }
    return rc;
}

/* ---- manifests (fuzz_manifest) --------------------------------------------- */

/* A manifest (blocks.h) of n_tokens tokens in blocks of block_tokens, its
 * tail block cut from state seed `st`, and that state's SWA section when
 * `swa`; version != 1 for the THAW_EVERSION path. */
static int manifest_seed(const char *name, const struct state_seed *st, uint32_t block_tokens, int swa,
                         uint32_t version)
{
    struct thaw_kvlayout *l = NULL;
    struct wbuf w = {0};
    uint8_t *state = NULL, *tail = NULL;
    size_t n_state, n_tail = 0, n_swa = 0;
    const void *swa_p = NULL;
    uint32_t n_tokens = st->n_cells, n_blocks = n_tokens / block_tokens, a = n_blocks * block_tokens;
    int rc;

    if ((rc = make_state(st, &state, &n_state, &l)) != 0)
        return rc;
    if (swa)
        thaw_kvlayout_tail(l, &swa_p, &n_swa);
    if (a < n_tokens) {
        n_tail = thaw_kvlayout_block_size(l, a, n_tokens);
        if (!(tail = malloc(n_tail)) || thaw_kvlayout_cut(l, a, n_tokens, tail, n_tail) != 0) {
            rc = fail("cutting the tail of", name, THAW_ENOMEM);
            goto out;
        }
    }
    rc = wb_put(&w, "TMF1", 4) || wb_u32(&w, version) || wb_u32(&w, n_tokens) || wb_u32(&w, block_tokens) ||
         wb_u32(&w, n_blocks) || wb_u32(&w, 0) || wb_u64(&w, n_tail) || wb_u64(&w, n_swa);
    for (uint32_t i = 0; i < n_tokens && !rc; i++)
        rc = wb_u32(&w, (i * 7919u + 151643u) % 151936u);
    for (uint32_t k = 0; k < n_blocks && !rc; k++)
        rc = wb_fill(&w, THAW_KEY_BYTES, 500 + k); /* ids: no block is on the fuzzer's disk */
    rc = rc || (n_tail && wb_put(&w, tail, n_tail)) || (n_swa && wb_put(&w, swa_p, n_swa));
    rc = rc ? fail("out of memory", name, THAW_ENOMEM) : write_seed("fuzz_manifest", name, w.p, w.n);
out:
    free(w.p);
    free(tail);
    thaw_kvlayout_free(l);
    free(state);
    return rc;
}

static int gen_manifest(void)
{
    return manifest_seed("c5-b2-tail.tmf", &states[1], 2, 0, 1) || /* 2 ids, tail of 1 cell */
           manifest_seed("c4-b2.tmf", &states[0], 2, 0, 1) ||      /* 2 ids, no tail */
           manifest_seed("c4-b8-tail-only.tmf", &states[0], 8, 0, 1) || /* no ids: loads */
           manifest_seed("c3-b4-ext.tmf", &states[4], 4, 0, 1) ||
           manifest_seed("c6-b16-swa.tmf", &states[2], 16, 1, 1) || /* loads, with an SWA window */
           manifest_seed("c6-b4-swa.tmf", &states[2], 4, 1, 1) ||
           manifest_seed("c4-b8-v2.tmf", &states[0], 8, 0, 2);
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
    int kind;           /* 0 a root naming nothing, 1 a block, 2 a root naming n_refs blocks */
    uint32_t n_refs;
};

/* cache_disk.h's classify for a seed: what struct idx_seed says. */
static int seed_classify(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs)
{
    const struct idx_seed *s = ud;

    (void)n;
    if (s->kind == 1)
        return THAW_DISK_KIND_BLOCK;
    if (s->kind == 2) {
        *refs = kv; /* any n_refs x 32 bytes of the state will do as keys */
        *n_refs = s->n_refs;
    }
    return THAW_DISK_KIND_ROOT;
}

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
    p.classify = seed_classify;
    p.classify_ud = (void *)s;
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
    if (version != 2) { /* the version word at offset 8, then the trailer redone */
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
        {"kv.idx", 1, 12, 0, 0xab, 0, 0},
        {"kv-ckpt.idx", 3, 300, 0, 0xab, 0, 0},
        {"kv-ckpt-dft.idx", 7, 2048, 0, 0xab, 0, 0},
        {"kv-dft.idx", 5, 1, 0, 0xab, 0, 0},
        {"kv-meta16.idx", 1, 40, 16, 0x11, 0, 0},
        {"kv-meta-max.idx", 3, 7, THAW_DISK_META_MAX, 0x5c, 0, 0},
        {"block.idx", 1, 128, 0, 0xab, 1, 0},
        {"manifest-refs3.idx", 1, 400, 0, 0xab, 2, 3},
        {"manifest-refs-meta.idx", 3, 300, 16, 0x11, 2, 2},
    };
    static const struct idx_seed v1 = {"kv-v1.idx", 1, 12, 0, 0xab, 0, 0},
                                  v3 = {"kv-v3.idx", 1, 12, 0, 0xab, 0, 0};
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    int rc = 0;

    snprintf(dir, sizeof dir, "%s/thaw-gen-corpus.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return fail("mkdtemp", dir, -errno);
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0] && !rc; i++)
        rc = store_one(dir, &seeds[i], 2);
    if (!rc)
        rc = store_one(dir, &v1, 1);
    if (!rc)
        rc = store_one(dir, &v3, 3);
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
    static const char *const targets[] = {"fuzz_kvstate", "fuzz_kvlayout", "fuzz_manifest"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out_root, targets[i]);
        if (mkdir_p(path))
            return 1;
    }
    return gen_kvstate() || gen_idx() || gen_kvlayout() || gen_manifest() ? 1 : 0;
}
