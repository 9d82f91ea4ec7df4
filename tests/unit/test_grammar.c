/* test_grammar.c — reshaping the chat library's grammar: the road to a
 * required call, bounded repeats, and Gemma 4 arguments from each tool's
 * schema. The grammars here are the shapes llama.cpp's chat library writes
 * (copied from its output for real templates, trimmed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "api/grammar.h"

/* the text of rule `name` (without "name ::= "), or "" */
static const char *rule(const char *g, const char *name, char *buf, size_t cap)
{
    size_t n = strlen(name);
    buf[0] = '\0';
    for (const char *l = g; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) == 0 && strncmp(l + n, " ::= ", 5) == 0) {
            const char *e = strchr(l, '\n');
            size_t len = e ? (size_t)(e - l - n - 5) : strlen(l + n + 5);
            if (len >= cap)
                len = cap - 1;
            memcpy(buf, l + n + 5, len);
            buf[len] = '\0';
            break;
        }
    }
    return buf;
}

static void test_force_call_drops_what_can_match_nothing(void **state)
{
    (void)state;
    /* Qwen3's shape: optional thinking, free text, then the calls */
    const char *g = "root ::= think? until-3 tool-calls\n"
                    "think ::= \"<think>\" until-5 \"</think>\"\n"
                    "tool-calls ::= (\"<tool_call>\" call \"</tool_call>\")+\n";
    char *o = thaw_grammar_force_call(g, false), buf[256];
    assert_non_null(o);
    assert_string_equal(rule(o, "root", buf, sizeof buf), "tool-calls");
    assert_string_equal(rule(o, "tool-calls", buf, sizeof buf), "(\"<tool_call>\" call \"</tool_call>\")");
    free(o);
    o = thaw_grammar_force_call(g, true);
    assert_string_equal(rule(o, "tool-calls", buf, sizeof buf), "(\"<tool_call>\" call \"</tool_call>\")+");
    free(o);
    /* an optional group stays, its until-rules become a few blanks */
    o = thaw_grammar_force_call("root ::= (\"<think>\" until-2)? calls\ncalls ::= call\n", true);
    assert_string_equal(rule(o, "root", buf, sizeof buf), "(\"<think>\" [ \\t\\n]{0,8})? calls");
    free(o);
    /* alternatives at the top are not reshaped */
    assert_null(thaw_grammar_force_call("root ::= a | b\n", true));
    assert_null(thaw_grammar_force_call("other ::= a\n", true));
}

static void test_bound_repeats(void **state)
{
    (void)state;
    char *o = thaw_grammar_bound_repeats("x ::= \"a]+\" [A-Za-z0-9_-]+ [^\\]]* (\"b\")+ [0-9]{1,3}\n");
    assert_string_equal(o, "x ::= \"a]+\" [A-Za-z0-9_-]{1,64} [^\\]]{0,64} (\"b\")+ [0-9]{1,3}\n");
    free(o);
    /* Mistral's call id: text until "[ARGS]", bounded; its helpers and
     * rules of other shapes stay as they are */
    o = thaw_grammar_bound_repeats("call ::= \"[CALL_ID]\" until-5 \"[ARGS]\"\n"
                                   "until-5 ::= | [\\[] until-5-01 | [^\\[] until-5\n"
                                   "until-5-01 ::= | [\\[] until-5-01 | [A] until-5-02 | [^A\\[] until-5\n"
                                   "until-7 ::= \"x\" until-7\n");
    assert_string_equal(o, "call ::= \"[CALL_ID]\" until-5 \"[ARGS]\"\n"
                           "until-5 ::= [^\\[]{0,64}\n"
                           "until-5-01 ::= | [\\[] until-5-01 | [A] until-5-02 | [^A\\[] until-5\n"
                           "until-7 ::= \"x\" until-7\n");
    free(o);
}

