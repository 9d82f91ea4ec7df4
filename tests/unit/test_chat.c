/* test_chat.c — conversation keys and tenant namespaces (the parts of
 * chat.c that need no model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <string.h>

#include "chat.h"

static void test_namespace_is_the_key_not_its_position(void **state)
{
    uint8_t a[THAW_KEY_BYTES], a2[THAW_KEY_BYTES], b[THAW_KEY_BYTES], anon[THAW_KEY_BYTES], empty[THAW_KEY_BYTES];

    (void)state;
    thaw_chat_namespace("alpha", 5, a);
    thaw_chat_namespace("alpha-and-more", 5, a2); /* only `len` bytes count */
    thaw_chat_namespace("beta", 4, b);
    thaw_chat_namespace(NULL, 0, anon);
    thaw_chat_namespace("", 0, empty);
    assert_memory_equal(a, a2, THAW_KEY_BYTES);
    assert_memory_not_equal(a, b, THAW_KEY_BYTES);
    assert_memory_not_equal(a, anon, THAW_KEY_BYTES);
    assert_memory_equal(anon, empty, THAW_KEY_BYTES);
    /* one-way: not the key's bytes, not an unkeyed hash of them */
    uint8_t plain[THAW_KEY_BYTES];
    crypto_generichash(plain, sizeof plain, (const unsigned char *)"alpha", 5, NULL, 0);
    assert_memory_not_equal(a, plain, THAW_KEY_BYTES);
}

static void test_binding_separates_tenants_and_identity(void **state)
{
    uint8_t fp[THAW_KEY_BYTES] = {1}, nsa[THAW_KEY_BYTES], nsb[THAW_KEY_BYTES];
    uint8_t ba[THAW_KEY_BYTES], bb[THAW_KEY_BYTES], id[THAW_KEY_BYTES], ka[THAW_KEY_BYTES], kb[THAW_KEY_BYTES];
    struct thaw_message m[] = {{(char *)"user", (char *)"hi"}};

    (void)state;
    thaw_chat_namespace("alpha", 5, nsa);
    thaw_chat_namespace("beta", 4, nsb);
    thaw_chat_binding(fp, "s", nsa, ba);
    thaw_chat_binding(fp, "s", nsb, bb);
    thaw_chat_binding(fp, "s", NULL, id);
    assert_memory_not_equal(ba, bb, THAW_KEY_BYTES);
    assert_memory_not_equal(ba, id, THAW_KEY_BYTES);
    thaw_chat_key(ba, m, 1, "yo", ka);
    thaw_chat_key(bb, m, 1, "yo", kb);
    assert_memory_not_equal(ka, kb, THAW_KEY_BYTES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namespace_is_the_key_not_its_position),
        cmocka_unit_test(test_binding_separates_tenants_and_identity),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
