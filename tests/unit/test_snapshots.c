/* test_snapshots.c — a hybrid's recurrent state as snapshots (snapshots.h),
 * on the real disk tier and a generated lfm2 model (thaw mkmodel: short
 * convolutions, attention every 3rd layer):
 *   - the id names the whole prefix [0, p): the chain id of the last whole
 *     block, p and the tokens past that block; nothing else;
 *   - the codec: a snapshot parses into its tail and recurrent state, and
 *     every header whose lengths, tail or version do not fit is refused;
 *   - placement: a store names a snapshot at each checkpoint flagged as a
 *     snapshot position and at the state's own end, not at the others (a
 *     prompt's end), and a second conversation sharing the branch point
 *     writes neither its blocks nor its snapshot again;
 *   - a prefix lookup resumes at the deepest snapshot inside the prompt,
 *     and the state it assembles decodes the next token as the
 *     conversation did; a damaged snapshot is removed and the next
 *     shallower one serves; the manifest's snapshots come back as the
 *     slot's checkpoints;
 *   - GC: a snapshot lives while a manifest names it and goes with the
 *     last one (cache_disk.c with thaw_entry_classify).
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

#include "base/blob.h"
#include "base/error.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "cache/entry_kind.h"
#include "cache/manifest.h"
#include "cache/snapshots.h"
#include "cache/tiers.h"
#include "fixture_models.h"
#include "llama/kvstate.h"

#define B 32u

static char g_dir[] = "/tmp/thaw_snapshots_XXXXXX";
static char g_model[300], g_cache[300];
static struct llama_model *g_m;
static struct llama_context *g_ctx;
static int g_vocab;
static const uint8_t g_binding[32] = {4, 5, 6};

static int group_setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/thaw_snapshots_XXXXXX");
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    snprintf(g_model, sizeof g_model, "%s/m.gguf", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    char *argv[] = {"mkmodel", "-o", g_model, "--arch", "lfm2", "--layers", "4", NULL};
    if (fixture_mkmodel(7, argv) != 0)
        return -1;
    g_m = llama_model_load_from_file(g_model, llama_model_default_params());
    if (!g_m)
        return -1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 2;
    cp.kv_unified = false;
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

/* Decodes t[0, n) at positions pos0.. into seq as one batch; returns the
 * last logits (copied). */
static float *decode(llama_seq_id seq, const llama_token *t, int pos0, int n)
{
    struct llama_batch b = llama_batch_init(512, 0, 1);
    assert_true(n <= 512);
    for (int i = 0; i < n; i++) {
        b.token[i] = t[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq;
        b.logits[i] = i == n - 1;
    }
    b.n_tokens = n;
    assert_int_equal(llama_decode(g_ctx, b), 0);
    llama_batch_free(b);
    float *l = malloc((size_t)g_vocab * sizeof *l);
    memcpy(l, llama_get_logits_ith(g_ctx, -1), (size_t)g_vocab * sizeof *l);
    return l;
}

static void clear(llama_seq_id seq)
{
    llama_memory_seq_rm(llama_get_memory(g_ctx), seq, -1, -1);
}

static struct thaw_disk_cache *open_cache(void)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct thaw_disk_cache *c = NULL;
    p.dir = g_cache;
    p.classify = thaw_entry_classify;
    p.block_grace_s = 0;
    assert_int_equal(thaw_disk_cache_open(&p, &c), 0);
    return c;
}

static void frame(llama_seq_id seq, struct thaw_kvlayout_frame *f)
{
    f->seq_id = seq;
    f->n_stream = 2;
    f->stream = (uint32_t)seq;
}

static void sid_at(const llama_token *t, uint32_t p, uint8_t out[THAW_KEY_BYTES])
{
    uint8_t ids[64][THAW_KEY_BYTES];
    thaw_blocks_ids(g_binding, B, t, (int)p, ids);
    thaw_snapshots_id(g_binding, B, p >= B ? ids[p / B - 1] : NULL, t, p, out);
}

