/* codec.h — a wire format (one API) as one table: its request, its whole
 * reply, its stream of events, its errors (DESIGN §13, STYLE 17).
 *
 * Every route that serves a conversation goes through a codec: its parse
 * turns the body into the one internal request (api.h), the engine
 * answers that, and the codec writes the answer in its API's shape, whole
 * or as a stream. The transport (http/) uses a codec only through these
 * fields, never by comparing which one it holds: it frames what a writer
 * emits as SSE and names no API and no event. Adding an API is adding one
 * file that exports one table, and a route that names it.
 *
 *   thaw_codec_chat         POST /v1/chat/completions (api.c)
 *   thaw_codec_messages     POST /v1/messages, Anthropic's (api_anthropic.c)
 *   thaw_codec_responses    POST /v1/responses, OpenAI's (api_responses.c)
 *   thaw_codec_completions  POST /v1/completions, OpenAI's legacy (api_completions.c)
 *   thaw_codec_completion   POST /completion, llama-server's (api_completions.c: the two
 *                           share their request and differ in the reply's shape only)
 *
 * A stream: the transport fills a struct thaw_codec_stream and calls
 * thaw_codec_stream_step with the engine's news each time the client may
 * take more bytes. The step turns the reply's text into the template
 * parser's deltas and hands them to the codec's writer, which sees, in
 * order: open (once; with open_after_start only after a slot took the
 * task), progress (each prefill batch a return_progress request is told
 * of), delta (each piece of the reply the parser tells apart:
 * {"content"}, {"reasoning_content"}, or {"tool_call_index", "id"?,
 * "name"?, "arguments"?}), then close (the reply is complete: st->reply
 * is final) or fail (status, message). Deltas are taken against the
 * engine's final parse at the end, so the streamed pieces always assemble
 * to the message a whole reply carries.
 *
 * Builders return malloc'd NUL-terminated JSON text the caller frees,
 * NULL only on ENOMEM (or when message_json is not JSON). Thread safety:
 * the tables are constant; one stream belongs to one connection.
 */
#ifndef THAW_CODEC_H
#define THAW_CODEC_H

#include "api/api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a codec reads the reply's text, per-token probabilities and prefill
 * reports while the engine may still be adding to them: the engine's task
 * under its lock (thaw_task_reader, task.h). */
struct thaw_reply_reader {
    /* The probability entries from `from` that go with the first n_text
     * bytes of the reply (all of it when done; logprobs.h's rule): *to
     * gets the index past them, the return value their JSON (`legacy`:
     * OpenAI completions' object). A new reference, NULL on ENOMEM. */
    json_t *(*logprobs)(void *ud, size_t from, size_t n_text, bool done, bool legacy, size_t *to);
    /* The reply's bytes [from, to) made valid UTF-8: malloc'd, NULL on ENOMEM. */
    char *(*text)(void *ud, size_t from, size_t to);
    /* Entry i's bytes in the reply: false when there is no entry i yet. */
    bool (*span)(void *ud, size_t i, uint32_t *start, uint32_t *end);
    /* Prefill report i (return_progress): false when there is none yet. */
    bool (*progress)(void *ud, int i, int *processed, int64_t *time_us);
    void *ud;
};

/* A reply the engine finished (status 200), as a codec writes it. */
struct thaw_reply {
    const char *id;                     /* the reply's id: the codec's id_prefix and random hex */
    const char *model;
    long created;                       /* unix seconds */
    const struct thaw_chat_request *req;
    int n_prompt;                       /* prompt tokens */
    int max_tokens;                     /* as resolved (the request's, else -n) */
    const char *message_json;           /* the assistant message: content, reasoning_content, tool_calls */
    const char *finish_reason;          /* "stop" | "length" | "tool_calls" */
    const char *stop_sequence;          /* the request's stop string that ended it, or NULL */
    const struct thaw_timings *timings;
    const struct thaw_reply_reader *rd;
    size_t n_text;                      /* bytes of reply text: the whole reply's probabilities go with them */
    /* llama-server's extras */
    bool verbose;                       /* add __verbose (a codec with THAW_CODEC_VERBOSE) */
    const char *prompt;                 /* the prompt as the model read it: set when verbose, or for a
                                         * codec with THAW_CODEC_PROMPT; NULL otherwise */
    const int32_t *bias_tok;            /* the logit biases the sampler applied (generation_settings of a
                                         * codec with THAW_CODEC_PROMPT), -INFINITY = banned; n_bias */
    const float *bias_val;
    int n_bias;
};

