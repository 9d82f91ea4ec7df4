/* test_blocks.c — a conversation's state as blocks plus a manifest, on the
 * real disk tier and a generated model (thaw mkmodel, plain attention):
 *   - a store writes each block once; a second conversation sharing the
 *     first blocks writes only what is new;
 *   - the manifest restores, into another slot, a state that decodes the
 *     next token exactly as the original;
 *   - a new prompt finds its longest run of stored blocks (prefix lookup);
 *   - a corrupt block is a miss for every manifest that names it, is
 *     removed, and the prefix run ends before it; a damaged manifest is
 *     refused; once the manifests are gone (what kvcache.c does with one
 *     that misses), the blocks they named are collected (cache_disk.c GC,
 *     with thaw_entry_classify telling blocks from manifests);
 *   - one manifest format for both extensions: version 1 with a hybrid's
 *     snapshots (named in the former reserved field), version 2 with SWA
 *     rows, and a version 1 without either each parse as what they are,
 *     and neither is taken for the other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <ggml-backend.h>
#include <llama.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/blob.h"
#include "base/error.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "cache/entry_kind.h"
#include "cache/manifest.h"
#include "fixture_models.h"
#include "llama/kvstate.h"

#define B 32u

static char g_dir[] = "/tmp/thaw_blocks_XXXXXX";
/* Both V layouts: per row (flash attention) and transposed, whose blocks
 * are read back as one run per embedding column. */
static enum llama_flash_attn_type g_fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
static char g_model[300], g_cache[300];
static struct llama_model *g_m;
static struct llama_context *g_ctx;
static int g_vocab;
static const uint8_t g_binding[32] = {1, 2, 3};

static int group_setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/thaw_blocks_XXXXXX");
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    snprintf(g_model, sizeof g_model, "%s/m.gguf", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    char *argv[] = {"mkmodel", "-o", g_model, "--arch", "llama", NULL};
    if (fixture_mkmodel(5, argv) != 0)
        return -1;
    g_m = llama_model_load_from_file(g_model, llama_model_default_params());
    if (!g_m)
        return -1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 3;
    cp.kv_unified = false;
    cp.flash_attn_type = g_fa;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.no_perf = true;
    g_ctx = llama_init_from_model(g_m, cp);
    g_vocab = llama_vocab_n_tokens(llama_model_get_vocab(g_m));
    return g_ctx ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    llama_free(g_ctx);
    llama_model_free(g_m);
    return fixture_llama_close(g_dir);
}

/* A conversation's tokens: `shared` tokens common to every seed, then its own. */
static void tokens(llama_token *t, int n, int shared, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = (llama_token)((i < shared ? 31 * i + 7 : 17 * i + 101 * seed + 3) % g_vocab);
}

/* Decodes t[0, n) at positions pos0.. into seq; returns the last logits (copied). */
static float *decode(llama_seq_id seq, const llama_token *t, int pos0, int n)
{
    struct llama_batch b = llama_batch_init(512, 0, 1);
    for (int done = 0; done < n;) {
        int k = n - done < 512 ? n - done : 512;
        for (int i = 0; i < k; i++) {
            b.token[i] = t[done + i];
            b.pos[i] = pos0 + done + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = seq;
            b.logits[i] = done + i == n - 1;
        }
        b.n_tokens = k;
        assert_int_equal(llama_decode(g_ctx, b), 0);
        done += k;
    }
    llama_batch_free(b);
    float *l = malloc((size_t)g_vocab * sizeof *l);
    memcpy(l, llama_get_logits_ith(g_ctx, -1), (size_t)g_vocab * sizeof *l);
    return l;
}

static uint8_t *state_of(llama_seq_id seq, size_t *n)
{
    *n = llama_state_seq_get_size(g_ctx, seq);
    uint8_t *s = malloc(*n);
    assert_int_equal(llama_state_seq_get_data(g_ctx, s, *n, seq), *n);
    return s;
}

static struct thaw_disk_cache *open_cache_at(const char *dir)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_disk_cache *c = NULL;
    p.dir = dir;
    p.classify = thaw_entry_classify;
    p.block_grace_s = 0;
    assert_int_equal(thaw_disk_cache_open(&p, &c), 0);
    return c;
}

