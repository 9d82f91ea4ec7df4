/* test_kvlayout.c — cut a real libllama sequence state into blocks and
 * assemble it back, byte for byte, on generated models (thaw mkmodel):
 *   llama   plain attention, flash attention on (V rows) and off (V transposed)
 *   gemma3  iSWA: the full-attention section is cut, the SWA window is the tail
 *   gemma4  iSWA with its own cell metadata
 *   lfm2    hybrid (recurrent): the attention section cut, the recurrent
 *           state the tail
 *   deepseek2  MLA: a K-only latent cache (no V parts), f16 and q8_0
 * A restored sequence must decode the next token to the same logits as the
 * original. Damaged buffers and blocks must be refused, never overread (run
 * it under valgrind once: `valgrind --error-exitcode=1 build/test_kvlayout`).
 *
 * THAW_KVLAYOUT_BENCH=1 also times parse + cut of 2k and 16k tokens of a
 * KV-heavy model (16 layers x 1024, 64 KiB per token) and prints ms per GiB;
 * nothing is asserted about time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ggml-backend.h>
#include <llama.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "fixture_models.h"
#include "llama/kvlayout.h"

static char g_dir[] = "/tmp/thaw_kvlayout_XXXXXX";

/* Writes <g_dir>/<name>.gguf with mkmodel; extra flags after the arch. */
static void mkmodel(char *path, size_t n, const char *name, const char *arch, const char *const *extra)
{
    char *argv[32];
    int argc = 0;

    snprintf(path, n, "%s/%s.gguf", g_dir, name);
    argv[argc++] = "mkmodel";
    argv[argc++] = "-o";
    argv[argc++] = path;
    argv[argc++] = "--arch";
    argv[argc++] = (char *)arch;
    for (; extra && *extra; extra++)
        argv[argc++] = (char *)*extra;
    assert_int_equal(fixture_mkmodel(argc, argv), 0);
}

static enum ggml_type g_kv_type = GGML_TYPE_F16; /* -ctk/-ctv of the next env_open */

struct env {
    struct llama_model *model;
    struct llama_context *ctx;
    int n_vocab;
};

static void env_open(struct env *e, const char *path, enum llama_flash_attn_type fa, uint32_t n_ctx)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false; /* as thaw serve loads an MLA model on an AMX CPU (params.c): else llama aborts */
    e->model = llama_model_load_from_file(path, mp);
    assert_non_null(e->model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = 2;
    cp.kv_unified = false; /* as the engine runs it: one stream per slot */
    cp.flash_attn_type = fa;
    cp.type_k = cp.type_v = g_kv_type;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.no_perf = true;
    e->ctx = llama_init_from_model(e->model, cp);
    assert_non_null(e->ctx);
    e->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(e->model));
}

static void env_close(struct env *e)
{
    llama_free(e->ctx);
    llama_model_free(e->model);
}

/* Decodes n tokens at positions pos0.. into seq, in batches of 512; logits
 * for the last one. */
static void decode(struct env *e, llama_seq_id seq, int pos0, int n)
{
    struct llama_batch b = llama_batch_init(512, 0, 1);
    for (int done = 0; done < n;) {
        int k = n - done < 512 ? n - done : 512;
        for (int i = 0; i < k; i++) {
            int p = pos0 + done + i;
            b.token[i] = (llama_token)((31 * p + 7) % e->n_vocab);
            b.pos[i] = p;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = seq;
            b.logits[i] = done + i == n - 1;
        }
        b.n_tokens = k;
        assert_int_equal(llama_decode(e->ctx, b), 0);
        done += k;
    }
    llama_batch_free(b);
}

static uint8_t *get_state(struct env *e, llama_seq_id seq, size_t *n)
{
    *n = llama_state_seq_get_size(e->ctx, seq);
    assert_true(*n > 0);
    uint8_t *s = malloc(*n);
    assert_non_null(s);
    assert_int_equal(llama_state_seq_get_data(e->ctx, s, *n, seq), *n);
    return s;
}

/* Cuts l into blocks of B cells (the last one shorter). */
struct blocks {
    void **b;
    size_t *n;
    int count;
};