/* A stream: the transport's part, the step's, and the writer's. */
struct thaw_codec_stream {
    /* ---- the transport's, set before the first step ---- */
    const struct thaw_codec *codec;
    char id[64];                        /* the reply's id */
    const char *model;                  /* outlives the stream */
    long created;
    const struct thaw_chat_request *req;
    int n_prompt;
    const char *parser;                 /* the template's reply parser (thaw_chat_gen.parser); NULL = plain text */
    const char *call_prefix;            /* tool-call ids are call_<call_prefix><i> (thaw_task.id_prefix) */
    const struct thaw_reply_reader *rd;
    /* Frames one event (`event` NULL: a data line only) carrying `data`
     * (text, borrowed). 0 or THAW_ENOMEM. */
    int (*put)(void *sink, const char *event, const char *data);
    void *sink;

    /* ---- the step's (thaw_codec_stream_step) ---- */
    bool opened, finished;
    size_t n_news;                      /* the reply's length at the last news turned into events */
    size_t n_seen;                      /* bytes of the reply turned into deltas (a writer may lower it:
                                         * what it kept back comes again with the next news) */
    char *prev_msg;                     /* with a parser: the message as last parsed (deltas are from it) */
    int n_progress;                     /* prefill reports sent */
    int64_t progress_t0_us;             /* the first one's time after the slot took the task */
    int cache_n;                        /* prompt tokens reused, from the news that opened the stream */
    int cache_new_n;                    /* and those to be stored with the reply */
    size_t text_from;                   /* where this step's text starts in the reply */
    size_t n_text;                      /* the reply's bytes handed out, as of this step */
    bool done;                          /* this step's news is the reply's end */
    struct thaw_timings live;           /* this step's news' (timings_per_token) */
    const struct thaw_reply *reply;     /* at close: the reply, final */

    /* ---- the writer's ---- */
    size_t lp_from;                     /* probability entries before it are sent */
    int part;                           /* the part of the reply now open (an Anthropic content block, a
                                         * Responses output item): THAW_CODEC_PART_* */
    int n_parts;                        /* parts started so far; the open one is n_parts - 1 */
    long tool_index;                    /* the parser's index of the open tool call */
    char *acc;                          /* the open part's text so far, n_acc bytes */
    size_t n_acc;
    char *call_id, *call_name;          /* the open tool call's */
    int seq;                            /* events sent (Responses' sequence_number) */
};

enum { THAW_CODEC_PART_NONE, THAW_CODEC_PART_TEXT, THAW_CODEC_PART_THINKING, THAW_CODEC_PART_TOOL };

/* What an API's replies carry beyond its own shape (thaw_codec.caps). */
#define THAW_CODEC_VERBOSE 1u /* llama-server's __verbose, when asked (the request's 'verbose', or -v) */
#define THAW_CODEC_PROMPT 2u  /* the reply shows the prompt as the model read it (/completion) */

struct thaw_codec {
    const char *name;                   /* for logs */
    const char *id_prefix;              /* of a reply's id: "chatcmpl-", "msg_", ... */
    const char *auth_hint;              /* the 401's message: how this API's clients send a key */
    unsigned caps;                      /* THAW_CODEC_* */

