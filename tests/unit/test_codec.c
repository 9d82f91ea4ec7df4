/* test_codec.c — the codecs without HTTP or an engine: every table
 * complete, and a reply's news stepped through each one's stream writer
 * into events (what the transport frames), in the API's order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "base/buf.h"
#include "base/error.h"

static const struct thaw_codec *const codecs[] = {&thaw_codec_chat, &thaw_codec_messages, &thaw_codec_responses,
                                                  &thaw_codec_completions, &thaw_codec_completion};

/* ---- a reply without an engine: its text in memory, no probabilities ---- */

struct fake {
    const char *text;
    struct thaw_buf out; /* "event|data\n" per event */
    int n_events;
};

static json_t *fake_logprobs(void *ud, size_t from, size_t n_text, bool done, bool legacy, size_t *to)
{
    (void)ud, (void)n_text, (void)done, (void)legacy;
    *to = from;
    return json_array();
}

static char *fake_text(void *ud, size_t from, size_t to)
{
    const struct fake *f = ud;
    return strndup(f->text + from, to - from);
}

static bool fake_span(void *ud, size_t i, uint32_t *start, uint32_t *end)
{
    (void)ud, (void)i, (void)start, (void)end;
    return false;
}

static bool fake_progress(void *ud, int i, int *processed, int64_t *time_ms)
{
    (void)ud;
    *processed = 10 * (i + 1);
    *time_ms = i;
    return true;
}

static int fake_put(void *sink, const char *event, const char *data)
{
    struct fake *f = sink;

    f->n_events++;
    thaw_buf_printf(&f->out, "%s|%s\n", event ? event : "-", data);
    return f->out.oom ? THAW_ENOMEM : 0;
}

static struct thaw_chat_request req_plain;
static struct thaw_timings timings = {.cache_n = 3, .predicted_n = 2, .cache_source = "ram"};
static struct thaw_reply_reader reader = {fake_logprobs, fake_text, fake_span, fake_progress, NULL};

static void stream_init(struct thaw_codec_stream *st, const struct thaw_codec *c, struct fake *f)
{
    memset(st, 0, sizeof *st);
    st->codec = c;
    snprintf(st->id, sizeof st->id, "%sabc", c->id_prefix);
    st->model = "m";
    st->created = 1;
    st->req = &req_plain;
    st->n_prompt = 7;
    st->rd = &reader;
    st->put = fake_put;
    st->sink = f;
    reader.ud = f;
}

/* Steps the stream through "Hel", "Hello" and the end; *out gets the events. */
static void run(const struct thaw_codec *c, struct fake *f, int status)
{
    struct thaw_codec_stream st;
    struct thaw_reply reply = {.id = "x", .model = "m", .req = &req_plain, .n_prompt = 7,
                               .message_json = "{\"role\":\"assistant\",\"content\":\"Hello\"}",
                               .finish_reason = "stop", .timings = &timings, .rd = &reader, .n_text = 5};
    struct thaw_codec_news nw = {0};

    memset(f, 0, sizeof *f);
    f->text = "Hello";
    stream_init(&st, c, f);
    /* a codec that opens with the cache's part waits until a slot took the task */
    if (c->open_after_start) {
        assert_int_equal(thaw_codec_stream_step(&st, &nw), THAW_CODEC_WAIT);
        assert_int_equal(f->n_events, 0);
    }
    nw.started = true;
    nw.cache_n = 3;
    assert_int_equal(thaw_codec_stream_from(&st), SIZE_MAX);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    assert_true(st.opened);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), THAW_CODEC_WAIT); /* no news */
    nw.n_text = 3;
    nw.text = "Hel";
    assert_int_equal(thaw_codec_stream_from(&st), 0);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    nw.n_text = 5;
    nw.text = "lo";
    assert_int_equal(thaw_codec_stream_from(&st), 3);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    nw.done = true;
    nw.text = NULL;
    nw.status = status;
    nw.error = status == 200 ? NULL : "boom";
    nw.reply = status == 200 ? &reply : NULL;
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    assert_true(st.finished);
    thaw_codec_stream_free(&st);
}

/* The event names in order, joined by spaces ("-" for a data line). */
static char *names(const struct fake *f)
{
    struct thaw_buf b = {0};

    for (const char *p = f->out.data; p && *p;) {
        size_t n = strcspn(p, "|");
        thaw_buf_append(&b, p, n);
        thaw_buf_puts(&b, " ");
        p = strchr(p, '\n');
        p = p ? p + 1 : "";
    }
    return thaw_buf_steal(&b);
}

static void test_tables_complete(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
        const struct thaw_codec *c = codecs[i];
        assert_non_null(c->name);
        assert_non_null(c->id_prefix);
        assert_non_null(c->auth_hint);
        assert_non_null(c->parse);
        assert_non_null(c->error_json);
        assert_non_null(c->too_long_json);
        assert_non_null(c->reply);
        assert_non_null(c->open);
        assert_non_null(c->delta);
        assert_non_null(c->close);
        assert_non_null(c->fail);
        char *e = c->error_json(400, "bad");
        assert_non_null(strstr(e, "bad"));
        free(e);
        e = c->too_long_json(100, 64);
        assert_non_null(strstr(e, "100"));
        free(e);
    }
}