static void cut_all(const struct thaw_kvlayout *l, uint32_t B, struct blocks *bl)
{
    uint32_t N = thaw_kvlayout_n_cells(l);
    bl->count = (int)((N + B - 1) / B);
    bl->b = calloc((size_t)bl->count, sizeof *bl->b);
    bl->n = calloc((size_t)bl->count, sizeof *bl->n);
    assert_non_null(bl->b);
    assert_non_null(bl->n);
    for (int i = 0; i < bl->count; i++) {
        uint32_t a = (uint32_t)i * B, b = a + B < N ? a + B : N;
        bl->n[i] = thaw_kvlayout_block_size(l, a, b);
        assert_true(bl->n[i] > 0);
        bl->b[i] = malloc(bl->n[i]);
        assert_non_null(bl->b[i]);
        /* one byte short is refused */
        assert_int_equal(thaw_kvlayout_cut(l, a, b, bl->b[i], bl->n[i] - 1), THAW_ETOOBIG);
        assert_int_equal(thaw_kvlayout_cut(l, a, b, bl->b[i], bl->n[i]), 0);
        uint32_t p0, nc;
        assert_int_equal(thaw_kvlayout_block_info(bl->b[i], bl->n[i], &p0, &nc), 0);
        assert_int_equal(p0, a);
        assert_int_equal(nc, b - a);
    }
}

static void blocks_free(struct blocks *bl)
{
    for (int i = 0; i < bl->count; i++)
        free(bl->b[i]);
    free(bl->b);
    free(bl->n);
}

static void assemble(const struct blocks *bl, const struct thaw_kvlayout_frame *f, const struct thaw_kvlayout *l,
                     void **out, size_t *n_out)
{
    const void *tail;
    size_t n_tail;
    thaw_kvlayout_tail(l, &tail, &n_tail);
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)bl->b, bl->n, bl->count, f, tail, n_tail, out, n_out),
                     0);
}

/* ---- model fixtures ---------------------------------------------------------- */

static char m_llama[256], m_gemma3[256], m_gemma4[256], m_lfm2[256], m_ds2[256];

static int group_setup(void **state)
{
    (void)state;
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    static const char *const swa[] = {"--layers", "3", "--swa-window", "4", "--swa-pattern", "3", NULL};
    static const char *const g4[] = {"--layers", "3", "--swa-window", "4", "--swa-pattern", "3", NULL};
    static const char *const hy[] = {"--layers", "3", NULL};
    mkmodel(m_llama, sizeof m_llama, "llama", "llama", NULL);
    mkmodel(m_gemma3, sizeof m_gemma3, "gemma3", "gemma3", swa);
    mkmodel(m_gemma4, sizeof m_gemma4, "gemma4", "gemma4", g4);
    mkmodel(m_lfm2, sizeof m_lfm2, "lfm2", "lfm2", hy);
    mkmodel(m_ds2, sizeof m_ds2, "deepseek2", "deepseek2", hy);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    return fixture_llama_close(g_dir);
}

/* ---- the round trip ---------------------------------------------------------- */

#define N_TOK 23

/* A cut whose first rows come from an earlier cut of the same start (the
 * head, whole or truncated) equals the plain cut: over the capture's own
 * SWA section, V transposed or not. */
static void cut_after_equals_cut(const struct thaw_kvlayout *l)
{
    struct thaw_kvlayout_mem *m = NULL;
    int32_t lo, hi;

    assert_int_equal(thaw_kvlayout_swa_mem(l, &m), 0);
    assert_int_equal(thaw_kvlayout_swa_pos_range(l, &lo, &hi), 0);
    uint32_t a = (uint32_t)lo, b = (uint32_t)hi + 1;
    assert_true(b - a >= 3);
    int32_t *idx = malloc((b - a) * sizeof *idx);
    assert_non_null(idx);
    assert_int_equal(thaw_kvlayout_swa_find(l, a, b, idx), 0);
    size_t n = thaw_kvlayout_mem_block_size(m, a, b);
    uint8_t *want = malloc(n), *got = malloc(n), *head = malloc(n);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(head);
    assert_int_equal(thaw_kvlayout_mem_cut(m, 0, a, b, idx, want, n), 0);
    for (uint32_t h = 1; h <= b - a; h++) {
        size_t nh = thaw_kvlayout_mem_block_size(m, a, a + h);
        assert_int_equal(thaw_kvlayout_mem_cut(m, 0, a, a + h, idx, head, nh), 0);
        for (uint32_t k = 0; k <= h; k++) {
            memset(got, 0xa5, n);
            assert_int_equal(thaw_kvlayout_mem_cut_after(m, 0, a, b, idx, head, h, k, got, n), 0);
            assert_memory_equal(got, want, n);
        }
    }
    /* the head's rows are taken, not the memory's: a head with other bytes shows */
    size_t nh = thaw_kvlayout_mem_block_size(m, a, a + 2);
    assert_int_equal(thaw_kvlayout_mem_cut(m, 0, a, a + 2, idx, head, nh), 0);
    head[nh - 1] ^= 0xff;
    assert_int_equal(thaw_kvlayout_mem_cut_after(m, 0, a, b, idx, head, 2, 2, got, n), 0);
    assert_memory_not_equal(got, want, n);
    free(want);
    free(got);
    free(head);
    free(idx);
    thaw_kvlayout_mem_free(m);
}

