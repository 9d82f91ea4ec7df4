/* test_api.c — request parsing: every field validated, errors name it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "api/api.h"
#include "api/api_llamaserver.h"
#include "base/error.h"

static int parse(const char *body, struct thaw_chat_request *r, char *err)
{
    return thaw_api_parse_chat(body, strlen(body), true, r, err, 256);
}

static void test_minimal_defaults(void **state)
{
    struct thaw_chat_request r;
    char err[256];

    (void)state;
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, err), 0);
    assert_int_equal(r.n_messages, 1);
    assert_string_equal(r.messages[0].role, "user");
    assert_string_equal(r.messages[0].content, "hi");
    assert_false(r.stream);
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.cache_prompt);
    assert_int_equal(r.n_stop, 0);
    thaw_chat_request_free(&r);
}

static void test_all_fields(void **state)
{
    struct thaw_chat_request r;
    char err[256];
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                       "{\"role\":\"assistant\",\"content\":null}],"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":5,"
                       "\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,\"min_p\":0.1,"
                       "\"seed\":42,\"stop\":[\"x\",\"\",\"yz\"],\"cache_prompt\":false}";

    (void)state;
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.n_messages, 3);
    assert_string_equal(r.messages[1].content, "ab");
    assert_string_equal(r.messages[2].content, "");
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.max_tokens, 7); /* max_completion_tokens wins */
    assert_true(r.temperature > 0.49f && r.temperature < 0.51f);
    assert_int_equal(r.top_k, 3);
    assert_true(r.has_seed);
    assert_int_equal(r.seed, 42);
    assert_int_equal(r.n_stop, 2); /* the empty stop string is dropped */
    assert_string_equal(r.stop[1], "yz");
    assert_false(r.cache_prompt);
    assert_string_equal(r.model, "m");
    thaw_chat_request_free(&r);
}

