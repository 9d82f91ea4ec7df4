/* test_ngram.c — n-gram drafts (engine/ngram.h): what each kind drafts,
 * overlapping copies, rollback of the index, per-request verdicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "engine/ngram.h"

static struct thaw_ngram *make(unsigned kinds, int n, int m)
{
    struct thaw_config cfg;
    struct thaw_ngram *g = NULL;

    thaw_config_init(&cfg);
    cfg.spec_types = kinds;
    for (int k = 0; k < THAW_SPEC_N_NGRAM; k++) {
        cfg.spec_ngram[k].size_n = n;
        cfg.spec_ngram[k].size_m = m;
    }
    cfg.spec_ngram[THAW_SPEC_NGRAM_MOD].n_min = 2;
    assert_int_equal(thaw_ngram_new(&cfg, 4096, &g), 0);
    assert_non_null(g);
    return g;
}

/* "abc..." as tokens, one per letter */
static int toks(const char *s, llama_token *out)
{
    int n = (int)strlen(s);
    for (int i = 0; i < n; i++)
        out[i] = (llama_token)s[i];
    return n;
}

static void expect(const llama_token *got, int n, const char *want)
{
    assert_int_equal(n, (int)strlen(want));
    for (int i = 0; i < n; i++)
        assert_int_equal(got[i], (llama_token)want[i]);
}

static void test_simple_copies_what_followed_the_latest_occurrence(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_SIMPLE, 3, 4);
    llama_token t[64], out[16];
    int n = toks("xyzABCDExyzABCQRSTxyzA", t); /* the key "zAB": latest earlier occurrence at "xyzABCQ" */

    (void)state;
    expect(out, thaw_ngram_draft(g, t, n, 'B', 8, out), "CQRS");
    assert_string_equal(thaw_ngram_last_kind(g), "ngram-simple");
    /* max bounds it; an unknown key drafts nothing */
    expect(out, thaw_ngram_draft(g, t, n, 'B', 2, out), "CQ");
    assert_int_equal(thaw_ngram_draft(g, t, n, 'Z', 8, out), 0);
    thaw_ngram_free(g);
}

static void test_a_loop_is_drafted_past_its_period(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_SIMPLE, 2, 8);
    llama_token t[64], out[16];
    int n = toks("qabcab", t); /* next 'c': key "bc" at 2; what follows runs into the key and the draft */

    (void)state;
    expect(out, thaw_ngram_draft(g, t, n, 'c', 8, out), "abcabcab");
    thaw_ngram_free(g);
}

static void test_rollback_forgets_ngrams_past_the_common_prefix(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_SIMPLE, 2, 3);
    llama_token t[64], u[64], out[16];
    int n = toks("abXYZab", t), nu = toks("abQRSab", u);

    (void)state;
    expect(out, thaw_ngram_draft(g, t, n, 'X', 3, out), "YZa"); /* key "bX" */
    /* another conversation in the slot from position 2 on: "XYZ" is gone */
    assert_int_equal(thaw_ngram_draft(g, u, nu, 'X', 3, out), 0);
    expect(out, thaw_ngram_draft(g, u, nu, 'Q', 3, out), "RSa");
    /* and back: what the first held is found again, nothing of the second */
    expect(out, thaw_ngram_draft(g, t, n, 'X', 3, out), "YZa");
    assert_int_equal(thaw_ngram_draft(g, t, n, 'Q', 3, out), 0);
    thaw_ngram_free(g);
}

static void test_the_next_draft_is_bounded_by_the_last_verdict(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_SIMPLE, 1, 8);
    llama_token t[64], out[16];
    int n = toks("aBCDEFGHIJ", t);

    (void)state;
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 8);
    thaw_ngram_accept(g, 1); /* 1 of 8: the next is at most 2 */
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 2);
    thaw_ngram_accept(g, 2); /* all: twice as many */
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 4);
    thaw_ngram_accept(g, 4);
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 8);
    thaw_ngram_accept(g, 0);
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 1);
    thaw_ngram_begin(g); /* a new request starts at size_m again */
    assert_int_equal(thaw_ngram_draft(g, t, n, 'a', 8, out), 8);
    thaw_ngram_free(g);
}