static struct thaw_disk_cache *open_cache(void)
{
    return open_cache_at(g_cache);
}

static void frame(llama_seq_id seq, struct thaw_kvlayout_frame *f)
{
    f->seq_id = seq;
    f->n_stream = 3;
    f->stream = (uint32_t)seq;
}

/* Decodes a conversation into seq 0, stores it (blocks + manifest under key). */
static void store(struct thaw_disk_cache *c, const llama_token *t, int n, const uint8_t key[32],
                  struct thaw_blocks_stats *st)
{
    size_t n_state, n_man;
    void *man;
    llama_memory_seq_rm(llama_get_memory(g_ctx), 0, -1, -1);
    free(decode(0, t, 0, n));
    uint8_t *s = state_of(0, &n_state);
    assert_int_equal(thaw_blocks_store(&(struct thaw_blocks_store_params){.disk = c, .binding = g_binding, .block_tokens = B, .toks = t,
                                                              .n = n, .state = s, .n_state = n_state},
                                       &man, &n_man, st), 0);
    assert_true(thaw_manifest_is(man, n_man));
    /* its blocks are written and nothing names them yet, but they are held
     * (blocks.h): a pass with no grace takes none */
    thaw_disk_cache_flush(c);
    assert_int_equal(thaw_disk_cache_evict(c), 0);
    const uint8_t *ids;
    uint32_t n_ids;
    assert_int_equal(thaw_manifest_ids(man, n_man, &ids, &n_ids), 0);
    void *keep = thaw_blob_ref(man);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{man, n_man}, {NULL, 0}, {NULL, 0}};
    assert_int_equal(thaw_disk_cache_submit(c, key, (uint32_t)n, parts, NULL, 0), 0);
    thaw_disk_cache_unhold(c, ids, n_ids);
    thaw_blob_unref(keep);
    thaw_disk_cache_flush(c);
    assert_int_equal(thaw_disk_cache_evict(c), 0); /* named now */
    free(s);
}

/* Restores st into seq 1 and checks the next token decodes as `want`. */
static void restore_and_check(const struct thaw_blocks_state *st, llama_token next, const float *want)
{
    struct thaw_kvstate_view v;
    assert_int_equal(thaw_kvstate_parse(st->kv, st->n_kv, &v), 0);
    assert_int_equal(v.n_tokens, st->n_tokens);
    assert_int_equal(thaw_kvstate_restore(g_ctx, 1, &v), 0);
    float *got = decode(1, &next, st->n_tokens, 1);
    float diff = 0;
    for (int i = 0; i < g_vocab; i++)
        diff = fmaxf(diff, fabsf(got[i] - want[i]));
    assert_true(diff < 1e-3f);
    free(got);
}

static int count_files(const char *suffix)
{
    DIR *d = opendir(g_cache);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        n += strlen(de->d_name) > strlen(suffix) &&
             strcmp(de->d_name + strlen(de->d_name) - strlen(suffix), suffix) == 0;
    closedir(d);
    return n;
}

/* The prefix lookup of toks[0, n) under binding, for frame f (no window). */
static int prefix(struct thaw_disk_cache *c, const uint8_t binding[32], const llama_token *toks, int n,
                  const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    const struct thaw_blocks_prefix_params p = {
        .disk = c, .binding = binding, .block_tokens = B, .toks = toks, .n = n, .frame = f};
    return thaw_blocks_prefix(&p, out);
}