static void path_of(const uint8_t id[THAW_KEY_BYTES], char *path, size_t n)
{
    char hex[2 * THAW_KEY_BYTES + 1];
    for (int i = 0; i < THAW_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
    snprintf(path, n, "%s/%s.kv", g_cache, hex);
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

/* ---- ids ---- */

static void test_id_names_the_prefix(void **state)
{
    (void)state;
    llama_token a[100], b[100];
    uint8_t prev[THAW_KEY_BYTES] = {1}, prev2[THAW_KEY_BYTES] = {2}, x[THAW_KEY_BYTES], y[THAW_KEY_BYTES];
    tokens(a, 100, 100, 1);
    memcpy(b, a, sizeof a);

    thaw_snapshots_id(g_binding, B, prev, a, 70, x);
    thaw_snapshots_id(g_binding, B, prev, b, 70, y);
    assert_memory_equal(x, y, sizeof x); /* deterministic */
    /* the tokens before the last whole block count only through its id */
    b[10] ^= 1;
    thaw_snapshots_id(g_binding, B, prev, b, 70, y);
    assert_memory_equal(x, y, sizeof x);
    thaw_snapshots_id(g_binding, B, prev2, a, 70, y);
    assert_memory_not_equal(x, y, sizeof x);
    /* a token in [64, 70) counts; one at or past p does not */
    memcpy(b, a, sizeof a);
    b[65] ^= 1;
    thaw_snapshots_id(g_binding, B, prev, b, 70, y);
    assert_memory_not_equal(x, y, sizeof x);
    memcpy(b, a, sizeof a);
    b[70] ^= 1;
    thaw_snapshots_id(g_binding, B, prev, b, 70, y);
    assert_memory_equal(x, y, sizeof x);
    /* another position, another binding */
    thaw_snapshots_id(g_binding, B, prev, a, 71, y);
    assert_memory_not_equal(x, y, sizeof x);
    uint8_t other[32] = {9};
    thaw_snapshots_id(other, B, prev, a, 70, y);
    assert_memory_not_equal(x, y, sizeof x);
    /* below the first block there is no previous block: prev is ignored */
    thaw_snapshots_id(g_binding, B, NULL, a, 20, x);
    thaw_snapshots_id(g_binding, B, prev, a, 20, y);
    assert_memory_equal(x, y, sizeof x);
    /* at a block boundary: the block's own id and no tokens; distinct from
     * the block id itself (a snapshot and a block never share a name) */
    uint8_t ids[3][THAW_KEY_BYTES];
    thaw_blocks_ids(g_binding, B, a, 96, ids);
    thaw_snapshots_id(g_binding, B, ids[2], a, 96, x);
    assert_memory_not_equal(x, ids[2], sizeof x);
    thaw_snapshots_id(g_binding, B, ids[1], a, 96, y);
    assert_memory_not_equal(x, y, sizeof x);
}

/* ---- the codec ---- */

struct hdr {
    uint32_t magic, version, n_tokens, block_tokens;
    uint64_t tail_size, rec_size;
};

static size_t make(uint8_t *buf, struct hdr h, size_t tail, size_t rec)
{
    memcpy(buf, &h, sizeof h);
    memset(buf + sizeof h, 0x11, tail);
    memset(buf + sizeof h + tail, 0x22, rec);
    return sizeof h + tail + rec;
}

static void test_codec(void **state)
{
    (void)state;
    uint8_t buf[256];
    struct thaw_snapshot_view v;
    const struct hdr ok = {0x314e5354u, 1, 40, B, 8, 16};
    size_t n = make(buf, ok, 8, 16);

    assert_true(thaw_snapshots_is(buf, n));
    assert_int_equal(thaw_snapshots_parse(buf, n, &v), 0);
    assert_int_equal(v.n_tokens, 40);
    assert_int_equal(v.block_tokens, B);
    assert_ptr_equal(v.tail, buf + sizeof ok);
    assert_int_equal(v.tail_size, 8);
    assert_ptr_equal(v.rec, buf + sizeof ok + 8);
    assert_int_equal(v.rec_size, 16);
    /* at a block boundary: no tail */
    struct hdr h = ok;
    h.n_tokens = 64;
    h.tail_size = 0;
    n = make(buf, h, 0, 16);
    assert_int_equal(thaw_snapshots_parse(buf, n, &v), 0);
    assert_null(v.tail);
    assert_int_equal(v.tail_size, 0);

    /* truncated anywhere, or one byte too many: refused, never overread */
    n = make(buf, ok, 8, 16);
    for (size_t cut = 0; cut < n; cut++)
        assert_int_not_equal(thaw_snapshots_parse(buf, cut, &v), 0);
    assert_int_equal(thaw_snapshots_parse(buf, n + 1, &v), THAW_ECORRUPT);
    assert_false(thaw_snapshots_is(buf, sizeof ok - 1));
    /* each header that does not fit its body */
    struct hdr bad[] = {
        {0x314e5355u, 1, 40, B, 8, 16},  /* magic */
        {0x314e5354u, 1, 0, B, 8, 16},   /* no tokens */
        {0x314e5354u, 1, 40, 0, 8, 16},  /* no block size */
        {0x314e5354u, 1, 40, B, 8, 0},   /* no recurrent state */
        {0x314e5354u, 1, 64, B, 8, 16},  /* a tail at a block boundary */
        {0x314e5354u, 1, 40, B, 0, 24},  /* no tail past one */
        {0x314e5354u, 1, 40, B, 24, 0},  /* the lengths add up, the parts do not */
        {0x314e5354u, 1, 40, B, ~0ull, 25}, /* lengths that wrap */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        n = make(buf, ok, 8, 16);
        memcpy(buf, &bad[i], sizeof bad[i]);
        assert_int_equal(thaw_snapshots_parse(buf, n, &v), THAW_ECORRUPT);
    }
    h = ok;
    h.version = 2;
    n = make(buf, h, 8, 16);
    assert_int_equal(thaw_snapshots_parse(buf, n, &v), THAW_EVERSION);
}

/* ---- placement, store and restore ---- */

#define N_A 150
#define BRANCH 70 /* the end of the leading system messages */
#define PROMPT 100 /* the end of turn 1's prompt: a checkpoint, no snapshot */

/* Decodes t[0, n) into seq 0 as a slot would (stopping at the branch point
 * and at the prompt's end, checkpointing at both), captures the state and
 * stores it; the manifest goes in under key. Returns the manifest (a blob). */
static void *store_ex(struct thaw_disk_cache *c, const llama_token *t, int n, const uint8_t key[32],
                      struct thaw_blocks_stats *st, size_t *n_man, struct thaw_snapshot_pending *defer)
{
    struct thaw_ckpt_list ckl = {0};
    void *ckpt = NULL, *man = NULL;
    size_t n_ckpt = 0;
    clear(0);
    free(decode(0, t, 0, BRANCH));
    assert_int_equal(thaw_ckpt_take(&ckl, g_ctx, 0, BRANCH, 8), 0);
    ckl.v[ckl.n - 1].flags |= THAW_CKPT_SNAPSHOT;
    free(decode(0, t + BRANCH, BRANCH, PROMPT - BRANCH));
    assert_int_equal(thaw_ckpt_take(&ckl, g_ctx, 0, PROMPT, 8), 0);
    free(decode(0, t + PROMPT, PROMPT, n - PROMPT));
    assert_int_equal(thaw_ckpt_serialize(&ckl, &ckpt, &n_ckpt), 0);
    size_t n_state = llama_state_seq_get_size(g_ctx, 0);
    uint8_t *s = malloc(n_state);
    assert_int_equal(llama_state_seq_get_data(g_ctx, s, n_state, 0), n_state);
    const struct thaw_blocks_store_params p = {
        .disk = c, .binding = g_binding, .block_tokens = B, .toks = t, .n = n, .state = s, .n_state = n_state};
    assert_int_equal(thaw_snapshots_store(&p, ckpt, n_ckpt, &man, n_man, defer, st), 0);
    assert_true(thaw_manifest_is(man, *n_man));
    const uint8_t *ids;
    uint32_t n_ids;
    assert_int_equal(thaw_manifest_ids(man, *n_man, &ids, &n_ids), 0);
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{thaw_blob_ref(man), *n_man}, {NULL, 0}, {NULL, 0}};
    assert_int_equal(thaw_disk_cache_submit(c, key, (uint32_t)n, parts, NULL, 0), 0);
    thaw_disk_cache_unhold(c, ids, n_ids);
    thaw_disk_cache_flush(c);
    assert_int_equal(thaw_disk_cache_evict(c), 0); /* named: nothing goes */
    thaw_blob_unref(ckpt);
    thaw_ckpt_clear(&ckl);
    free(s);
    return man;
}

static void *store(struct thaw_disk_cache *c, const llama_token *t, int n, const uint8_t key[32],
                   struct thaw_blocks_stats *st, size_t *n_man)
{
    return store_ex(c, t, n, key, st, n_man, NULL);
}

/* The prefix lookup of toks[0, n) under binding, for frame f. */
static int prefix(struct thaw_disk_cache *c, const uint8_t binding[32], const llama_token *toks, int n,
                  const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out)
{
    const struct thaw_blocks_prefix_params p = {
        .disk = c, .binding = binding, .block_tokens = B, .toks = toks, .n = n, .frame = f};
    return thaw_snapshots_prefix(&p, out);
}

/* Installs st into seq 1; the next token must decode as `want`. */
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

/* The reference: t[0, p) decoded as one batch (as the store decoded the
 * prefix up to each snapshot), then t[p]'s logits. */
static float *reference(const llama_token *t, int p)
{
    clear(0);
    free(decode(0, t, 0, p));
    return decode(0, t + p, p, 1);
}

static void test_store_places_and_restores(void **state)
{
    (void)state;
    struct thaw_disk_cache *c = open_cache();
    struct thaw_blocks_stats st;
    llama_token a[N_A], b[N_A], probe[120], whole[N_A + 1];
    uint8_t ka[32] = {0xa}, kb[32] = {0xb}, s70[32], s150[32];
    const uint8_t *snaps;
    uint32_t n_snaps;
    size_t n_man;
    tokens(a, N_A, 80, 1); /* a and b share [0, 80): the branch point and two blocks */
    tokens(b, N_A, 80, 2);
    sid_at(a, BRANCH, s70);
    sid_at(a, N_A, s150);

    void *man = store(c, a, N_A, ka, &st, &n_man);
    /* the blocks, and two snapshots: the branch point and the end; not
     * the prompt's end (stored, it would add a tail every turn) */
    assert_int_equal(st.written, N_A / B + 2);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 2);
    assert_memory_equal(snaps, s70, 32);
    assert_memory_equal(snaps + 32, s150, 32);
    assert_int_equal(count_files(".kv"), N_A / B + 2 + 1);
    /* each snapshot holds the cells past its last whole block, then the
     * recurrent state */
    struct thaw_snapshot_view v;
    void *blob;
    size_t n;
    assert_int_equal(thaw_tiers_fetch(c, NULL, s70, &blob, &n), 0);
    assert_int_equal(thaw_snapshots_parse(blob, n, &v), 0);
    assert_int_equal(v.n_tokens, BRANCH);
    assert_int_equal(v.block_tokens, B);
    uint32_t pos0, n_cells;
    assert_int_equal(thaw_kvlayout_block_info(v.tail, v.tail_size, &pos0, &n_cells), 0);
    assert_int_equal(pos0, 64);
    assert_int_equal(n_cells, BRANCH - 64);
    size_t rec = v.rec_size;
    assert_true(rec > 0);
    thaw_blob_unref(blob);
    assert_int_equal(thaw_tiers_fetch(c, NULL, s150, &blob, &n), 0);
    assert_int_equal(thaw_snapshots_parse(blob, n, &v), 0);
    assert_int_equal(v.n_tokens, N_A);
    assert_int_equal(thaw_kvlayout_block_info(v.tail, v.tail_size, &pos0, &n_cells), 0);
    assert_int_equal(pos0, 128);
    assert_int_equal(n_cells, N_A - 128);
    assert_int_equal(v.rec_size, rec); /* a recurrent state has one size at any position */
    thaw_blob_unref(blob);

    /* the manifest's snapshots as the slot's checkpoints, flagged so the
     * next store names them again */
    void *ck;
    size_t n_ck;
    struct thaw_ckpt_list l = {0};
    assert_int_equal(thaw_snapshots_ckpts(c, NULL, man, n_man, 1, &ck, &n_ck), 0);
    assert_int_equal(thaw_ckpt_parse(ck, n_ck, &l), 0);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.v[0].n_tokens, BRANCH);
    assert_int_equal(l.v[1].n_tokens, N_A);
    assert_true(l.v[0].flags & THAW_CKPT_SNAPSHOT);
    assert_true(l.v[1].flags & THAW_CKPT_SNAPSHOT);
    thaw_ckpt_clear(&l);
    thaw_blob_unref(ck);
    thaw_blob_unref(man);

    /* b shares the branch point: its blocks 0-1 and that snapshot are not
     * written again */
    man = store(c, b, N_A, kb, &st, &n_man);
    assert_int_equal(st.skipped, 2 + 1);
    assert_int_equal(st.written, N_A / B - 2 + 1);
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 2);
    assert_memory_equal(snaps, s70, 32);
    thaw_blob_unref(man);

    /* a new prompt sharing [0, 80) resumes at the branch point (70), the
     * deepest snapshot inside it; it decodes on as the conversation did */
    struct thaw_kvlayout_frame f;
    struct thaw_blocks_state bs;
    frame(1, &f);
    tokens(probe, 120, 80, 3);
    assert_int_equal(prefix(c, g_binding, probe, 120, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, BRANCH);
    assert_int_equal(bs.n_blocks, 2);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    float *want = reference(probe, BRANCH);
    restore_and_check(&bs, probe[BRANCH], want);
    free(want);
    thaw_blocks_state_free(&bs);
    /* a's whole conversation and one more token: at a's end */
    memcpy(whole, a, sizeof a);
    whole[N_A] = 5;
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, N_A);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    thaw_blocks_state_free(&bs);
    /* another binding shares nothing; a prompt that diverges before the
     * branch point has no snapshot to resume at */
    uint8_t other[32] = {9};
    assert_int_equal(prefix(c, other, probe, 120, &f, &bs), THAW_ENOTFOUND);
    tokens(probe, 120, 60, 4);
    assert_int_equal(prefix(c, g_binding, probe, 120, &f, &bs), THAW_ENOTFOUND);
    thaw_disk_cache_close(c);
}