static void test_errors_name_the_field(void **state)
{
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"", "not valid JSON"},
        {"{", "not valid JSON"},
        {"[1]", "JSON object"},
        {"{}", "'messages' is required"},
        {"{\"messages\":{}}", "'messages' must be an array"},
        {"{\"messages\":[]}", "must not be empty"},
        {"{\"messages\":[1]}", "messages[0] must be an object"},
        {"{\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":{}}]}", "messages[1].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "content[0].text"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "'max_tokens'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":2}", "'top_p'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":\"1\"}", "'seed'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "at most"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":1}", "'stream_options'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_prompt\":1}", "'cache_prompt'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":5}", "'model'"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct thaw_chat_request r;
        char err[256] = "";
        assert_int_equal(parse(cases[i].body, &r, err), THAW_EINVAL);
        if (!strstr(err, cases[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
        assert_null(r.messages); /* nothing left to free */
    }
}

static void test_builders_produce_json(void **state)
{
    struct thaw_timings t = {.cache_n = 3, .prompt_n = 4, .prompt_ms = 2, .predicted_n = 5, .predicted_ms = 10,
                             .cache_source = "disk", .restore_ms = 1.5};
    char *s;

    (void)state;
    s = thaw_api_error_json(413, "too big");
    assert_string_equal(s, "{\"error\":{\"message\":\"too big\",\"type\":\"invalid_request_error\",\"code\":413}}");
    free(s);
    assert_null(thaw_api_completion_json("id1", "m", 1, "not json", "stop", 7, &t));
    s = thaw_api_completion_json("id1", "m", 1,
                                 "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
                                 "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}",
                                 "tool_calls", 7, &t);
    assert_non_null(strstr(s, "\"tool_calls\":[{"));
    assert_non_null(strstr(s, "\"finish_reason\":\"tool_calls\""));
    assert_non_null(strstr(s, "\"cached_tokens\":3"));
    assert_non_null(strstr(s, "\"prompt_per_second\":2000"));
    {
        /* timings hold numbers only (llama-server's; clients decode them as
         * such); what served the cache sits beside them */
        json_t *root = json_loads(s, 0, NULL), *v;
        const char *k;
        assert_non_null(root);
        json_object_foreach(json_object_get(root, "timings"), k, v)
        {
            if (!json_is_number(v))
                fail_msg("timings.%s is not a number", k);
        }
        assert_string_equal(json_string_value(json_object_get(root, "cache_source")), "disk");
        json_decref(root);
    }
    free(s);
    s = thaw_api_chunk_json("id1", "m", 1, NULL, NULL, NULL, &t, 7, true);
    assert_non_null(strstr(s, "\"choices\":[]"));
    assert_non_null(strstr(s, "\"total_tokens\":12"));
    free(s);
}

/* Found by fuzz_chat_request: jansson quotes the raw bytes near a bad
 * escape, and the 400's body came out empty (json_pack refuses invalid
 * UTF-8). */
static void test_error_body_with_client_bytes_is_json(void **state)
{
    struct thaw_chat_request req;
    char err[256];
    const char bad[] = "\"\\\xd0\x8f";

    (void)state;
    assert_int_equal(thaw_api_parse_chat(bad, sizeof bad - 1, true, &req, err, sizeof err), THAW_EINVAL);
    char *s = thaw_api_error_json(400, err);
    assert_non_null(s);
    assert_non_null(strstr(s, "\"code\":400"));
    free(s);
    s = thaw_api_error_json(400, "cut \xc3");
    assert_non_null(s);
    assert_non_null(strstr(s, "cut \xef\xbf\xbd"));
    free(s);
}

static void test_admit_bounds_before_tokenizing(void **state)
{
    struct thaw_chat_request req;
    char err[256];
    char body[512];

    (void)state;
    const char *three = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                        "{\"role\":\"assistant\",\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}";
    assert_int_equal(thaw_api_parse_chat(three, strlen(three), true, &req, err, sizeof err), 0);
    assert_int_equal(thaw_api_admit(&req, 3, 16, err, sizeof err), THAW_EINVAL); /* 3 messages, 3 tokens */
    assert_non_null(strstr(err, "messages"));
    assert_int_equal(thaw_api_admit(&req, 4, 16, err, sizeof err), 0);
    thaw_chat_request_free(&req);

    /* 200 bytes of text with tokens of at most 10 bytes: >= 20 tokens */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%0200d\"}]}", 0);
    assert_int_equal(thaw_api_parse_chat(body, strlen(body), true, &req, err, sizeof err), 0);
    assert_int_equal(thaw_api_admit(&req, 20, 10, err, sizeof err), THAW_EINVAL);
    assert_non_null(strstr(err, "200 bytes"));
    assert_int_equal(thaw_api_admit(&req, 21, 10, err, sizeof err), 0);
    thaw_chat_request_free(&req);
}