static void test_store_restore_share_prefix(void **state)
{
    (void)state;
    struct thaw_disk_cache *c = open_cache();
    struct thaw_blocks_stats st;
    llama_token a[200], b[220], probe[150];
    uint8_t ka[32] = {0xa}, kb[32] = {0xb};
    tokens(a, 200, 100, 1); /* 3 whole blocks shared with b (96 tokens) */
    tokens(b, 220, 100, 2);

    store(c, a, 200, ka, &st);
    assert_int_equal(st.written, 200 / B);
    assert_int_equal(st.skipped, 0);
    store(c, b, 220, kb, &st);
    assert_int_equal(st.skipped, 3); /* the shared prefix's blocks */
    assert_int_equal(st.written, 220 / B - 3);
    /* the same conversation again: nothing new */
    store(c, a, 200, ka, &st);
    assert_int_equal(st.written, 0);
    assert_int_equal(st.skipped, 200 / B);
    assert_int_equal(count_files(".kv"), 200 / B + 220 / B - 3 + 2);

    /* a's manifest -> slot 1: decodes the next token as a did in slot 0 */
    struct thaw_disk_entry *e;
    size_t n_man;
    assert_int_equal(thaw_disk_cache_lookup(c, ka, &e), 0);
    const void *man = thaw_disk_entry_part(e, THAW_PART_KV, &n_man);
    struct thaw_kvlayout_frame f;
    frame(1, &f);
    struct thaw_blocks_state bs;
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), 0);
    assert_int_equal(thaw_blocks_state_check(&bs), 0); /* every block's checksum */
    assert_int_equal(bs.n_tokens, 200);
    struct thaw_kvstate_view v;
    assert_int_equal(thaw_kvstate_parse(bs.kv, bs.n_kv, &v), 0);
    assert_memory_equal(v.tokens, a, sizeof a);
    llama_memory_seq_rm(llama_get_memory(g_ctx), 0, -1, -1);
    float *want = decode(0, a, 0, 200);
    free(want);
    llama_token next = 42;
    want = decode(0, &next, 200, 1);
    restore_and_check(&bs, next, want);
    free(want);
    thaw_blocks_state_free(&bs);

    /* damaged manifests are refused, never overread */
    uint8_t *copy = malloc(n_man);
    memcpy(copy, man, n_man);
    for (size_t cut = 0; cut < n_man; cut += n_man / 17 + 1)
        assert_int_not_equal(thaw_blocks_load(c, NULL, copy, cut, &f, &bs), 0);
    copy[12] ^= 0xff; /* block size */
    assert_int_not_equal(thaw_blocks_load(c, NULL, copy, n_man, &f, &bs), 0);
    free(copy);
    /* a manifest whose lengths add up but whose tail holds more or fewer
     * cells than its tokens need (found by fuzz_manifest: it loaded, a
     * state of 200 cells labelled 199 or 201 tokens) */
    for (int d = -1; d <= 1; d += 2) {
        size_t toks_end = 40 + 4 * (size_t)200, n_bad = n_man + 4 * (size_t)d;
        uint8_t *bad = calloc(1, n_bad);
        uint32_t n_bad_tokens = (uint32_t)(200 + d);
        memcpy(bad, man, toks_end + (d < 0 ? -4 : 0));
        memcpy(bad + 8, &n_bad_tokens, 4);
        memcpy(bad + toks_end + 4 * d, (const uint8_t *)man + toks_end, n_man - toks_end);
        assert_int_equal(thaw_manifest_ids(bad, n_bad, &(const uint8_t *){NULL}, &(uint32_t){0}), 0);
        assert_int_equal(thaw_blocks_load(c, NULL, bad, n_bad, &f, &bs), THAW_ECORRUPT);
        free(bad);
    }
    thaw_disk_entry_release(e);

    /* prefix lookup: a new prompt sharing 100 tokens finds 3 blocks (96) */
    tokens(probe, 150, 100, 3);
    assert_int_equal(prefix(c, g_binding, probe, 150, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, 96);
    assert_int_equal(bs.n_blocks, 3);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    llama_memory_seq_rm(llama_get_memory(g_ctx), 0, -1, -1);
    free(decode(0, probe, 0, 96));
    want = decode(0, &probe[96], 96, 1);
    restore_and_check(&bs, probe[96], want);
    free(want);
    thaw_blocks_state_free(&bs);
    /* another binding (model, tenant) shares nothing */
    uint8_t other[32] = {9};
    assert_int_equal(prefix(c, other, probe, 150, &f, &bs), THAW_ENOTFOUND);
    /* a whole stored conversation as a prompt: all but the last block's worth */
    assert_int_equal(prefix(c, g_binding, a, 200, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, 192);
    thaw_blocks_state_free(&bs);
    thaw_disk_cache_close(c);
}

/* Flips a byte in the data file of block k of toks. */
static void corrupt_block(const llama_token *toks, int n, int k)
{
    uint8_t ids[16][THAW_KEY_BYTES];
    char path[512], hex[65];
    thaw_blocks_ids(g_binding, B, toks, n, ids);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", ids[k][i]);
    snprintf(path, sizeof path, "%s/%s.kv", g_cache, hex);
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, 200, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 200, SEEK_SET);
    fputc(ch ^ 0x55, fp);
    fclose(fp);
}

