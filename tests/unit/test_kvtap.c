/* test_kvtap.c — blocks cut straight from libllama's KV cache (kvtap.h), on
 * the real libllama and generated models (llama; deepseek2, whose MLA cache
 * has K tensors only: K rows only are cut), with V per row (flash
 * attention) and transposed:
 *   - the start-up self-test passes;
 *   - through a slot's life — two sequences decoded in the same batches,
 *     uneven chunks, a rollback and a different continuation, a state
 *     installed into another sequence — every block the tap cuts equals the
 *     block cut from a capture of the same cells;
 *   - what it has not seen, or was told is gone, it refuses (THAW_ENOTFOUND),
 *     never guesses.
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

#include "base/error.h"
#include "fixture_models.h"
#include "llama/kvlayout.h"
#include "llama/kvtap.h"

static char g_dir[] = "/tmp/thaw_kvtap_XXXXXX";
static enum llama_flash_attn_type g_fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
static const char *g_arch = "llama";
static char g_model[300];
static struct llama_model *g_m;
static struct llama_context *g_ctx;
static struct thaw_kvtap *g_tap;
static int g_vocab;

static int group_setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/thaw_kvtap_XXXXXX");
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    snprintf(g_model, sizeof g_model, "%s/m.gguf", g_dir);
    char *argv[] = {"mkmodel", "-o", g_model, "--arch", (char *)g_arch, "--layers", "3", NULL};
    if (fixture_mkmodel(7, argv) != 0)
        return -1;
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false; /* as thaw serve loads an MLA model on an AMX CPU (params.c): else llama aborts */
    g_m = llama_model_load_from_file(g_model, mp);
    if (!g_m || thaw_kvtap_new(&g_tap) != 0)
        return -1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 3 * 256;
    cp.n_batch = 512;
    cp.n_ubatch = 64; /* several ubatches per decode */
    cp.n_seq_max = 3;
    cp.kv_unified = false;
    cp.flash_attn_type = g_fa;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.no_perf = true;
    cp.cb_eval = thaw_kvtap_eval_cb;
    cp.cb_eval_user_data = g_tap;
    g_ctx = llama_init_from_model(g_m, cp);
    g_vocab = llama_vocab_n_tokens(llama_model_get_vocab(g_m));
    return g_ctx ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    llama_free(g_ctx);
    thaw_kvtap_free(g_tap);
    llama_model_free(g_m);
    return fixture_llama_close(g_dir);
}

/* One llama_decode of n0 tokens of seq 0 at p0.. and n1 of seq 1 at p1..
 * (token values from `salt`), interleaved in the batch. */
static void decode2(int p0, int n0, int p1, int n1, int salt)
{
    struct llama_batch b = llama_batch_init(n0 + n1, 0, 1);
    int k = 0;
    for (int i = 0; i < n0 || i < n1; i++)
        for (int s = 0; s < 2; s++) {
            if (i >= (s ? n1 : n0))
                continue;
            int pos = (s ? p1 : p0) + i;
            b.token[k] = (llama_token)((13 * pos + 29 * s + 7 * salt + 1) % g_vocab);
            b.pos[k] = pos;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = s;
            b.logits[k] = 0;
            k++;
        }
    b.logits[k - 1] = 1;
    b.n_tokens = k;
    assert_int_equal(llama_decode(g_ctx, b), 0);
    llama_batch_free(b);
}

static uint8_t *state_of(llama_seq_id seq, size_t *n)
{
    *n = llama_state_seq_get_size(g_ctx, seq);
    uint8_t *s = malloc(*n);
    assert_int_equal(llama_state_seq_get_data(g_ctx, s, *n, seq), *n);
    return s;
}

/* Every block of `step` cells (and a few odd ranges) of seq's n cells, cut
 * by the tap, equals the capture's. */