/* Agent fields: validated, normalised, and the unsupported refused by name. */
static void test_agent_fields(void **state)
{
    struct thaw_chat_request req;
    char err[256];

    (void)state;
    const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                     "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
                     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                     "\"response_format\":{\"type\":\"json_object\"},\"chat_template_kwargs\":{\"enable_thinking\":false},"
                     "\"user\":\"u1\",\"metadata\":{\"a\":\"b\"},\"store\":false}";
    assert_int_equal(thaw_api_parse_chat(ok, strlen(ok), true, &req, err, sizeof err), 0);
    assert_string_equal(req.tool_choice, "required");
    assert_string_equal(req.tool_choice_name, "f");
    assert_string_equal(req.json_schema, "{\"type\":\"object\"}");
    assert_non_null(req.tools_json);
    assert_string_equal(req.template_kwargs, "{\"enable_thinking\":false}");
    /* arguments given as an object become the string OpenAI sends */
    assert_non_null(strstr(req.messages[1].json, "\"arguments\":\"{\\\"x\\\":1}\""));
    assert_non_null(strstr(req.messages[1].json, "\"content\":null"));
    assert_non_null(strstr(req.messages[2].json, "\"tool_call_id\":\"c1\""));
    thaw_chat_request_free(&req);

    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "'tools'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", "tools[0].function.name"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", "'tool_choice'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", "needs 'tools'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":1}", "'parallel_tool_calls'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"yaml\"}}", "'response_format.type'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", "json_schema.schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", "'chat_template_kwargs'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", "'logprobs'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "'top_logprobs' requires"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "'top_logprobs'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_probs\":101}", "'n_probs'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":9}", "'n'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"return_progress\":1}", "'return_progress'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", "image_url"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "only assistant"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"function\":{\"name\":3}}]}]}", "tool_calls[0].function.name"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":5}]}", "tool_call_id"},
    };
    /* accepted: logprobs (default 20 candidates, llama-server's), n_probs over it, n, return_progress */
    static const char okp[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                             "\"post_sampling_probs\":true,\"n\":3,\"return_progress\":true}";
    assert_int_equal(thaw_api_parse_chat(okp, strlen(okp), true, &req, err, sizeof err), 0);
    assert_true(req.logprobs && req.n_probs == 20 && req.post_sampling_probs && req.n_choices == 3 && req.return_progress);
    thaw_chat_request_free(&req);
    static const char np[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_probs\":0,\"logprobs\":true}";
    assert_int_equal(thaw_api_parse_chat(np, strlen(np), true, &req, err, sizeof err), 0);
    assert_false(req.logprobs); /* llama-server's n_probs wins: 0 is none */
    thaw_chat_request_free(&req);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (thaw_api_parse_chat(bad[i].body, strlen(bad[i].body), true, &req, err, sizeof err) != THAW_EINVAL)
            fail_msg("accepted: %s", bad[i].body);
        if (!strstr(err, bad[i].needle))
            fail_msg("'%s' lacks '%s'", err, bad[i].needle);
    }
}

/* prompt_cache_key: the conversation id a proxy routes on. thaw keeps it for
 * its logs; it is bounded in bytes (not characters) like any other id. */
static void test_prompt_cache_key(void **state)
{
    struct thaw_chat_request req;
    char err[256], body[4096], key[THAW_API_MAX_CONVERSATION_ID + 2];
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";

    (void)state;
    snprintf(body, sizeof body, "{%s}", msgs);
    assert_int_equal(parse(body, &req, err), 0);
    assert_null(req.prompt_cache_key);
    thaw_chat_request_free(&req);
    snprintf(body, sizeof body, "{%s,\"prompt_cache_key\":null}", msgs);
    assert_int_equal(parse(body, &req, err), 0);
    assert_null(req.prompt_cache_key);
    thaw_chat_request_free(&req);
    snprintf(body, sizeof body, "{\"prompt_cache_key\":\"conv-7\",%s}", msgs);
    assert_int_equal(parse(body, &req, err), 0);
    assert_string_equal(req.prompt_cache_key, "conv-7");
    thaw_chat_request_free(&req);
    assert_null(req.prompt_cache_key); /* freed with the request */

    /* exactly the limit, then one byte over */
    memset(key, 'k', THAW_API_MAX_CONVERSATION_ID);
    key[THAW_API_MAX_CONVERSATION_ID] = '\0';
    snprintf(body, sizeof body, "{%s,\"prompt_cache_key\":\"%s\"}", msgs, key);
    assert_int_equal(parse(body, &req, err), 0);
    assert_int_equal(strlen(req.prompt_cache_key), THAW_API_MAX_CONVERSATION_ID);
    thaw_chat_request_free(&req);
    strcat(key, "k");
    snprintf(body, sizeof body, "{%s,\"prompt_cache_key\":\"%s\"}", msgs, key);
    assert_int_equal(parse(body, &req, err), THAW_EINVAL);
    assert_non_null(strstr(err, "'prompt_cache_key'"));
    assert_non_null(strstr(err, "1024 bytes"));
    assert_null(req.messages);
    /* 342 euro signs: 342 characters but 1026 bytes */
    size_t n = 0;
    n += (size_t)snprintf(body, sizeof body, "{%s,\"prompt_cache_key\":\"", msgs);
    for (int i = 0; i < 342; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, "\xe2\x82\xac");
    snprintf(body + n, sizeof body - n, "\"}");
    assert_int_equal(parse(body, &req, err), THAW_EINVAL);
    assert_non_null(strstr(err, "'prompt_cache_key'"));

    static const char *const wrong[] = {"5", "true", "{}", "[\"a\"]"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        snprintf(body, sizeof body, "{%s,\"prompt_cache_key\":%s}", msgs, wrong[i]);
        assert_int_equal(parse(body, &req, err), THAW_EINVAL);
        if (!strstr(err, "'prompt_cache_key' must be a string"))
            fail_msg("%s: '%s'", wrong[i], err);
        assert_null(req.messages);
    }
}