/* Parse, cut at several block sizes, assemble byte-identical; restore into
 * seq 1 and decode the next token there and on seq 0: same logits. */
static void round_trip(const char *path, enum llama_flash_attn_type fa, int want_vtrans, int want_tail)
{
    struct env e;
    struct thaw_kvlayout *l;
    struct thaw_kvlayout_frame f, f1;
    size_t n;

    env_open(&e, path, fa, 256);
    decode(&e, 0, 0, N_TOK);
    uint8_t *s = get_state(&e, 0, &n);
    assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
    assert_int_equal(thaw_kvlayout_n_cells(l), N_TOK);
    assert_int_equal(thaw_kvlayout_v_trans(l), want_vtrans);
    thaw_kvlayout_frame(l, &f);
    assert_int_equal(f.seq_id, 0);
    assert_int_equal(f.n_stream, 2);
    assert_int_equal(f.stream, 0);
    const void *tail;
    size_t n_tail;
    thaw_kvlayout_tail(l, &tail, &n_tail);
    assert_int_equal(n_tail > 0, want_tail);
    if (thaw_kvlayout_has_swa(l))
        cut_after_equals_cut(l);
    size_t meta = thaw_kvlayout_block_size(l, 0, 2) - thaw_kvlayout_block_size(l, 0, 1) -
                  thaw_kvlayout_bytes_per_cell(l); /* 4, or 16 with cell ext */
    fprintf(stderr, "  %s: %zu bytes, %u layers cut, %zu B/cell, meta %zu B/cell, v_trans %d, tail %zu bytes\n",
            strrchr(path, '/') + 1, n, thaw_kvlayout_n_layers(l), thaw_kvlayout_bytes_per_cell(l), meta,
            thaw_kvlayout_v_trans(l), n_tail);

    static const uint32_t sizes[] = {1, 2, 7, N_TOK};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        struct blocks bl;
        void *out;
        size_t n_out;
        cut_all(l, sizes[k], &bl);
        assemble(&bl, &f, l, &out, &n_out);
        assert_int_equal(n_out, n);
        assert_memory_equal(out, s, n);
        free(out);
        blocks_free(&bl);
    }

    /* the blocks of seq 0 restore into seq 1 (its own stream) */
    struct blocks bl;
    void *out;
    size_t n_out;
    cut_all(l, 7, &bl);
    f1 = f;
    f1.seq_id = 1;
    f1.stream = 1;
    assemble(&bl, &f1, l, &out, &n_out);
    assert_int_equal(llama_state_seq_set_data(e.ctx, out, n_out, 1), n_out);
    if (!want_tail) { /* the frame is all that is per-slot: seq 1's state is the assembled buffer */
        size_t n1;
        uint8_t *s1 = get_state(&e, 1, &n1);
        assert_int_equal(n1, n_out);
        assert_memory_equal(s1, out, n_out);
        free(s1);
    }
    assert_int_equal(llama_memory_seq_pos_max(llama_get_memory(e.ctx), 1), N_TOK - 1);

    /* the next token decodes to the same logits on both */
    float *want = malloc((size_t)e.n_vocab * sizeof *want);
    assert_non_null(want);
    decode(&e, 0, N_TOK, 1);
    memcpy(want, llama_get_logits_ith(e.ctx, -1), (size_t)e.n_vocab * sizeof *want);
    decode(&e, 1, N_TOK, 1);
    assert_memory_equal(llama_get_logits_ith(e.ctx, -1), want, (size_t)e.n_vocab * sizeof *want);

    free(want);
    free(out);
    blocks_free(&bl);
    thaw_kvlayout_free(l);
    free(s);
    env_close(&e);
}