static void test_messages_stream(void **state)
{
    struct fake f;

    (void)state;
    run(&thaw_codec_messages, &f, 200);
    char *n = names(&f);
    assert_string_equal(n, "message_start ping content_block_start content_block_delta content_block_delta "
                           "content_block_stop message_delta message_stop ");
    assert_non_null(strstr(f.out.data, "\"cache_read_input_tokens\":3"));
    assert_non_null(strstr(f.out.data, "\"stop_reason\":\"end_turn\""));
    free(n);
    thaw_buf_free(&f.out);

    run(&thaw_codec_messages, &f, 503); /* a failure: Anthropic's error event */
    n = names(&f);
    assert_string_equal(n, "message_start ping content_block_start content_block_delta content_block_delta error ");
    assert_non_null(strstr(f.out.data, "overloaded_error"));
    free(n);
    thaw_buf_free(&f.out);
}

static void test_chat_stream(void **state)
{
    struct fake f;

    (void)state;
    req_plain.include_usage = true;
    run(&thaw_codec_chat, &f, 200);
    req_plain.include_usage = false;
    char *n = names(&f);
    assert_string_equal(n, "- - - - - - "); /* role, two deltas, finish, usage, [DONE] */
    assert_non_null(strstr(f.out.data, "\"finish_reason\":\"stop\""));
    assert_non_null(strstr(f.out.data, "-|[DONE]\n"));
    free(n);
    thaw_buf_free(&f.out);
}

static void test_responses_stream(void **state)
{
    struct fake f;

    (void)state;
    run(&thaw_codec_responses, &f, 200);
    char *n = names(&f);
    assert_string_equal(n, "response.created response.in_progress response.output_item.added "
                           "response.content_part.added response.output_text.delta response.output_text.delta "
                           "response.output_text.done response.content_part.done response.output_item.done "
                           "response.completed ");
    assert_non_null(strstr(f.out.data, "\"sequence_number\":9"));
    assert_non_null(strstr(f.out.data, "\"text\":\"Hello\""));
    free(n);
    thaw_buf_free(&f.out);
}

static void test_completions_streams(void **state)
{
    struct fake f;

    (void)state;
    run(&thaw_codec_completions, &f, 200);
    char *n = names(&f);
    assert_string_equal(n, "- - - - "); /* two pieces, the last chunk, [DONE] */
    free(n);
    thaw_buf_free(&f.out);
    run(&thaw_codec_completion, &f, 200);
    n = names(&f);
    assert_string_equal(n, "- - - "); /* two pieces, the final object; no [DONE] */
    assert_null(strstr(f.out.data, "[DONE]"));
    free(n);
    thaw_buf_free(&f.out);
}

/* return_progress: a report per prefill batch before the text (chat's
 * role delta carries it); Anthropic has no such event */
static void test_progress(void **state)
{
    struct fake f = {0};
    struct thaw_codec_stream st;
    struct thaw_codec_news nw = {.started = true, .n_progress = 2, .cache_n = 1};

    (void)state;
    f.text = "";
    stream_init(&st, &thaw_codec_chat, &f);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0); /* open */
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0); /* the two reports */
    assert_int_equal(st.n_progress, 2);
    assert_int_equal(f.n_events, 3);
    assert_non_null(strstr(f.out.data, "\"prompt_progress\":{\"total\":7,\"cache\":1,\"processed\":20"));
    assert_int_equal(thaw_codec_stream_step(&st, &nw), THAW_CODEC_WAIT);
    thaw_codec_stream_free(&st);
    thaw_buf_free(&f.out);

    memset(&f, 0, sizeof f);
    f.text = "";
    stream_init(&st, &thaw_codec_messages, &f);
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    int opened = f.n_events;
    assert_int_equal(thaw_codec_stream_step(&st, &nw), 0);
    assert_int_equal(f.n_events, opened);
    thaw_codec_stream_free(&st);
    thaw_buf_free(&f.out);
}

/* The whole reply through each table: the API's own shape. */
static void test_replies(void **state)
{
    struct fake f = {.text = "Hello"};
    struct thaw_reply r = {.id = "id_1", .model = "m", .created = 1, .req = &req_plain, .n_prompt = 7,
                           .message_json = "{\"role\":\"assistant\",\"content\":\"Hello\"}", .finish_reason = "length",
                           .timings = &timings, .rd = &reader, .n_text = 5, .prompt = "<s> hi"};
    static const char *const expect[] = {"\"object\":\"chat.completion\"", "\"stop_reason\":\"max_tokens\"",
                                         "\"status\":\"incomplete\"", "\"object\":\"text_completion\"",
                                         "\"stop_type\":\"limit\""};

    (void)state;
    reader.ud = &f;
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
        char *body = codecs[i]->reply(&r);
        assert_non_null(body);
        assert_non_null(strstr(body, expect[i]));
        assert_non_null(strstr(body, "Hello"));
        assert_int_equal(strstr(body, "\"prompt\":\"<s> hi\"") != NULL, (codecs[i]->caps & THAW_CODEC_PROMPT) != 0);
        free(body);
    }
    /* 'n' > 1: the OpenAI APIs merge choices, the others have one */
    char *a = thaw_codec_chat.reply(&r), *b = thaw_codec_chat.reply(&r);
    char *m = thaw_codec_chat.merge_choice(a, b, 1);
    assert_non_null(strstr(m, "\"index\":1"));
    assert_non_null(strstr(m, "\"completion_tokens\":4"));
    free(m);
    assert_null(thaw_codec_messages.merge_choice);
    assert_null(thaw_codec_responses.merge_choice);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_complete),  cmocka_unit_test(test_messages_stream),
        cmocka_unit_test(test_chat_stream),      cmocka_unit_test(test_responses_stream),
        cmocka_unit_test(test_completions_streams), cmocka_unit_test(test_progress),
        cmocka_unit_test(test_replies),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