/* GET /cache: every sample line of the Prometheus text, "thaw_" cut, integers
 * exact; HELP/TYPE lines and anything not thaw's are not carried over. */
/* assistant prefill, continue_final_message and add_generation_prompt, with
 * llama-server's 400s; logit_bias in both shapes */
static void test_continuation_and_bias(void **state)
{
    struct thaw_chat_request r;
    char err[256];

    (void)state;
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, err), 0);
    assert_true(r.add_generation_prompt);
    assert_false(r.continue_final);
    assert_int_equal(r.id_slot, -1);
    assert_int_equal(r.verbose, -1);
    thaw_chat_request_free(&r);
    /* a trailing assistant message is a prefill: continued, no generation prompt, not in the history */
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                           "{\"role\":\"assistant\",\"content\":\"Wh\"}]}", &r, err), 0);
    assert_true(r.continue_final);
    assert_false(r.add_generation_prompt);
    assert_int_equal(thaw_chat_request_n_history(&r), 1);
    thaw_chat_request_free(&r);
    /* continue_final_message false: rendered closed, as the history it is */
    assert_int_equal(parse("{\"continue_final_message\":false,\"add_generation_prompt\":false,\"messages\":["
                           "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"Wh\"}]}",
                           &r, err), 0);
    assert_false(r.continue_final);
    assert_int_equal(thaw_chat_request_n_history(&r), 2);
    thaw_chat_request_free(&r);
    static const char *const bad[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
        "{\"role\":\"assistant\",\"content\":\"c\"}]}",
        "{\"add_generation_prompt\":true,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
        "{\"role\":\"assistant\",\"content\":\"b\"}]}",
        "{\"continue_final_message\":true,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        "{\"continue_final_message\":\"maybe\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
        "{\"logit_bias\":[[1]],\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        "{\"logit_bias\":{\"5\":\"x\"},\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(parse(bad[i], &r, err), THAW_EINVAL);
    assert_int_equal(parse("{\"logit_bias\":{\"5\":-100,\"7\":false},\"id_slot\":1,\"verbose\":true,"
                           "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &r, err), 0);
    assert_int_equal(r.n_bias, 2);
    assert_int_equal(r.bias[0].token, 5);
    assert_true(r.bias[0].bias == -100.0f);
    assert_true(r.bias[1].bias < -1e30f);
    assert_int_equal(r.id_slot, 1);
    assert_int_equal(r.verbose, 1);
    thaw_chat_request_free(&r);
    assert_int_equal(parse("{\"logit_bias\":[[\" the\",2.5],[9,false]],"
                           "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &r, err), 0);
    assert_int_equal(r.n_bias, 2);
    assert_string_equal(r.bias[0].text, " the");
    assert_int_equal(r.bias[1].token, 9);
    thaw_chat_request_free(&r);
}

/* llama-server's reasoning fields: the budget under either name (the
 * longer one wins), its message, reasoning_effort into the template's
 * kwargs ("none": enable_thinking false, over chat_template_kwargs); the
 * implicit prefill undone by --no-prefill-assistant. */
static void test_reasoning_fields(void **state)
{
    struct thaw_chat_request r;
    char err[256];
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char body[512];

    (void)state;
    snprintf(body, sizeof body, "%s}", m);
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.reasoning_budget, -1);
    assert_null(r.reasoning_budget_message);
    thaw_chat_request_free(&r);
    snprintf(body, sizeof body, "%s,\"thinking_budget_tokens\":9,\"reasoning_budget_tokens\":2,"
                                "\"reasoning_budget_message\":\" ok\",\"reasoning_effort\":\"high\","
                                "\"chat_template_kwargs\":{\"z\":1}}", m);
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.reasoning_budget, 2);
    assert_string_equal(r.reasoning_budget_message, " ok");
    assert_string_equal(r.template_kwargs, "{\"reasoning_effort\":\"high\",\"z\":1}");
    thaw_chat_request_free(&r);
    snprintf(body, sizeof body, "%s,\"thinking_budget_tokens\":9,\"reasoning_effort\":\"none\","
                                "\"chat_template_kwargs\":{\"enable_thinking\":true}}", m);
    assert_int_equal(parse(body, &r, err), 0);
    assert_int_equal(r.reasoning_budget, 9);
    assert_string_equal(r.template_kwargs, "{\"enable_thinking\":false}");
    assert_int_equal(thaw_api_kwargs_set(&r, "enable_thinking", "true", true), 0); /* there: kept */
    assert_string_equal(r.template_kwargs, "{\"enable_thinking\":false}");
    assert_int_equal(thaw_api_kwargs_set(&r, "a", "[1]", false), 0);
    assert_string_equal(r.template_kwargs, "{\"a\":[1],\"enable_thinking\":false}");
    thaw_chat_request_free(&r);
    static const char *const bad[] = {"\"reasoning_budget_tokens\":-2", "\"thinking_budget_tokens\":\"5\"",
                                      "\"reasoning_budget_message\":3", "\"reasoning_effort\":\"\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "%s,%s}", m, bad[i]);
        assert_int_equal(parse(body, &r, err), THAW_EINVAL);
    }

    /* a trailing assistant message: a prefill by default, whole with --no-prefill-assistant */
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                           "{\"role\":\"assistant\",\"content\":\"y\"}]}",
                           &r, err),
                     0);
    assert_true(r.continue_final && r.prefill_implicit && r.last_transient && !r.add_generation_prompt);
    thaw_api_no_prefill(&r);
    assert_true(!r.continue_final && !r.last_transient && r.add_generation_prompt);
    thaw_chat_request_free(&r);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                           "{\"role\":\"assistant\",\"content\":\"y\"}],\"continue_final_message\":true}",
                           &r, err),
                     0);
    thaw_api_no_prefill(&r); /* asked for explicitly: stays */
    assert_true(r.continue_final && !r.prefill_implicit);
    thaw_chat_request_free(&r);
}

