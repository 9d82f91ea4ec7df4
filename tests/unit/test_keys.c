/* test_keys.c — conversation keys, bindings and tenant namespaces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <string.h>

#include "api/api.h"
#include "api/request_keys.h"
#include "cache/keys.h"

static void test_namespace_is_the_key_not_its_position(void **state)
{
    uint8_t a[THAW_KEY_BYTES], a2[THAW_KEY_BYTES], b[THAW_KEY_BYTES], anon[THAW_KEY_BYTES], empty[THAW_KEY_BYTES];

    (void)state;
    thaw_keys_namespace("alpha", 5, a);
    thaw_keys_namespace("alpha-and-more", 5, a2); /* only `len` bytes count */
    thaw_keys_namespace("beta", 4, b);
    thaw_keys_namespace(NULL, 0, anon);
    thaw_keys_namespace("", 0, empty);
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
    struct thaw_message m[] = {{(char *)"user", (char *)"hi", (char *)"{\"content\":\"hi\",\"role\":\"user\"}", NULL}};

    (void)state;
    thaw_keys_namespace("alpha", 5, nsa);
    thaw_keys_namespace("beta", 4, nsb);
    thaw_keys_binding(fp, "s", nsa, ba);
    thaw_keys_binding(fp, "s", nsb, bb);
    thaw_keys_binding(fp, "s", NULL, id);
    assert_memory_not_equal(ba, bb, THAW_KEY_BYTES);
    assert_memory_not_equal(ba, id, THAW_KEY_BYTES);
    thaw_request_keys_conversation(ba, m, 1, "{}", ka);
    thaw_request_keys_conversation(bb, m, 1, "{}", kb);
    assert_memory_not_equal(ka, kb, THAW_KEY_BYTES);
}

/* Two agents with the same messages but other tools (or kwargs) must not
 * share a key: the tools render into the prompt. */
static void test_request_binding_covers_tools_and_kwargs(void **state)
{
    uint8_t b[THAW_KEY_BYTES] = {7}, b1[THAW_KEY_BYTES], b2[THAW_KEY_BYTES], b3[THAW_KEY_BYTES], b4[THAW_KEY_BYTES];
    struct thaw_chat_request r1 = {0}, r2 = {0}, r3 = {0};

    (void)state;
    r1.tools_json = (char *)"[{\"function\":{\"name\":\"a\"},\"type\":\"function\"}]";
    r2.tools_json = (char *)"[{\"function\":{\"name\":\"b\"},\"type\":\"function\"}]";
    r3.tools_json = r1.tools_json;
    r3.template_kwargs = (char *)"{\"enable_thinking\":false}";
    thaw_request_keys_bind(b, &r1, b1);
    thaw_request_keys_bind(b, &r2, b2);
    thaw_request_keys_bind(b, &r3, b3);
    thaw_request_keys_bind(b, &r1, b4);
    assert_memory_not_equal(b1, b2, THAW_KEY_BYTES);
    assert_memory_not_equal(b1, b3, THAW_KEY_BYTES);
    assert_memory_equal(b1, b4, THAW_KEY_BYTES);
}

/* The settings string is pinned byte for byte: a change to it empties
 * every cache (each key is bound to it), so it must be a deliberate one.
 * Expected values from Python's hashlib.blake2b(digest_size=16). */
static void test_settings_string_is_pinned(void **state)
{
    struct thaw_keys_settings ks = {false, 1, 1, "TMPL", false, NULL};
    char out[256], other[256];

    (void)state;
    thaw_keys_settings(&ks, out, sizeof out);
    assert_string_equal(out, "swa_full=0;type_k=1;type_v=1;tmpl=7189671f88681696d81dff84057b93b7");
    ks = (struct thaw_keys_settings){true, 8, 2, "TMPL", true, "{\"a\":1}"};
    thaw_keys_settings(&ks, out, sizeof out);
    assert_string_equal(out, "swa_full=1;type_k=8;type_v=2;tmpl=1fe08d0c6c08d9076802788def720e4b");
    /* the template itself, not only its name or length */
    ks.chat_template = "TMPX";
    thaw_keys_settings(&ks, other, sizeof other);
    assert_string_not_equal(out, other);
    /* truncated, still terminated */
    thaw_keys_settings(&ks, out, 10);
    assert_string_equal(out, "swa_full=");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namespace_is_the_key_not_its_position),
        cmocka_unit_test(test_settings_string_is_pinned),
        cmocka_unit_test(test_binding_separates_tenants_and_identity),
        cmocka_unit_test(test_request_binding_covers_tools_and_kwargs),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