static void assert_cuts_match(llama_seq_id seq, uint32_t n, uint32_t step)
{
    size_t n_state;
    uint8_t *state = state_of(seq, &n_state);
    struct thaw_kvlayout *l = NULL;
    assert_int_equal(thaw_kvlayout_parse(state, n_state, &l), 0);
    assert_int_equal(thaw_kvlayout_n_cells(l), n);
    assert_int_equal(thaw_kvlayout_k_only(l), strcmp(g_arch, "deepseek2") == 0);
    assert_true(thaw_kvtap_known(g_tap, seq, 0, n));
    uint32_t odd[][2] = {{0, n}, {1, n - 1}, {n / 3, n / 3 + 1}, {n - 1, n}};
    for (uint32_t i = 0; i < n / step + 4; i++) {
        uint32_t a = i < n / step ? i * step : odd[i - n / step][0];
        uint32_t b = i < n / step ? a + step : odd[i - n / step][1];
        size_t sz = thaw_kvlayout_block_size(l, a, b);
        assert_true(sz > 0);
        assert_int_equal(thaw_kvtap_block_size(g_tap, a, b), sz);
        uint8_t *x = malloc(sz), *y = malloc(sz);
        assert_int_equal(thaw_kvlayout_cut(l, a, b, x, sz), 0);
        assert_int_equal(thaw_kvtap_cut(g_tap, seq, a, b, y, sz), 0);
        assert_memory_equal(x, y, sz);
        free(x);
        free(y);
    }
    thaw_kvlayout_free(l);
    free(state);
}

static void test_selftest_passes(void **state)
{
    (void)state;
    char why[200];
    assert_int_equal(thaw_kvtap_selftest(g_tap, g_ctx, 2, why, sizeof why), 0);
    assert_string_equal(why, "");
    assert_true(thaw_kvtap_ready(g_tap));
    assert_false(thaw_kvtap_known(g_tap, 2, 0, 1)); /* the self-test leaves its sequence empty */
}

static void test_cuts_equal_captures_through_a_slots_life(void **state)
{
    (void)state;
    llama_memory_t mem = llama_get_memory(g_ctx);
    for (int s = 0; s < 3; s++) {
        llama_memory_seq_rm(mem, s, -1, -1);
        thaw_kvtap_forget(g_tap, s, 0);
    }
    /* a long prompt for seq 0 (several ubatches) beside a short one */
    decode2(0, 150, 0, 40, 0);
    /* both generate, one token per decode, as a server's slots do */
    for (int i = 0; i < 10; i++)
        decode2(150 + i, 1, 40 + i, 1, 0);
    decode2(160, 0, 50, 77, 0);
    assert_cuts_match(0, 160, 32);
    assert_cuts_match(1, 127, 16);

    /* seq 1 rolls back mid-block and continues differently: its cells are
     * reused for other positions and other values */
    assert_true(llama_memory_seq_rm(mem, 1, 45, -1));
    thaw_kvtap_forget(g_tap, 1, 45);
    assert_false(thaw_kvtap_known(g_tap, 1, 40, 50));
    assert_int_equal(thaw_kvtap_cut(g_tap, 1, 40, 50, NULL, 0), THAW_ENOTFOUND);
    decode2(0, 0, 45, 100, 5);
    assert_cuts_match(1, 145, 32);

    /* seq 0's state installed into seq 2, as a restore does */
    size_t n_state;
    uint8_t *st = state_of(0, &n_state);
    llama_memory_seq_rm(mem, 2, -1, -1);
    thaw_kvtap_forget(g_tap, 2, 0);
    assert_int_equal(llama_state_seq_set_data(g_ctx, st, n_state, 2), n_state);
    thaw_kvtap_restored(g_tap, 2, st, n_state, 0);
    free(st);
    assert_cuts_match(2, 160, 32);
    /* and it goes on from there */
    struct llama_batch b = llama_batch_init(20, 0, 1);
    for (int i = 0; i < 20; i++) {
        b.token[i] = (llama_token)((3 * i + 11) % g_vocab);
        b.pos[i] = 160 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 2;
        b.logits[i] = i == 19;
    }
    b.n_tokens = 20;
    assert_int_equal(llama_decode(g_ctx, b), 0);
    llama_batch_free(b);
    assert_cuts_match(2, 180, 32);

    /* a state the tap cannot place (told nothing) is not known */
    thaw_kvtap_forget(g_tap, 2, 0);
    assert_false(thaw_kvtap_known(g_tap, 2, 0, 1));
    assert_int_equal(thaw_kvtap_cut(g_tap, 2, 0, 32, NULL, 0), THAW_ENOTFOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selftest_passes),
        cmocka_unit_test(test_cuts_equal_captures_through_a_slots_life),
    };
    static const char *const archs[] = {"llama", "deepseek2"};
    int failed = 0;
    for (int a = 0; a < 2; a++)
        for (int fa = 0; fa < 2; fa++) {
            g_arch = archs[a];
            g_fa = fa ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_ENABLED;
            fprintf(stderr, "%s, flash attention %s\n", g_arch, fa ? "off" : "on");
            failed += cmocka_run_group_tests(tests, group_setup, group_teardown);
        }
    return failed;
}