static void test_llama_fa_on(void **state)
{
    (void)state;
    round_trip(m_llama, LLAMA_FLASH_ATTN_TYPE_ENABLED, 0, 0);
}

static void test_llama_fa_off(void **state)
{
    (void)state;
    round_trip(m_llama, LLAMA_FLASH_ATTN_TYPE_DISABLED, 1, 0);
}

static void test_gemma3_fa_on(void **state)
{
    (void)state;
    round_trip(m_gemma3, LLAMA_FLASH_ATTN_TYPE_ENABLED, 0, 1);
}

static void test_gemma3_fa_off(void **state)
{
    (void)state;
    round_trip(m_gemma3, LLAMA_FLASH_ATTN_TYPE_DISABLED, 1, 1);
}

static void test_gemma4(void **state)
{
    (void)state;
    round_trip(m_gemma4, LLAMA_FLASH_ATTN_TYPE_ENABLED, 0, 1);
}

static void damage(const uint8_t *s, size_t n, int strict_truncation);

/* deepseek2 (MLA): libllama's cache has no V tensors and its state no V
 * parts (v_trans is written all the same): the layers are cut K rows only,
 * the blocks say so (flag 4), and they assemble back byte for byte and
 * restore to the same logits (round_trip), with flash attention on or off
 * (a transposed-V flag that moves nothing) and with q8_0 K (the latent row
 * is 64 + 32 values, three q8_0 blocks of 34 bytes). */
static void test_deepseek2_k_only(void **state)
{
    static const struct {
        enum ggml_type type;
        enum llama_flash_attn_type fa;
        int vtrans;
        uint64_t k_row;
    } cases[] = {
        {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, 0, 96 * 2},
        {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_DISABLED, 1, 96 * 2},
        {GGML_TYPE_Q8_0, LLAMA_FLASH_ATTN_TYPE_ENABLED, 0, 3 * 34},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct env e;
        struct thaw_kvlayout *l;
        size_t n;
        g_kv_type = cases[i].type;
        round_trip(m_ds2, cases[i].fa, cases[i].vtrans, 0);
        env_open(&e, m_ds2, cases[i].fa, 256);
        decode(&e, 0, 0, 9);
        uint8_t *s = get_state(&e, 0, &n);
        assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
        assert_int_equal(thaw_kvlayout_k_only(l), 1);
        assert_int_equal(thaw_kvlayout_n_layers(l), 3);
        /* K rows only: the three latent rows are all a cell holds */
        assert_int_equal(thaw_kvlayout_bytes_per_cell(l), 3 * cases[i].k_row);
        size_t nb = thaw_kvlayout_block_size(l, 0, 4);
        assert_int_equal(nb, 24 + 3 * 24 + 4 * 4 + 4 * 3 * cases[i].k_row);
        uint8_t *b = malloc(nb);
        assert_non_null(b);
        assert_int_equal(thaw_kvlayout_cut(l, 0, 4, b, nb), 0);
        uint16_t flags;
        memcpy(&flags, b + 6, 2);
        assert_int_equal(flags, 4 | (cases[i].vtrans ? 1 : 0));
        int32_t vt;
        uint64_t kr, vr;
        memcpy(&vt, b + 24 + 4, 4);
        memcpy(&kr, b + 24 + 8, 8);
        memcpy(&vr, b + 24 + 16, 8);
        assert_int_equal(vt, 0);
        assert_int_equal(kr, cases[i].k_row);
        assert_int_equal(vr, 0);
        /* a K-only block that claims a V part is damaged */
        uint32_t pos0, nc;
        vr = 2;
        memcpy(b + 24 + 16, &vr, 8);
        assert_int_equal(thaw_kvlayout_block_info(b, nb, &pos0, &nc), THAW_ECORRUPT);
        free(b);
        thaw_kvlayout_free(l);
        if (i == 0)
            damage(s, n, 1); /* seq 0 of 2 streams: a cut-off buffer is never whole */
        free(s);
        env_close(&e);
    }
    g_kv_type = GGML_TYPE_F16;
}

/* Cells with llama_kv_cell_ext (M-RoPE / PLE models, none of which mkmodel
 * makes): a real llama buffer with 12 ext bytes put into every cell's meta
 * must be recognised and round-trip with its ext intact. */