static void test_damaged_snapshot_falls_back_and_gc(void **state)
{
    (void)state;
    struct thaw_disk_cache *c = open_cache(); /* what the last test stored, after a "restart" */
    struct thaw_disk_cache_stats s;
    struct thaw_kvlayout_frame f;
    struct thaw_blocks_state bs;
    llama_token a[N_A], whole[N_A + 1];
    uint8_t ka[32] = {0xa}, kb[32] = {0xb}, s70[32], s150[32];
    char path[512];
    tokens(a, N_A, 80, 1);
    memcpy(whole, a, sizeof a);
    whole[N_A] = 5;
    sid_at(a, BRANCH, s70);
    sid_at(a, N_A, s150);
    frame(1, &f);

    /* the refcounts came back from the .idx records: nothing unnamed */
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.blocks, (N_A / B) * 2 - 2 + 3); /* a's and b's blocks, 3 snapshots */
    assert_int_equal(s.blocks_unreferenced, 0);

    /* a damaged end-of-turn snapshot: removed, and the lookup resumes at
     * the next shallower one (the branch point) instead */
    path_of(s150, path, sizeof path);
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, 100, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 100, SEEK_SET);
    fputc(ch ^ 0x55, fp);
    fclose(fp);
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, BRANCH);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    float *want = reference(whole, BRANCH);
    restore_and_check(&bs, whole[BRANCH], want);
    free(want);
    thaw_blocks_state_free(&bs);
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.corrupt_removed, 1);
    assert_false(thaw_disk_cache_has(c, s150));
    /* a's manifest now names a snapshot that is gone: its checkpoints are
     * none at all rather than some */
    struct thaw_disk_entry *e;
    size_t n_man, n_ck;
    void *ck;
    assert_int_equal(thaw_disk_cache_lookup(c, ka, &e), 0);
    const void *man = thaw_disk_entry_part(e, THAW_PART_KV, &n_man);
    assert_int_equal(thaw_snapshots_ckpts(c, NULL, man, n_man, 1, &ck, &n_ck), THAW_ENOTFOUND);
    thaw_disk_entry_release(e);

    /* GC: without a's manifest its own blocks go, the branch point's
     * snapshot (b names it too) stays */
    assert_int_equal(thaw_disk_cache_remove(c, ka), 0);
    assert_int_equal(thaw_disk_cache_evict(c), N_A / B - 2);
    assert_true(thaw_disk_cache_has(c, s70));
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, BRANCH);
    thaw_blocks_state_free(&bs);
    /* and with b's, everything */
    assert_int_equal(thaw_disk_cache_remove(c, kb), 0);
    assert_int_equal(thaw_disk_cache_evict(c), N_A / B + 2);
    assert_false(thaw_disk_cache_has(c, s70));
    thaw_disk_cache_get_stats(c, &s);
    assert_int_equal(s.entries, 0);
    assert_int_equal(count_files(".kv"), 0);
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), THAW_ENOTFOUND);
    thaw_disk_cache_close(c);
}