static void test_cache_json_from_metrics_text(void **state)
{
    const char *text = "# HELP thaw_kv_cache_hits_disk_total lookups served by the disk tier\n"
                       "# TYPE thaw_kv_cache_hits_disk_total counter\n"
                       "thaw_kv_cache_hits_disk_total 3\n"
                       "thaw_kv_disk_bytes 1234567890123\n"
                       "thaw_prompt_seconds_total 0.25\n"
                       "other_metric 7\n"
                       "thaw_no_value\n";
    char *j = thaw_api_cache_json(text);

    (void)state;
    assert_non_null(j);
    assert_string_equal(j, "{\"object\":\"thaw.cache\",\"metrics\":{\"kv_cache_hits_disk_total\":3,"
                           "\"kv_disk_bytes\":1234567890123,\"prompt_seconds_total\":0.25}}");
    free(j);
}

/* --models-dir: the request's model, and the router's list */
static void test_request_model_and_router_list(void **state)
{
    const char *b = "{\"model\":\"alpha\",\"messages\":[]}";
    char *m = thaw_api_request_model(b, strlen(b));
    (void)state;
    assert_non_null(m);
    assert_string_equal(m, "alpha");
    free(m);
    assert_null(thaw_api_request_model("{\"model\":7}", 11));  /* not a string */
    assert_null(thaw_api_request_model("[\"model\"]", 9));     /* not an object */
    assert_null(thaw_api_request_model("{\"mod", 5));          /* not JSON: its route answers that */
    assert_null(thaw_api_request_model("", 0));
    /* a preset's alias list; none; a load under way; a failed load */
    const struct thaw_api_router_model list[] = {
        {"alpha", "a1,claude-3-5-haiku-latest", "loaded", NULL, 0, false, false, 0},
        {"beta", NULL, "unloaded", NULL, 0, false, false, 0},
        {"gamma", NULL, "loading", "mmproj_model", 0.5f, true, false, 2},
        {"delta", NULL, "unloaded", NULL, 0, false, true, 0},
    };
    char *j = thaw_api_router_models_json(4, list, 5);
    assert_non_null(j);
    /* llama-server lists a preset's aliases, never the id */
    assert_string_equal(j, "{\"data\":[{\"id\":\"alpha\",\"aliases\":[\"a1\",\"claude-3-5-haiku-latest\"],"
                           "\"tags\":[],\"object\":\"model\","
                           "\"owned_by\":\"thaw\",\"created\":5,\"status\":{\"value\":\"loaded\",\"args\":[]},"
                           "\"architecture\":{\"input_modalities\":[\"text\"],\"output_modalities\":[\"text\"]}},"
                           "{\"id\":\"beta\",\"aliases\":[],\"tags\":[],\"object\":\"model\","
                           "\"owned_by\":\"thaw\",\"created\":5,\"status\":{\"value\":\"unloaded\",\"args\":[]},"
                           "\"architecture\":{\"input_modalities\":[\"text\"],\"output_modalities\":[\"text\"]}},"
                           "{\"id\":\"gamma\",\"aliases\":[],\"tags\":[],\"object\":\"model\","
                           "\"owned_by\":\"thaw\",\"created\":5,\"status\":{\"value\":\"loading\",\"args\":[],"
                           "\"progress\":{\"stages\":[\"text_model\",\"mmproj_model\"],\"current\":\"mmproj_model\","
                           "\"value\":0.5},\"waiting\":2},"
                           "\"architecture\":{\"input_modalities\":[\"text\",\"image\"],\"output_modalities\":[\"text\"]}},"
                           "{\"id\":\"delta\",\"aliases\":[],\"tags\":[],\"object\":\"model\","
                           "\"owned_by\":\"thaw\",\"created\":5,\"status\":{\"value\":\"unloaded\",\"args\":[],"
                           "\"failed\":true,\"exit_code\":1},"
                           "\"architecture\":{\"input_modalities\":[\"text\"],\"output_modalities\":[\"text\"]}}],"
                           "\"object\":\"list\"}");
    free(j);
    j = thaw_api_router_props_json(2, false);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"role\":\"router\",\"max_instances\":2,\"models_autoload\":false"));
    free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_defaults),
        cmocka_unit_test(test_all_fields),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_builders_produce_json),
        cmocka_unit_test(test_admit_bounds_before_tokenizing),
        cmocka_unit_test(test_error_body_with_client_bytes_is_json),
        cmocka_unit_test(test_agent_fields),
        cmocka_unit_test(test_prompt_cache_key),
        cmocka_unit_test(test_cache_json_from_metrics_text),
        cmocka_unit_test(test_reasoning_fields),
        cmocka_unit_test(test_continuation_and_bias),
        cmocka_unit_test(test_request_model_and_router_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