static void test_cell_ext(void **state)
{
    struct env e;
    struct thaw_kvlayout *l;
    struct thaw_kvlayout_frame f;
    size_t n;

    (void)state;
    env_open(&e, m_llama, LLAMA_FLASH_ATTN_TYPE_DISABLED, 256);
    decode(&e, 0, 0, 10);
    uint8_t *s = get_state(&e, 0, &n);
    env_close(&e);
    /* magic | seq | n_stream (2) | count (stream 0) | meta at 16 */
    uint32_t N;
    memcpy(&N, s + 12, 4);
    assert_int_equal(N, 10);
    size_t nx = n + 12 * (size_t)N;
    uint8_t *x = malloc(nx), *p = x;
    assert_non_null(x);
    memcpy(p, s, 16);
    p += 16;
    for (uint32_t c = 0; c < N; c++) {
        int32_t ext[3] = {(int32_t)c * 3, (int32_t)c * 5, 1000 + (int32_t)c};
        memcpy(p, s + 16 + 12 * c, 8);
        memcpy(p + 8, ext, 12);
        memcpy(p + 20, s + 16 + 12 * c + 8, 4);
        p += 24;
    }
    memcpy(p, s + 16 + 12 * N, n - 16 - 12 * N);

    assert_int_equal(thaw_kvlayout_parse(x, nx, &l), 0);
    assert_int_equal(thaw_kvlayout_n_cells(l), N);
    assert_int_equal(thaw_kvlayout_block_size(l, 0, 1),
                     24 + 24 * thaw_kvlayout_n_layers(l) + 16 + thaw_kvlayout_bytes_per_cell(l));
    thaw_kvlayout_frame(l, &f);
    struct blocks bl;
    void *out;
    size_t n_out;
    cut_all(l, 3, &bl);
    assemble(&bl, &f, l, &out, &n_out);
    assert_int_equal(n_out, nx);
    assert_memory_equal(out, x, nx);
    free(out);
    blocks_free(&bl);
    thaw_kvlayout_free(l);
    damage(x, nx, 1);
    free(x);
    free(s);
}

/* ---- refusals and damage ----------------------------------------------------- */

/* A hybrid (lfm2): the attention section is cut as a dense model's, the
 * recurrent state after it is the kept-whole tail (snapshots.h); the
 * self-test's round trip passes. A recurrent head that is not one cell at
 * the last position is not a layout thaw knows. */