static const char GEMMA4[] = "root ::= start tool-call\n"
                             "gemma4-dict ::= \"{\" space (\"}\" | gemma4-dict-kv (\",\" space "
                             "gemma4-dict-kv)* space \"}\")\n"
                             "tool-call ::= (\"<|tool_call>call:\" (tool-get-weather | tool-set-alarm) "
                             "\"<tool_call|>\")\n"
                             "tool-get-weather ::= (\"get_weather\") gemma4-dict\n"
                             "tool-set-alarm ::= (\"set_alarm\") gemma4-dict\n";

static void test_gemma4_args_follow_each_schema(void **state)
{
    (void)state;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_"
                        "weather\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"city\":{\"type\":\"string\",\"enum\":["
                        "\"Paris\",\"S\\\"o\"]},\"days\":{\"type\":\"integer\"}},"
                        "\"required\":[\"city\"]}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"set_"
                        "alarm\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"at\":{\"type\":[\"string\",\"null\"]},"
                        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
                        "\"boolean\"},\"maxItems\":3}}}}}]";
    char *o = thaw_grammar_gemma4_args(GEMMA4, tools), buf[1024];
    assert_non_null(o);
    assert_string_equal(rule(o, "tool-get-weather", buf, sizeof buf), "(\"get_weather\") thaw-args-0");
    assert_string_equal(rule(o, "tool-set-alarm", buf, sizeof buf), "(\"set_alarm\") thaw-args-1");
    /* city required (an enum between <|"|>, a quote escaped), days optional */
    assert_string_equal(rule(o, "thaw-args-0", buf, sizeof buf), "(\"{\" space \"city:\" space (\"<|\\\"|>\" \"Paris\" "
                                                                 "\"<|\\\"|>\" | \"<|\\\"|>\" \"S\\\"o\" "
                                                                 "\"<|\\\"|>\") (\",\" space (\"days:\" space (\"-\"? "
                                                                 "(\"0\" | [1-9] [0-9]{0,15})))){0,1} "
                                                                 "space \"}\")");
    /* nothing required: the empty dict, or any of the keys, at most once each in
     * number */
    assert_string_equal(rule(o, "thaw-args-1", buf, sizeof buf),
                        "(\"{\" space (\"}\" | (\"at:\" space (gemma4-string | "
                        "gemma4-null) | \"tags:\" space "
                        "(\"[\" space (\"]\" | gemma4-bool (\",\" space "
                        "gemma4-bool){0,2} space \"]\"))) "
                        "(\",\" space (\"at:\" space (gemma4-string | "
                        "gemma4-null) | \"tags:\" space (\"[\" space "
                        "(\"]\" | gemma4-bool (\",\" space gemma4-bool){0,2} "
                        "space \"]\")))){0,1} space \"}\"))");
    free(o);
}

static void test_gemma4_args_fall_back(void **state)
{
    (void)state;
    char buf[512];
    /* a key the parser could not read back, a schema it does not compile: the
     * generic dict/value */
    char *o = thaw_grammar_gemma4_args(GEMMA4, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                                               "\"parameters\":{\"type\":\"object\","
                                               "\"properties\":{\"a:b\":{}}}}},{\"type\":\"function\","
                                               "\"function\":{\"name\":\"set_alarm\","
                                               "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{"
                                               "\"anyOf\":[{}]}},\"required\":[\"x\"]}}}]");
    assert_non_null(o);
    assert_string_equal(rule(o, "thaw-args-0", buf, sizeof buf), "gemma4-dict");
    assert_string_equal(rule(o, "thaw-args-1", buf, sizeof buf), "(\"{\" space \"x:\" space gemma4-value space \"}\")");
    free(o);
    /* not Gemma 4's grammar, no tools, bad JSON, unknown tool: NULL */
    assert_null(thaw_grammar_gemma4_args("root ::= x\n", "[]"));
    assert_null(thaw_grammar_gemma4_args(GEMMA4, NULL));
    assert_null(thaw_grammar_gemma4_args(GEMMA4, "[{"));
    assert_null(thaw_grammar_gemma4_args(GEMMA4, "[{\"function\":{\"name\":\"other\"}}]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_call_drops_what_can_match_nothing),
        cmocka_unit_test(test_bound_repeats),
        cmocka_unit_test(test_gemma4_args_follow_each_schema),
        cmocka_unit_test(test_gemma4_args_fall_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
