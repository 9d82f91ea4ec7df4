/* test_api_anthropic.c — the Messages codec: blocks -> the internal
 * request's normal form, what never reaches the prompt, errors naming the
 * Anthropic field, the reply's blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_anthropic.h"
#include "base/error.h"

static int parse(const char *body, struct thaw_chat_request *r, char *err)
{
    return thaw_anthropic_parse(body, strlen(body), true, r, err, 256);
}

static void test_blocks_normalise(void **state)
{
    struct thaw_chat_request r;
    char err[256];
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"temperature\":0.5,\"top_k\":4,"
        "\"stop_sequences\":[\"END\"],\"metadata\":{\"user_id\":\"sess-1\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=1; cch=abcde;\"},"
        "{\"type\":\"text\",\"text\":\"A\",\"cache_control\":{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"B\"}],"
        "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}},"
        "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
        "\"thinking\":{\"type\":\"adaptive\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"f\",\"input\":{\"b\":1,\"a\":2}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"call_1\",\"content\":[{\"type\":\"text\",\"text\":\"r\"}]},"
        "{\"type\":\"text\",\"text\":\"go\",\"cache_control\":{\"type\":\"ephemeral\"}}]},"
        "{\"role\":\"system\",\"content\":\"later\"}]}";

    (void)state;
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.n_messages, 6);
    /* the billing block is gone, the others joined; cache_control renders nothing */
    assert_string_equal(r.messages[0].json, "{\"content\":\"A\\n\\nB\",\"role\":\"system\"}");
    assert_string_equal(r.messages[1].json, "{\"content\":\"hi\",\"role\":\"user\"}");
    /* the shape the engine keys its reply under (thaw_chat_parse_reply): input encoded in its key order */
    assert_string_equal(r.messages[2].json,
                        "{\"content\":\"ok\",\"reasoning_content\":\"hm\",\"role\":\"assistant\",\"tool_calls\":"
                        "[{\"function\":{\"arguments\":\"{\\\"b\\\":1,\\\"a\\\":2}\",\"name\":\"f\"},\"id\":\"call_1\","
                        "\"type\":\"function\"}]}");
    assert_string_equal(r.messages[3].json, "{\"content\":\"r\",\"role\":\"tool\",\"tool_call_id\":\"call_1\"}");
    assert_string_equal(r.messages[4].json, "{\"content\":\"go\",\"role\":\"user\"}");
    assert_string_equal(r.messages[5].json, "{\"content\":\"later\",\"role\":\"system\"}");
    assert_non_null(r.tools_json);
    assert_null(strstr(r.tools_json, "web_search")); /* server tools are not rendered */
    assert_string_equal(r.tool_choice, "required");
    assert_false(r.parallel_tool_calls);
    assert_string_equal(r.template_kwargs, "{\"enable_thinking\":true}");
    assert_true(r.stream);
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(r.top_k, 4);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.prompt_cache_key, "sess-1");
    thaw_chat_request_free(&r);
}

static void test_named_tool_and_schema(void **state)
{
    struct thaw_chat_request r;
    char err[256];

    (void)state;
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
                           "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
                           "\"output_config\":{\"effort\":\"high\",\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\"}}}}",
                           &r, err),
                     0);
    assert_string_equal(r.tool_choice_name, "f");
    assert_true(r.parallel_tool_calls);
    assert_string_equal(r.json_schema, "{\"type\":\"object\"}");
    /* no thinking field: the template's default; the effort is its reasoning_effort */
    assert_string_equal(r.template_kwargs, "{\"reasoning_effort\":\"high\"}");
    assert_int_equal(r.reasoning_budget, -1); /* the server's */
    thaw_chat_request_free(&r);

    /* enabled's budget_tokens is the reasoning budget; adaptive has none */
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
                           &r, err),
                     0);
    assert_int_equal(r.reasoning_budget, 1024);
    assert_string_equal(r.template_kwargs, "{\"enable_thinking\":true}");
    thaw_chat_request_free(&r);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"thinking\":{\"type\":\"adaptive\",\"budget_tokens\":1024}}",
                           &r, err),
                     0);
    assert_int_equal(r.reasoning_budget, -1);
    thaw_chat_request_free(&r);
}