static void test_corrupt_block_is_a_miss(void **state)
{
    (void)state;
    struct thaw_disk_cache *c = open_cache(); /* reopened: what the first test stored, after a "restart" */
    llama_token a[200], probe[150];
    uint8_t ka[32] = {0xa}, kb[32] = {0xb};
    struct thaw_disk_cache_stats s;
    struct thaw_kvlayout_frame f;
    struct thaw_blocks_state bs;
    struct thaw_disk_entry *e;
    size_t n_man;
    tokens(a, 200, 100, 1);
    tokens(probe, 150, 100, 3);
    frame(0, &f);

    /* the refcounts came back from the .idx records: nothing unnamed */
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.blocks, 200 / B + 220 / B - 3);
    assert_int_equal(s.blocks_unreferenced, 0);
    assert_int_equal(thaw_disk_cache_evict(c), 0);

    corrupt_block(a, 200, 2); /* shared by a, b and the probe */
    assert_int_equal(thaw_disk_cache_lookup(c, ka, &e), 0);
    const void *man = thaw_disk_entry_part(e, THAW_PART_KV, &n_man);
    /* read into place, then its checksum (alongside the install) fails */
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), 0);
    assert_int_equal(thaw_blocks_state_check(&bs), THAW_ECORRUPT);
    thaw_blocks_state_free(&bs);
    thaw_disk_entry_release(e);
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.corrupt_removed, 1);
    /* every manifest that names it misses */
    assert_int_equal(thaw_disk_cache_lookup(c, kb, &e), 0);
    man = thaw_disk_entry_part(e, THAW_PART_KV, &n_man);
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), THAW_ENOTFOUND);
    thaw_disk_entry_release(e);
    /* the bad block is gone; the prefix run now ends before it */
    assert_int_equal(prefix(c, g_binding, probe, 150, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, 64);
    thaw_blocks_state_free(&bs);
    corrupt_block(probe, 150, 0);
    assert_int_equal(prefix(c, g_binding, probe, 150, &f, &bs), 0);
    assert_int_equal(thaw_blocks_state_check(&bs), THAW_ECORRUPT);
    thaw_blocks_state_free(&bs);
    assert_int_equal(prefix(c, g_binding, probe, 150, &f, &bs), THAW_ENOTFOUND);
    /* kvcache.c removes a manifest that misses; then its blocks go */
    assert_int_equal(thaw_disk_cache_remove(c, ka), 0);
    assert_int_equal(thaw_disk_cache_remove(c, kb), 0);
    assert_int_equal(thaw_disk_cache_evict(c), 200 / B + 220 / B - 3 - 2); /* all but the two corrupt */
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.entries, 0);
    assert_int_equal(count_files(".kv"), 0);
    thaw_disk_cache_close(c);
}

/* ---- one manifest format: snapshots (v1) and SWA rows (v2) ---- */

static size_t lay_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvlayout_block_size(ud, a, b);
}

static int lay_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    return thaw_kvlayout_cut(ud, a, b, dst, cap);
}

static int lay_known(const void *ud, uint32_t a, uint32_t b)
{
    (void)ud;
    (void)a;
    (void)b;
    return 1;
}

static uint32_t u32_at(const void *m, size_t off)
{
    uint32_t v;
    memcpy(&v, (const uint8_t *)m + off, 4);
    return v;
}

