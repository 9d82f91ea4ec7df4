/* test_api_responses.c — the Responses codec: input items -> the internal
 * request's normal form (a reply's items merge back into one assistant
 * turn), errors naming the field, the response object's items. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_responses.h"
#include "base/error.h"

static int parse(const char *body, struct thaw_chat_request *r, char *err)
{
    return thaw_responses_parse(body, strlen(body), true, r, err, 256);
}

static void test_items_merge(void **state)
{
    struct thaw_chat_request r;
    char err[256];
    const char *body =
        "{\"model\":\"m\",\"instructions\":\"I\",\"stream\":true,\"store\":false,\"max_output_tokens\":7,"
        "\"prompt_cache_key\":\"thread-1\",\"reasoning\":{\"effort\":\"high\"},\"include\":[\"reasoning.encrypted_content\"],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},{\"type\":\"web_search\"},"
        "{\"type\":\"namespace\",\"name\":\"mcp\",\"tools\":[{\"type\":\"function\",\"name\":\"g\"}]}],"
        "\"input\":[{\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"D\"}]},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hm\"}],\"encrypted_content\":\"x\"},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r\"},"
        "{\"role\":\"assistant\",\"content\":\"done\"}]}";

    (void)state;
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.n_messages, 6);
    assert_string_equal(r.messages[0].json, "{\"content\":\"I\",\"role\":\"system\"}");
    assert_string_equal(r.messages[1].json, "{\"content\":\"D\",\"role\":\"system\"}"); /* developer */
    assert_string_equal(r.messages[2].json, "{\"content\":\"ab\",\"role\":\"user\"}");
    /* reasoning + message + function_call: the one assistant turn thaw answered */
    assert_string_equal(r.messages[3].json,
                        "{\"content\":\"ok\",\"reasoning_content\":\"hm\",\"role\":\"assistant\",\"tool_calls\":"
                        "[{\"function\":{\"arguments\":\"{\\\"x\\\":1}\",\"name\":\"f\"},\"id\":\"c1\",\"type\":\"function\"}]}");
    assert_string_equal(r.messages[4].json, "{\"content\":\"r\",\"role\":\"tool\",\"tool_call_id\":\"c1\"}");
    assert_string_equal(r.messages[5].json, "{\"content\":\"done\",\"role\":\"assistant\"}");
    assert_non_null(strstr(r.tools_json, "\"name\":\"g\""));
    assert_null(strstr(r.tools_json, "web_search"));
    assert_true(r.parallel_tool_calls);
    assert_int_equal(r.max_tokens, 7);
    assert_string_equal(r.prompt_cache_key, "thread-1");
    thaw_chat_request_free(&r);

    assert_int_equal(parse("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                           "\"schema\":{\"type\":\"object\"}}},\"tool_choice\":\"auto\"}",
                           &r, err),
                     0);
    assert_int_equal(r.n_messages, 1);
    assert_string_equal(r.json_schema, "{\"type\":\"object\"}");
    thaw_chat_request_free(&r);
}

static void test_errors_name_the_field(void **state)
{
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"{}", "'input' is required"},
        {"{\"input\":[]}", "non-empty"},
        {"{\"input\":\"x\",\"store\":true}", "'store'"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "content[0].image_url"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "call_id"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"r\"}]}", "input[0].call_id"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "item_reference"},
        {"{\"input\":[{\"type\":\"computer_call\"}]}", "computer_call"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
        {"{\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"{\"input\":\"x\",\"temperature\":9}", "temperature"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct thaw_chat_request r;
        char err[256] = "";
        assert_int_equal(parse(cases[i].body, &r, err), THAW_EINVAL);
        if (!strstr(err, cases[i].needle))
            fail_msg("case %zu: '%s' does not name '%s'", i, err, cases[i].needle);
    }
}

static void test_response_items(void **state)
{
    struct thaw_timings t = {.cache_n = 30, .predicted_n = 5};
    char *s = thaw_responses_json("resp_ab", "thaw", 1,
                                  "{\"role\":\"assistant\",\"content\":\"hi\",\"reasoning_content\":\"r\",\"tool_calls\":"
                                  "[{\"type\":\"function\",\"id\":\"call_x0\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}",
                                  "length", 100, &t);

    (void)state;
    assert_non_null(s);
    assert_non_null(strstr(s, "\"status\":\"incomplete\""));
    assert_non_null(strstr(s, "{\"type\":\"reasoning\",\"id\":\"rs_ab_0\""));
    assert_non_null(strstr(s, "{\"type\":\"message\",\"id\":\"msg_ab_1\""));
    assert_non_null(strstr(s, "{\"type\":\"function_call\",\"id\":\"fc_ab_2\",\"call_id\":\"call_x0\""));
    assert_non_null(strstr(s, "\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":30}"));
    free(s);
    s = thaw_responses_json("resp_ab", "thaw", 1, NULL, NULL, 100, &t);
    assert_non_null(strstr(s, "\"status\":\"in_progress\",\"output\":[]"));
    assert_non_null(strstr(s, "\"usage\":null"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_merge),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_response_items),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