    /* The body -> the internal request (free with thaw_chat_request_free).
     * 0, THAW_ENOMEM, or THAW_EINVAL with the field named in err[errlen];
     * `out` is then empty. `default_cache_prompt` is --cache-prompt. */
    int (*parse)(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out, char *err,
                 size_t errlen);
    /* The body of an error with an HTTP status, in this API's shape. */
    char *(*error_json)(int status, const char *message);
    /* The 400 of a prompt of n_prompt tokens in a slot of n_ctx_slot. */
    char *(*too_long_json)(int n_prompt, int n_ctx_slot);
    /* The whole reply (logprobs, __verbose and the like included). */
    char *(*reply)(const struct thaw_reply *r);
    /* 'n' > 1: `other`'s choice appended to `body`'s as choice `index`
     * (both taken). NULL: the API has one choice per reply ('n' > 1 is a 400). */
    char *(*merge_choice)(char *body, char *other, int index);
    /* Several prompts in one body (llama-server's /completion takes an
     * array of them and answers an array): each prompt's body, a request
     * of its own, in bodies[0..*n) (a malloc'd array of malloc'd strings;
     * the caller frees both), *n >= 2; *n = 0 when the body is one request
     * (or not JSON: parse answers that). 0 or THAW_ENOMEM. NULL: one
     * request per body. */
    int (*split)(const char *body, size_t len, char ***bodies, int *n);
    /* The replies of a split body's requests (each taken) as one body. NULL on ENOMEM. */
    char *(*merge_split)(char **bodies, int n);

    /* The stream's writer: each returns 0 or THAW_ENOMEM. */
    bool open_after_start;              /* open waits until a slot took the task (it reports cache use) */
    int (*open)(struct thaw_codec_stream *st);
    /* a prefill report: `processed` of the prompt's tokens are in the KV
     * (cache_n of them reused), time_us after the slot took the task; NULL = none sent */
    int (*progress)(struct thaw_codec_stream *st, int processed, int64_t time_us, int cache_n);
    int (*delta)(struct thaw_codec_stream *st, json_t *diff);
    int (*close)(struct thaw_codec_stream *st);
    int (*fail)(struct thaw_codec_stream *st, int status, const char *message);
};

extern const struct thaw_codec thaw_codec_chat, thaw_codec_messages, thaw_codec_responses, thaw_codec_completions,
    thaw_codec_completion;

/* ---- the stream's step (the transport's calls) ---- */

/* What the engine has produced, as of one step. */
struct thaw_codec_news {
    bool done;                          /* the reply is complete (or failed) */
    bool started;                       /* a slot took the task: cache_n is known */
    int cache_n;
    int cache_new_n;                    /* prompt tokens to be stored with the reply (thaw_timings) */
    size_t n_text;                      /* bytes of reply text so far */
    int n_progress;                     /* prefill reports so far */
    struct thaw_timings live;           /* the timings as of n_text (req.timings_per_token; else zero) */
    const char *text;                   /* the reply's bytes from thaw_codec_stream_from() to n_text, valid
                                         * UTF-8; NULL when none */
    int status;                         /* when done: 200, or the failure's */
    const char *error;                  /* when done and failed: its message */
    const struct thaw_reply *reply;     /* when done with 200: the reply (outlives the stream's close) */
};

/* The first byte of the reply the next news should carry: SIZE_MAX
 * before the stream opened (no text needed), 0 with a parser (it reads
 * the whole reply), else what was not yet sent. */
size_t thaw_codec_stream_from(const struct thaw_codec_stream *st);

/* The next events, from `nw`. Returns 0 (events may have been put),
 * THAW_CODEC_WAIT (nothing to send until the engine has news) or
 * THAW_ENOMEM. After the step that saw the reply's end st->finished is
 * set and no further step is needed. */
#define THAW_CODEC_WAIT 1
int thaw_codec_stream_step(struct thaw_codec_stream *st, const struct thaw_codec_news *nw);

/* Frees what the step and the writer hold (not st itself). */
void thaw_codec_stream_free(struct thaw_codec_stream *st);

#endif
