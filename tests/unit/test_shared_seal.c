/* test_shared_seal.c — the shared tier's object envelope: names, sealing,
 * and every way an object must fail to open (shared_seal.h). The tier's
 * flow against a real store is in tests/e2e/test_shared_tier.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/error.h"
#include "cache/shared_seal.h"

static const char secret[] = "0123456789abcdef-cluster";
static const uint8_t identity[THAW_KEY_BYTES] = {7, 7, 7};
static const uint8_t ns_a[THAW_KEY_BYTES] = {1}, ns_b[THAW_KEY_BYTES] = {2};
static const uint8_t id[THAW_KEY_BYTES] = {0xab, 0xcd};

struct sealed {
    struct thaw_shared_names nm;
    char name[160];
    void *obj;
    size_t n;
    uint8_t kv[1000], dft[10];
};

static void seal(struct sealed *s)
{
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{s->kv, sizeof s->kv}, {NULL, 0}, {s->dft, sizeof s->dft}};

    randombytes_buf(s->kv, sizeof s->kv);
    randombytes_buf(s->dft, sizeof s->dft);
    assert_int_equal(thaw_shared_derive(secret, strlen(secret), identity, &s->nm), 0);
    thaw_shared_name(&s->nm, ns_a, 'm', id, s->name, sizeof s->name);
    assert_int_equal(thaw_shared_seal(&s->nm, s->name, ns_a, identity, 42, parts, &s->obj, &s->n), 0);
}

static int open_as(const struct sealed *s, const struct thaw_shared_names *nm, const char *name, const uint8_t *ns,
                   const uint8_t *ident, const void *obj, size_t n)
{
    struct thaw_part_blob parts[THAW_PART_COUNT];
    uint32_t n_tokens = 0;
    int rc = thaw_shared_open_object(nm, name, ns, ident, obj, n, &n_tokens, parts);

    if (rc == 0) {
        assert_int_equal(n_tokens, 42);
        assert_int_equal(parts[THAW_PART_KV].size, sizeof s->kv);
        assert_memory_equal(parts[THAW_PART_KV].data, s->kv, sizeof s->kv);
        assert_int_equal(parts[THAW_PART_CKPT].size, 0);
        assert_int_equal(parts[THAW_PART_DFT].size, sizeof s->dft);
        assert_memory_equal(parts[THAW_PART_DFT].data, s->dft, sizeof s->dft);
        for (int p = 0; p < THAW_PART_COUNT; p++)
            thaw_blob_unref(parts[p].data);
    } else {
        for (int p = 0; p < THAW_PART_COUNT; p++)
            assert_null(parts[p].data); /* nothing of a rejected object is handed out */
    }
    return rc;
}

static void test_round_trip_and_names(void **state)
{
    struct sealed s;
    (void)state;
    seal(&s);
    assert_int_equal(open_as(&s, &s.nm, s.name, ns_a, identity, s.obj, s.n), 0);
    /* v1/<model 16 hex>/<tenant 16 hex>/m/<64 hex> */
    assert_int_equal(strlen(s.name), 3 + 17 + 17 + 2 + 64);
    assert_memory_equal(s.name, "v1/", 3);
    assert_memory_equal(s.name + 3 + 17 + 17, "m/abcd", 6);
    char other[160];
    thaw_shared_name(&s.nm, ns_b, 'm', id, other, sizeof other);
    assert_memory_equal(other, s.name, 20);              /* same model */
    assert_memory_not_equal(other + 20, s.name + 20, 16); /* another tenant */
    /* the ciphertext does not carry the plaintext */
    assert_null(memmem(s.obj, s.n, s.kv, 64));
    free(s.obj);
}

static void test_every_forgery_is_rejected(void **state)
{
    struct sealed s;
    struct thaw_shared_names other_secret;
    uint8_t other_identity[THAW_KEY_BYTES] = {8};
    char b_name[160];
    (void)state;
    seal(&s);
    uint8_t *copy = malloc(s.n);

    /* a flipped byte anywhere: magic, nonce, ciphertext, tag */
    size_t where[] = {0, 5, 40, s.n / 2, s.n - 1};
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        memcpy(copy, s.obj, s.n);
        copy[where[i]] ^= 0x01;
        assert_int_equal(open_as(&s, &s.nm, s.name, ns_a, identity, copy, s.n), THAW_ECORRUPT);
    }
    /* truncated, at every length class */
    size_t cut[] = {0, 3, 28, 40, s.n - 16, s.n - 1};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++)
        assert_int_equal(open_as(&s, &s.nm, s.name, ns_a, identity, s.obj, cut[i]), THAW_ECORRUPT);
    /* copied to another name: another tenant's, a block's */
    thaw_shared_name(&s.nm, ns_b, 'm', id, b_name, sizeof b_name);
    assert_int_equal(open_as(&s, &s.nm, b_name, ns_b, identity, s.obj, s.n), THAW_ECORRUPT);
    assert_int_equal(open_as(&s, &s.nm, s.name, ns_b, identity, s.obj, s.n), THAW_ECORRUPT);
    thaw_shared_name(&s.nm, ns_a, 'b', id, b_name, sizeof b_name);
    assert_int_equal(open_as(&s, &s.nm, b_name, ns_a, identity, s.obj, s.n), THAW_ECORRUPT);
    /* another model */
    assert_int_equal(open_as(&s, &s.nm, s.name, ns_a, other_identity, s.obj, s.n), THAW_ECORRUPT);
    /* another cluster secret */
    assert_int_equal(thaw_shared_derive("another secret, 16+", 19, identity, &other_secret), 0);
    assert_int_equal(open_as(&s, &other_secret, s.name, ns_a, identity, s.obj, s.n), THAW_ECORRUPT);
    /* and the original still opens */
    assert_int_equal(open_as(&s, &s.nm, s.name, ns_a, identity, s.obj, s.n), 0);
    free(copy);
    free(s.obj);
}

static void test_short_secrets_are_refused(void **state)
{
    struct thaw_shared_names nm;
    (void)state;
    assert_int_equal(thaw_shared_derive("short", 5, identity, &nm), THAW_EINVAL);
    assert_int_equal(thaw_shared_derive("exactly-16-bytes", 16, identity, &nm), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_names),
        cmocka_unit_test(test_every_forgery_is_rejected),
        cmocka_unit_test(test_short_secrets_are_refused),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