/* The turn's end kept back (snapshots.h, "Written when"): the blocks, the
 * branch point's snapshot and the manifest naming the end's are written;
 * the end's only on flush, under the id the manifest names. Before it, the
 * manifest does not load and a prefix lookup resumes at the branch point;
 * after it, both reach the end. */
static void test_turn_end_kept_until_flushed(void **state)
{
    (void)state;
    struct thaw_disk_cache *c = open_cache();
    struct thaw_snapshot_pending pd;
    struct thaw_blocks_stats st;
    struct thaw_kvlayout_frame f;
    struct thaw_blocks_state bs;
    llama_token a[N_A], whole[N_A + 1];
    uint8_t ka[32] = {0xc}, s150[32];
    const uint8_t *snaps;
    uint32_t n_snaps;
    size_t n_man, n = 0;
    tokens(a, N_A, 80, 5);
    sid_at(a, N_A, s150);
    memcpy(whole, a, sizeof a);
    whole[N_A] = 7;
    frame(1, &f);

    void *man = store_ex(c, a, N_A, ka, &st, &n_man, &pd);
    assert_int_equal(st.written, N_A / B + 1); /* the blocks and the branch point's */
    assert_non_null(pd.blob);
    assert_int_equal(pd.p, N_A);
    assert_memory_equal(pd.id, s150, 32);
    assert_false(thaw_disk_cache_has(c, s150));
    assert_int_equal(thaw_manifest_snaps(man, n_man, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 2);
    assert_memory_equal(snaps + 32, s150, 32); /* named all the same */
    assert_int_equal(thaw_snapshots_load(c, NULL, man, n_man, &f, &bs), THAW_ENOTFOUND);
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, BRANCH);
    thaw_blocks_state_free(&bs);

    assert_int_equal(thaw_snapshots_flush(c, &pd, &n), 0);
    assert_null(pd.blob);
    assert_true(n > 0);
    thaw_disk_cache_flush(c);
    assert_true(thaw_disk_cache_has(c, s150));
    assert_int_equal(thaw_disk_cache_evict(c), 0); /* named by the manifest: kept */
    assert_true(thaw_disk_cache_has(c, s150));
    assert_int_equal(thaw_snapshots_load(c, NULL, man, n_man, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, N_A);
    assert_int_equal(thaw_blocks_state_check(&bs), 0);
    /* the reference decodes a in the store's batches (store_ex) */
    clear(0);
    free(decode(0, a, 0, BRANCH));
    free(decode(0, a + BRANCH, BRANCH, PROMPT - BRANCH));
    free(decode(0, a + PROMPT, PROMPT, N_A - PROMPT));
    llama_token next = 7;
    float *want = decode(0, &next, N_A, 1);
    restore_and_check(&bs, next, want);
    free(want);
    thaw_blocks_state_free(&bs);
    assert_int_equal(prefix(c, g_binding, whole, N_A + 1, &f, &bs), 0);
    assert_int_equal(bs.n_tokens, N_A);
    thaw_blocks_state_free(&bs);
    /* flushing again, or one the disk holds: nothing written */
    assert_int_equal(thaw_snapshots_flush(c, &pd, &n), 0);
    assert_int_equal(n, 0);
    thaw_blob_unref(man);

    /* dropped instead (the conversation went on in its slot): never written */
    llama_token b[N_A];
    uint8_t kb[32] = {0xd}, sb[32];
    tokens(b, N_A, 80, 6);
    sid_at(b, N_A, sb);
    man = store_ex(c, b, N_A, kb, &st, &n_man, &pd);
    assert_non_null(pd.blob);
    thaw_snapshots_pending_drop(&pd);
    assert_null(pd.blob);
    thaw_disk_cache_flush(c);
    assert_false(thaw_disk_cache_has(c, sb));
    thaw_blob_unref(man);
    thaw_disk_cache_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_names_the_prefix),
        cmocka_unit_test(test_codec),
        cmocka_unit_test(test_store_places_and_restores),
        cmocka_unit_test(test_damaged_snapshot_falls_back_and_gc),
        cmocka_unit_test(test_turn_end_kept_until_flushed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