/* The manifest of src over t[0, n) (its holds dropped: nothing is kept). */
static int store_manifest(struct thaw_disk_cache *c, const llama_token *t, int n, const struct thaw_blocks_src *src,
                          void **man, size_t *n_man)
{
    int rc = thaw_blocks_store(
        &(struct thaw_blocks_store_params){.disk = c, .binding = g_binding, .block_tokens = B, .toks = t, .n = n, .src = src},
        man, n_man, NULL);
    const uint8_t *ids;
    uint32_t n_ids;
    if (rc == 0 && thaw_manifest_ids(*man, *n_man, &ids, &n_ids) == 0)
        thaw_disk_cache_unhold(c, ids, n_ids);
    thaw_disk_cache_flush(c);
    return rc;
}

static void test_manifest_versions(void **state)
{
    (void)state;
    char dir[320];
    snprintf(dir, sizeof dir, "%s/versions", g_dir);
    struct thaw_disk_cache *c = open_cache_at(dir);
    const int n = 200;
    const uint32_t n_blocks = 200 / B, W = 64, swa_first_needed = (200 - 64) / B; /* 4 */
    llama_token t[200];
    size_t n_state, n_man;
    void *man;
    const uint8_t *ids, *snaps;
    uint32_t n_ids, n_snaps;
    struct thaw_kvlayout *l;
    struct thaw_kvlayout_frame f;
    struct thaw_blocks_state bs;
    tokens(t, n, 0, 7);
    frame(1, &f);
    llama_memory_seq_rm(llama_get_memory(g_ctx), 0, -1, -1);
    free(decode(0, t, 0, n));
    uint8_t *s = state_of(0, &n_state);
    assert_int_equal(thaw_kvlayout_parse(s, n_state, &l), 0);
    struct thaw_blocks_src plain = {.n_cells = (uint32_t)n, .size = lay_size, .cut = lay_cut, .ud = l};

    /* version 1 without either: what a store wrote before both (the
     * reserved word 0); it names its blocks and no snapshot, and loads */
    assert_int_equal(store_manifest(c, t, n, &plain, &man, &n_man), 0);
    assert_int_equal(u32_at(man, 4), 1);
    assert_int_equal(u32_at(man, 20), 0);
    assert_int_equal(thaw_manifest_ids(man, n_man, &ids, &n_ids), 0);
    assert_int_equal(n_ids, n_blocks);
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 0);
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), 0);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    assert_int_equal(bs.n_tokens, n);
    thaw_blocks_state_free(&bs);
    thaw_blob_unref(man);

    /* version 1 with snapshots (a hybrid's): n_snaps in the header's
     * former reserved field, their ids right after the block ids, no tail */
    uint8_t sn[2][THAW_KEY_BYTES];
    memset(sn[0], 0x5a, THAW_KEY_BYTES);
    memset(sn[1], 0xa5, THAW_KEY_BYTES);
    struct thaw_blocks_src hyb = plain;
    hyb.snaps = (const uint8_t(*)[THAW_KEY_BYTES])sn;
    hyb.n_snaps = 2;
    assert_int_equal(store_manifest(c, t, n, &hyb, &man, &n_man), 0);
    assert_int_equal(u32_at(man, 4), 1);
    assert_int_equal(u32_at(man, 20), 2);
    assert_int_equal(n_man, 40 + 4 * (size_t)n + (n_blocks + 2) * (size_t)THAW_KEY_BYTES);
    assert_int_equal(thaw_manifest_ids(man, n_man, &ids, &n_ids), 0);
    assert_int_equal(n_ids, n_blocks + 2); /* the collector keeps the snapshots too */
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 2);
    assert_ptr_equal(snaps, ids + (size_t)n_blocks * THAW_KEY_BYTES);
    assert_memory_equal(snaps, sn, sizeof sn);
    assert_int_equal(thaw_entry_classify(NULL, man, n_man, &ids, &n_ids), THAW_DISK_KIND_ROOT);
    assert_int_equal(n_ids, n_blocks + 2);
    /* its tail is the last snapshot's: snapshots.c loads it (test_snapshots.c) */
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), THAW_EINVAL);
    /* read as version 2 it is no SWA manifest */
    uint8_t *bad = malloc(n_man);
    memcpy(bad, man, n_man);
    bad[4] = 2;
    assert_int_equal(thaw_manifest_ids(bad, n_man, &ids, &n_ids), THAW_ECORRUPT);
    free(bad);
    thaw_blob_unref(man);

    /* version 2 (SWA rows; here the rows of section 0 stand in for them:
     * an SWA block has a block's format): the SWA header, the SWA ids
     * after the block ids, n_snaps 0 */
    struct thaw_blocks_src swa = plain;
    swa.swa_size = lay_size;
    swa.swa_cut = lay_cut;
    swa.swa_known = lay_known;
    swa.n_window = W;
    assert_int_equal(store_manifest(c, t, n, &swa, &man, &n_man), 0);
    assert_int_equal(u32_at(man, 4), 2);
    assert_int_equal(u32_at(man, 20), 0);
    assert_int_equal(u32_at(man, 40), 0);        /* swa_first: every block's rows were there */
    assert_int_equal(u32_at(man, 44), W);        /* n_window */
    assert_int_equal(thaw_manifest_ids(man, n_man, &ids, &n_ids), 0);
    assert_int_equal(n_ids, 2 * n_blocks);       /* blocks, then their SWA blocks */
    uint8_t sid[THAW_KEY_BYTES];
    thaw_blocks_swa_id(ids, sid);
    assert_memory_equal(ids + (size_t)n_blocks * THAW_KEY_BYTES, sid, THAW_KEY_BYTES);
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 0);
    /* it loads with an SWA section rebuilt from the window's SWA blocks */
    assert_int_equal(thaw_blocks_load(c, NULL, man, n_man, &f, &bs), 0);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    struct thaw_kvstate_view v;
    struct thaw_kvlayout *got;
    int32_t lo, hi;
    assert_int_equal(thaw_kvstate_parse(bs.kv, bs.n_kv, &v), 0);
    assert_int_equal(thaw_kvlayout_parse(v.state, v.n_state, &got), 0);
    assert_true(thaw_kvlayout_has_swa(got));
    assert_false(thaw_kvlayout_recurrent(got));
    assert_int_equal(thaw_kvlayout_swa_pos_range(got, &lo, &hi), 0);
    assert_int_equal(lo, (int32_t)(swa_first_needed * B));
    assert_int_equal(hi, n - 1);
    thaw_kvlayout_free(got);
    thaw_blocks_state_free(&bs);
    /* with a snapshot count it is neither: refused, never read as a hybrid's */
    size_t n_bad = n_man + THAW_KEY_BYTES, ids_end = 56 + 4 * (size_t)n + 2 * n_blocks * (size_t)THAW_KEY_BYTES;
    bad = calloc(1, n_bad);
    memcpy(bad, man, ids_end);
    memcpy(bad + ids_end + THAW_KEY_BYTES, (const uint8_t *)man + ids_end, n_man - ids_end);
    bad[20] = 1;
    assert_int_equal(thaw_manifest_ids(bad, n_bad, &ids, &n_ids), THAW_ECORRUPT);
    assert_int_equal(thaw_blocks_load(c, NULL, bad, n_bad, &f, &bs), THAW_ECORRUPT);
    free(bad);
    /* read as version 1 it is no manifest either */
    bad = malloc(n_man);
    memcpy(bad, man, n_man);
    bad[4] = 1;
    assert_int_equal(thaw_manifest_ids(bad, n_man, &ids, &n_ids), THAW_ECORRUPT);
    free(bad);
    thaw_blob_unref(man);

    /* a source with both is refused: no layout has a window and a recurrent state */
    struct thaw_blocks_src both = swa;
    both.snaps = (const uint8_t(*)[THAW_KEY_BYTES])sn;
    both.n_snaps = 2;
    assert_int_equal(store_manifest(c, t, n, &both, &man, &n_man), THAW_EINVAL);
    assert_null(man);

    thaw_kvlayout_free(l);
    free(s);
    thaw_disk_cache_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_restore_share_prefix),
        cmocka_unit_test(test_corrupt_block_is_a_miss),
        cmocka_unit_test(test_manifest_versions),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    g_fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    return failed + cmocka_run_group_tests(tests, group_setup, group_teardown);
}
