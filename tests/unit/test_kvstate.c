/* test_kvstate.c — the .kv / .ckpt blob parsers never read past a blob and
 * reject every damaged header (llama.cpp itself is not needed: the capture
 * side is exercised end to end). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/error.h"
#include "llama/kvstate.h"

/* A hand-made .kv blob: header, 3 tokens, 5 state bytes. */
static size_t make_kv(uint8_t *b)
{
    uint32_t h[4] = {0x31564b54u, 1, 3, 0};
    uint64_t state = 5;
    int32_t toks[3] = {7, 8, 9};

    memcpy(b, h, 16);
    memcpy(b + 16, &state, 8);
    memcpy(b + 24, toks, 12);
    memcpy(b + 36, "STATE", 5);
    return 41;
}

static void test_kv_parse(void **state)
{
    uint8_t b[64] __attribute__((aligned(8)));
    struct thaw_kvstate_view v;
    size_t n = make_kv(b);

    (void)state;
    assert_int_equal(thaw_kvstate_parse(b, n, &v), 0);
    assert_int_equal(v.n_tokens, 3);
    assert_int_equal(v.tokens[2], 9);
    assert_int_equal(v.n_state, 5);
    assert_memory_equal(v.state, "STATE", 5);
    /* every truncation is rejected */
    for (size_t k = 0; k < n; k++)
        assert_int_not_equal(thaw_kvstate_parse(b, k, &v), 0);
    /* a token count pointing past the end */
    uint32_t big = 1000;
    memcpy(b + 8, &big, 4);
    assert_int_equal(thaw_kvstate_parse(b, n, &v), THAW_ECORRUPT);
    n = make_kv(b);
    b[0] ^= 1;
    assert_int_equal(thaw_kvstate_parse(b, n, &v), THAW_ECORRUPT);
    n = make_kv(b);
    b[4] = 2;
    assert_int_equal(thaw_kvstate_parse(b, n, &v), THAW_EVERSION);
}

static void test_ckpt_round_trip_and_damage(void **state)
{
    struct thaw_ckpt_list l = {0}, back = {0};
    void *blob;
    size_t n;

    (void)state;
    for (int i = 0; i < 3; i++) {
        struct thaw_ckpt c = {.n_tokens = 10 * (i + 1), .pos_min = i, .pos_max = 10 * (i + 1) - 1,
                              .data = malloc(7), .size = 7};
        memset(c.data, 'a' + i, 7);
        l.v = realloc(l.v, (size_t)(l.n + 1) * sizeof *l.v);
        l.v[l.n++] = c;
    }
    l.cap = l.n;
    assert_int_equal(thaw_ckpt_serialize(&l, &blob, &n), 0);
    assert_int_equal(thaw_ckpt_parse(blob, n, &back), 0);
    assert_int_equal(back.n, 3);
    assert_int_equal(back.v[2].n_tokens, 30);
    assert_memory_equal(back.v[1].data, "bbbbbbb", 7);
    thaw_ckpt_truncate(&back, 20);
    assert_int_equal(back.n, 2);
    for (size_t k = 1; k < n; k++) /* every truncation is rejected, never overread */
        assert_int_not_equal(thaw_ckpt_parse(blob, k, &back), 0);
    assert_int_equal(back.n, 0);
    assert_int_equal(thaw_ckpt_parse(NULL, 0, &back), 0); /* empty = no checkpoints */
    thaw_ckpt_clear(&l);
    thaw_ckpt_clear(&back);
    thaw_blob_unref(blob);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_parse),
        cmocka_unit_test(test_ckpt_round_trip_and_damage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