static void test_map_k_remembers_each_keys_accepted_count_per_request(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_MAP_K, 2, 6);
    llama_token t[64], out[16];
    int n = toks("abCDEFGHxxab", t);

    (void)state;
    assert_int_equal(thaw_ngram_draft(g, t, n, 'C', 6, out), 6); /* key "bC" */
    thaw_ngram_accept(g, 0);
    assert_int_equal(thaw_ngram_draft(g, t, n, 'C', 6, out), 0); /* that key drafts no more */
    thaw_ngram_begin(g);                                         /* the next request has not learnt it */
    assert_int_equal(thaw_ngram_draft(g, t, n, 'C', 6, out), 6);
    thaw_ngram_free(g);
}

static void test_map_k4v_drafts_the_dominant_continuation_only(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_MAP_K4V, 2, 2);
    llama_token t[64], out[16];
    int n = toks("abXY.abXY.abXY.abQR.a", t);

    (void)state;
    expect(out, thaw_ngram_draft(g, t, n, 'b', 2, out), "XY"); /* 3 vs 1 */
    thaw_ngram_free(g);
    g = make(1u << THAW_SPEC_NGRAM_MAP_K4V, 2, 2);
    n = toks("abXY.abQR.a", t);
    assert_int_equal(thaw_ngram_draft(g, t, n, 'b', 2, out), 0); /* 1 vs 1: none dominates */
    thaw_ngram_free(g);
}

static void test_mod_chains_lookups_token_by_token(void **state)
{
    struct thaw_ngram *g = make(1u << THAW_SPEC_NGRAM_MOD, 2, 6);
    llama_token t[64], out[16];
    /* "ab"->c, "bc"->d, "cd"->Z (the latest "cd" is in "cdZ"), "dZ"->W, "ZW"->., "W."->a */
    int n = toks("abcd.cdZW.a", t);

    (void)state;
    expect(out, thaw_ngram_draft(g, t, n, 'b', 6, out), "cdZW.a");
    thaw_ngram_free(g);
}

static void test_kinds_are_tried_in_order(void **state)
{
    struct thaw_ngram *g = make((1u << THAW_SPEC_NGRAM_SIMPLE) | (1u << THAW_SPEC_NGRAM_MOD), 3, 4);
    llama_token t[64], out[16];
    int n = toks("abcdefg.ab", t);

    (void)state;
    assert_int_equal(thaw_ngram_draft(g, t, n, 'c', 4, out), 4);
    assert_string_equal(thaw_ngram_last_kind(g), "ngram-simple");
    thaw_ngram_free(g);
}

static void test_off_without_an_ngram_kind(void **state)
{
    struct thaw_config cfg;
    struct thaw_ngram *g = (struct thaw_ngram *)&cfg;

    (void)state;
    thaw_config_init(&cfg);
    cfg.spec_types = 1u << THAW_SPEC_DRAFT;
    assert_false(thaw_ngram_enabled(&cfg));
    assert_int_equal(thaw_ngram_new(&cfg, 4096, &g), 0);
    assert_null(g);
    thaw_ngram_begin(NULL);
    thaw_ngram_accept(NULL, 3);
    thaw_ngram_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_copies_what_followed_the_latest_occurrence),
        cmocka_unit_test(test_a_loop_is_drafted_past_its_period),
        cmocka_unit_test(test_rollback_forgets_ngrams_past_the_common_prefix),
        cmocka_unit_test(test_the_next_draft_is_bounded_by_the_last_verdict),
        cmocka_unit_test(test_map_k_remembers_each_keys_accepted_count_per_request),
        cmocka_unit_test(test_map_k4v_drafts_the_dominant_continuation_only),
        cmocka_unit_test(test_mod_chains_lookups_token_by_token),
        cmocka_unit_test(test_kinds_are_tried_in_order),
        cmocka_unit_test(test_off_without_an_ngram_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