static void test_errors_name_the_field(void **state)
{
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"[]", "JSON object"},
        {"{}", "'messages' is required"},
        {"{\"messages\":[]}", "non-empty"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content"},
        {"{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", "role 'bot'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", "content[0].source"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":\"r\"}]}]}", "tool_use_id"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":[1]}]}]}",
         "input must be an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5}", "temperature"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":[1]}", "stop_sequences[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"any\"}}", "needs 'tools'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"some\"}}", "tool_choice.type"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"on\"}}", "thinking.type"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}]}", "tools[0].input_schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_config\":{\"format\":{\"type\":\"json_schema\"}}}",
         "format.schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"text\"}]}", "system[0].text"},
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

/* Claude Code's max-tokens recovery prompts: recorded by none of its later
 * requests, so only a last one renders, marked transient (the reply is
 * keyed and re-decoded as the history without it). */
static void test_recovery_prompt_is_transient(void **state)
{
    struct thaw_chat_request r;
    char err[256];
#define RECOVERY "Output token limit hit. Resume directly \u2014 no apology, no recap of what you were doing."
    const char *within =
        "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a1\"}]},"
        "{\"role\":\"user\",\"content\":\"" RECOVERY "\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a2\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"" RECOVERY "\","
        "\"cache_control\":{\"type\":\"ephemeral\"}}]}]}";
    const char *next =
        "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a1\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a2\"}]},"
        "{\"role\":\"user\",\"content\":\"bye\"}]}";

    (void)state;
    assert_int_equal(parse(within, &r, err), 0);
    assert_int_equal(r.n_messages, 4); /* hi, a1, a2, the last recovery prompt */
    assert_string_equal(r.messages[2].json, "{\"content\":\"a2\",\"role\":\"assistant\"}");
    assert_string_equal(r.messages[3].role, "user");
    assert_true(r.last_transient);
    assert_int_equal(thaw_chat_request_n_history(&r), 3);
    thaw_chat_request_free(&r);
    /* the next turn: the same history, nothing transient */
    assert_int_equal(parse(next, &r, err), 0);
    assert_int_equal(r.n_messages, 4);
    assert_string_equal(r.messages[2].json, "{\"content\":\"a2\",\"role\":\"assistant\"}");
    assert_false(r.last_transient);
    assert_int_equal(thaw_chat_request_n_history(&r), 4);
    thaw_chat_request_free(&r);
#undef RECOVERY
}

static void test_reply_blocks(void **state)
{
    struct thaw_timings t = {.cache_n = 30, .predicted_n = 5};
    char *m = thaw_anthropic_message_json(
        "msg_1", "thaw",
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\",\"tool_calls\":[{\"type\":\"function\","
        "\"id\":\"call_a0\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}},{\"type\":\"function\","
        "\"id\":\"call_a1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":\"}}]}",
        "tool_calls", NULL, 100, &t);

    (void)state;
    assert_non_null(m);
    assert_non_null(strstr(m, "\"stop_reason\":\"tool_use\""));
    assert_non_null(strstr(m, "{\"type\":\"thinking\",\"thinking\":\"r\",\"signature\":\"thaw-"));
    assert_non_null(strstr(m, "\"input\":{\"x\":1}"));
    assert_non_null(strstr(m, "\"id\":\"call_a1\",\"name\":\"f\",\"input\":{}")); /* cut short: not JSON yet */
    assert_non_null(strstr(m, "\"input_tokens\":70"));
    assert_non_null(strstr(m, "\"cache_read_input_tokens\":30"));
    assert_non_null(strstr(m, "\"output_tokens\":5"));
    free(m);
    m = thaw_anthropic_error_json(404, "no");
    assert_string_equal(m, "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"no\"}}");
    free(m);
    assert_non_null(strstr(m = thaw_anthropic_message_json("msg_2", "thaw", "{\"role\":\"assistant\",\"content\":\"a\"}",
                                                           "stop", "END", 10, &t),
                           "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\""));
    free(m);
    assert_non_null(strstr(m = thaw_anthropic_message_json("msg_3", "thaw", "{\"role\":\"assistant\",\"content\":\"a\"}",
                                                           "stop", NULL, 10, &t),
                           "\"stop_reason\":\"end_turn\",\"stop_sequence\":null"));
    free(m);
    assert_string_equal(thaw_anthropic_stop_reason("length", NULL), "max_tokens");
    assert_string_equal(thaw_anthropic_stop_reason("stop", NULL), "end_turn");
    assert_string_equal(thaw_anthropic_stop_reason("stop", "END"), "stop_sequence");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_normalise),
        cmocka_unit_test(test_named_tool_and_schema),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_recovery_prompt_is_transient),
        cmocka_unit_test(test_reply_blocks),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