static void test_hybrid_recurrent_tail(void **state)
{
    struct env e;
    struct thaw_kvlayout *l = NULL;
    char why[160];
    size_t n;

    (void)state;
    env_open(&e, m_lfm2, LLAMA_FLASH_ATTN_TYPE_AUTO, 256);
    decode(&e, 0, 0, N_TOK);
    uint8_t *s = get_state(&e, 0, &n);
    assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
    assert_int_equal(thaw_kvlayout_n_cells(l), N_TOK);
    assert_int_equal(thaw_kvlayout_recurrent(l), 1);
    const void *tail;
    size_t n_tail;
    thaw_kvlayout_tail(l, &tail, &n_tail);
    assert_true(n_tail > 20);
    /* the tail is exactly what a PARTIAL_ONLY checkpoint holds after its
     * magic and sequence id */
    size_t n_part = llama_state_seq_get_size_ext(e.ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    uint8_t *part = malloc(n_part);
    assert_non_null(part);
    assert_int_equal(llama_state_seq_get_data_ext(e.ctx, part, n_part, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), n_part);
    assert_int_equal(n_part, n_tail + 8);
    assert_memory_equal(part + 8, tail, n_tail);
    free(part);
    struct thaw_kvlayout_frame f;
    thaw_kvlayout_frame(l, &f);
    struct blocks bl;
    void *out;
    size_t n_out;
    cut_all(l, 3, &bl);
    assemble(&bl, &f, l, &out, &n_out);
    assert_int_equal(n_out, n);
    assert_memory_equal(out, s, n);
    free(out);
    blocks_free(&bl);
    /* the recurrent cell's position is not the last one: refused */
    size_t off = (const uint8_t *)tail - s;
    thaw_kvlayout_free(l);
    l = (void *)1;
    int32_t bad = 0;
    memcpy(s + off + 4, &bad, 4);
    assert_int_equal(thaw_kvlayout_parse(s, n, &l), THAW_ELAYOUT);
    assert_null(l);
    assert_int_equal(thaw_kvlayout_selftest(e.ctx, 1, why, sizeof why), 0);
    free(s);
    env_close(&e);
}

static void test_selftest(void **state)
{
    const char *paths[] = {m_llama, m_gemma3, m_gemma4, m_ds2};
    char why[160];

    (void)state;
    for (size_t i = 0; i < 4; i++)
        for (int fa = 0; fa < 2; fa++) {
            struct env e;
            env_open(&e, paths[i], fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED, 256);
            int rc = thaw_kvlayout_selftest(e.ctx, 1, why, sizeof why);
            if (rc != 0)
                fprintf(stderr, "%s fa=%d: %s\n", paths[i], fa, why);
            assert_int_equal(rc, 0);
            assert_string_equal(why, "");
            assert_int_equal(llama_memory_seq_pos_max(llama_get_memory(e.ctx), 1), -1); /* left empty */
            env_close(&e);
        }
}

/* Every truncation, every single-bit flip and trailing bytes: a code, never
 * an overread; a flip that still parses still cuts and assembles. */
static void damage(const uint8_t *s, size_t n, int strict_truncation)
{
    struct thaw_kvlayout *l;
    uint8_t *d = malloc(n + 1);
    assert_non_null(d);

    for (size_t k = 0; k < n; k++) {
        uint8_t *t = malloc(k ? k : 1); /* exact size: valgrind/ASan see any overread */
        assert_non_null(t);
        memcpy(t, s, k);
        int rc = thaw_kvlayout_parse(t, k, &l);
        free(t);
        if (strict_truncation)
            assert_int_equal(rc, THAW_ECORRUPT);
        else
            assert_true(rc == THAW_ECORRUPT || rc == THAW_ELAYOUT || rc == 0);
        thaw_kvlayout_free(l);
    }
    memcpy(d, s, n);
    d[n] = 0;
    assert_int_equal(thaw_kvlayout_parse(d, n + 1, &l), THAW_ELAYOUT); /* bytes left over */
    for (size_t k = 0; k < n; k++) {
        d[k] ^= (uint8_t)(1u << (k % 8));
        int rc = thaw_kvlayout_parse(d, n, &l);
        assert_true(rc == 0 || rc == THAW_ECORRUPT || rc == THAW_ELAYOUT || rc == THAW_EINVAL);
        if (rc == 0) {
            struct blocks bl;
            struct thaw_kvlayout_frame f;
            void *out;
            size_t n_out;
            thaw_kvlayout_frame(l, &f);
            cut_all(l, 5, &bl);
            assemble(&bl, &f, l, &out, &n_out);
            assert_int_equal(n_out, n);
            assert_memory_equal(out, d, n); /* whatever parses, round-trips */
            free(out);
            blocks_free(&bl);
            thaw_kvlayout_free(l);
        } else {
            assert_null(l);
        }
        d[k] ^= (uint8_t)(1u << (k % 8));
    }
    free(d);
}

static void test_damaged_state(void **state)
{
    const char *paths[] = {m_llama, m_gemma3};
    (void)state;
    for (size_t i = 0; i < 2; i++)
        for (int fa = 0; fa < 2; fa++) {
            struct env e;
            size_t n;
            env_open(&e, paths[i], fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED, 256);
            decode(&e, 0, 0, 9);
            uint8_t *s = get_state(&e, 0, &n);
            /* a gemma3 buffer cut exactly after section 0 is a valid one */
            damage(s, n, i == 0);
            s[0] ^= 1;
            struct thaw_kvlayout *l;
            assert_int_equal(thaw_kvlayout_parse(s, n, &l), THAW_ELAYOUT); /* another magic */
            free(s);
            env_close(&e);
        }
}

static void test_damaged_blocks(void **state)
{
    struct env e, e2;
    struct thaw_kvlayout *l, *l2;
    struct thaw_kvlayout_frame f;
    struct blocks bl, bl2;
    void *out;
    size_t n, n2, n_out;
    uint32_t p0, nc;

    (void)state;
    env_open(&e, m_llama, LLAMA_FLASH_ATTN_TYPE_ENABLED, 256);
    env_open(&e2, m_llama, LLAMA_FLASH_ATTN_TYPE_DISABLED, 256);
    decode(&e, 0, 0, 12);
    decode(&e2, 0, 0, 12);
    uint8_t *s = get_state(&e, 0, &n), *s2 = get_state(&e2, 0, &n2);
    assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
    assert_int_equal(thaw_kvlayout_parse(s2, n2, &l2), 0);
    thaw_kvlayout_frame(l, &f);
    cut_all(l, 4, &bl);
    cut_all(l2, 4, &bl2);

    /* bad ranges */
    uint8_t tmp[16];
    assert_int_equal(thaw_kvlayout_block_size(l, 3, 3), 0);
    assert_int_equal(thaw_kvlayout_block_size(l, 0, 13), 0);
    assert_int_equal(thaw_kvlayout_cut(l, 5, 4, tmp, sizeof tmp), THAW_EINVAL);

    /* every truncation and every bit of a block */
    uint8_t *d = malloc(bl.n[1]);
    assert_non_null(d);
    for (size_t k = 0; k < bl.n[1]; k++) {
        memcpy(d, bl.b[1], k);
        assert_int_not_equal(thaw_kvlayout_block_info(d, k, &p0, &nc), 0);
    }
    memcpy(d, bl.b[1], bl.n[1]);
    size_t head = bl.n[1] - 4 * thaw_kvlayout_bytes_per_cell(l); /* header, table, meta */
    for (size_t k = 0; k < head; k++) {
        d[k] ^= (uint8_t)(1u << (k % 8));
        int rc = thaw_kvlayout_block_info(d, bl.n[1], &p0, &nc);
        /* what still parses is header damage the assembler catches */
        if (rc == 0) {
            void *keep = bl.b[1];
            bl.b[1] = d;
            int arc = thaw_kvlayout_assemble((const void *const *)bl.b, bl.n, bl.count, &f, NULL, 0, &out, &n_out);
            bl.b[1] = keep;
            assert_true(arc == THAW_EMISMATCH || arc == THAW_EINVAL || arc == 0);
            if (arc == 0)
                free(out);
        } else {
            assert_true(rc == THAW_ECORRUPT || rc == THAW_EVERSION);
        }
        d[k] ^= (uint8_t)(1u << (k % 8));
    }
    free(d);

    /* a gap, an overlap, a block of another shape, no blocks, a bad frame */
    void *gap[2] = {bl.b[0], bl.b[2]};
    size_t gapn[2] = {bl.n[0], bl.n[2]};
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)gap, gapn, 2, &f, NULL, 0, &out, &n_out), THAW_EINVAL);
    void *dup[2] = {bl.b[0], bl.b[0]};
    size_t dupn[2] = {bl.n[0], bl.n[0]};
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)dup, dupn, 2, &f, NULL, 0, &out, &n_out), THAW_EINVAL);
    void *mix[2] = {bl.b[0], bl2.b[1]};
    size_t mixn[2] = {bl.n[0], bl2.n[1]};
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)mix, mixn, 2, &f, NULL, 0, &out, &n_out),
                     THAW_EMISMATCH);
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)bl.b, bl.n, 0, &f, NULL, 0, &out, &n_out),
                     THAW_EINVAL);
    struct thaw_kvlayout_frame bad = f;
    bad.stream = bad.n_stream;
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)bl.b, bl.n, bl.count, &bad, NULL, 0, &out, &n_out),
                     THAW_EINVAL);
    /* a prefix of the blocks is a shorter, valid sequence state */
    assert_int_equal(thaw_kvlayout_assemble((const void *const *)bl.b, bl.n, 2, &f, NULL, 0, &out, &n_out), 0);
    assert_int_equal(llama_state_seq_set_data(e.ctx, out, n_out, 1), n_out);
    assert_int_equal(llama_memory_seq_pos_max(llama_get_memory(e.ctx), 1), 7);
    free(out);

    blocks_free(&bl2);
    blocks_free(&bl);
    thaw_kvlayout_free(l2);
    thaw_kvlayout_free(l);
    free(s2);
    free(s);
    env_close(&e2);
    env_close(&e);
}

/* ---- measurement (THAW_KVLAYOUT_BENCH=1) -------------------------------------- */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Parse + cut into 256-token blocks, best of 5. */
static void time_cut(const char *what, const uint8_t *s, size_t n)
{
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_ms();
        struct thaw_kvlayout *l;
        assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
        uint32_t N = thaw_kvlayout_n_cells(l);
        for (uint32_t a = 0; a < N; a += 256) {
            uint32_t b = a + 256 < N ? a + 256 : N;
            size_t bn = thaw_kvlayout_block_size(l, a, b);
            void *blk = malloc(bn);
            assert_int_equal(thaw_kvlayout_cut(l, a, b, blk, bn), 0);
            free(blk);
        }
        thaw_kvlayout_free(l);
        double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    double gib = (double)n / (1024.0 * 1024 * 1024);
    fprintf(stderr, "kvlayout bench: %s: %.1f MiB, parse+cut(256) %.1f ms = %.0f ms/GiB (%.1f GiB/s)\n", what,
            n / 1048576.0, best, best / gib, gib / (best / 1e3));
}

static void test_bench(void **state)
{
    (void)state;
    if (!getenv("THAW_KVLAYOUT_BENCH"))
        skip();
    static const char *const big[] = {"--layers", "16", "--embd", "1024", "--heads", "8", "--kv-heads", "8", NULL};
    char path[256];
    mkmodel(path, sizeof path, "heavy", "llama", big);
    for (int fa = 0; fa < 2; fa++) {
        struct env e;
        size_t n;
        /* n_ctx is split between the 2 streams: seq 1 must hold 16k too */
        env_open(&e, path, fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED, 2 * (16384 + 256));
        double t0 = now_ms();
        decode(&e, 0, 0, 2048);
        fprintf(stderr, "kvlayout bench: fa=%d prefill 2048 tokens %.0f ms\n", fa, now_ms() - t0);
        uint8_t *s = get_state(&e, 0, &n);
        time_cut(fa ? "2k tokens, fa on (V rows)" : "2k tokens, fa off (V transposed)", s, n);

        /* 16k: the real 2k blocks, repeated at the following positions and
         * assembled (the assembly is byte-identical to a capture, so this is
         * the layout a 16k capture has); libllama must accept it */
        struct thaw_kvlayout *l;
        struct thaw_kvlayout_frame f;
        struct blocks bl;
        assert_int_equal(thaw_kvlayout_parse(s, n, &l), 0);
        thaw_kvlayout_frame(l, &f);
        cut_all(l, 256, &bl);
        int nb = bl.count * 8;
        void **b = malloc((size_t)nb * sizeof *b);
        size_t *bn = malloc((size_t)nb * sizeof *bn);
        for (int i = 0; i < nb; i++) {
            const uint8_t *src = bl.b[i % bl.count];
            bn[i] = bl.n[i % bl.count];
            b[i] = malloc(bn[i]);
            memcpy(b[i], src, bn[i]);
            uint32_t pos0 = (uint32_t)i * 256;
            memcpy((uint8_t *)b[i] + 8, &pos0, 4);
            size_t meta = 24 + 24 * (size_t)thaw_kvlayout_n_layers(l);
            for (uint32_t c = 0; c < 256; c++) {
                int32_t p = (int32_t)(pos0 + c);
                memcpy((uint8_t *)b[i] + meta + 4 * c, &p, 4);
            }
        }
        void *big16;
        size_t n16;
        assert_int_equal(thaw_kvlayout_assemble((const void *const *)b, bn, nb, &f, NULL, 0, &big16, &n16), 0);
        time_cut(fa ? "16k tokens, fa on (V rows)" : "16k tokens, fa off (V transposed)", big16, n16);
        t0 = now_ms();
        assert_int_equal(llama_state_seq_set_data(e.ctx, big16, n16, 1), n16);
        fprintf(stderr, "kvlayout bench: libllama restored the 16k assembly in %.0f ms\n", now_ms() - t0);
        for (int i = 0; i < nb; i++)
            free(b[i]);
        free(b);
        free(bn);
        free(big16);
        blocks_free(&bl);
        thaw_kvlayout_free(l);
        free(s);
        env_close(&e);
    }
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_fa_on),    cmocka_unit_test(test_llama_fa_off),
        cmocka_unit_test(test_gemma3_fa_on),   cmocka_unit_test(test_gemma3_fa_off),
        cmocka_unit_test(test_gemma4),         cmocka_unit_test(test_deepseek2_k_only),
        cmocka_unit_test(test_cell_ext),       cmocka_unit_test(test_hybrid_recurrent_tail),
        cmocka_unit_test(test_selftest),       cmocka_unit_test(test_damaged_state),
        cmocka_unit_test(test_damaged_blocks), cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
