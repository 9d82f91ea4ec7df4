/* task.h — one chat request on its way between an HTTP thread and the engine.
 *
 * thaw_prepare_task (prepare.h) builds a task (it owns the parsed request
 * and the prompt tokens from then on), the route submits it to the engine; the engine appends reply text
 * as it is generated and finally marks it done or failed, waking the
 * client's connection (thaw_task_client) at each step a client can see.
 * Both sides hold a reference; whoever releases last frees it, so a client
 * that disconnects mid-stream never leaves the engine with a dangling task.
 */
#ifndef THAW_TASK_H
#define THAW_TASK_H

#include "api/api.h"
#include "api/chat.h"
#include "api/codec.h"
#include "api/logprobs.h"
#include "base/buf.h"
#include "base/clock.h" /* t_submit_us */
#include "cache/keys.h"
#include "llama/vision.h"

#include <llama.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* What a task's prompt is decoded for. */
enum thaw_task_kind {
    THAW_TASK_CHAT,   /* a reply, sampled token by token */
    THAW_TASK_EMBED,  /* --embedding: the prompt's vector (pooled), or each token's (pooling none) */
    THAW_TASK_RERANK, /* --rerank: the rank head's score of a (query, document) prompt */
};

struct thaw_task {
    /* ---- input: set before submit, read-only afterwards ---- */
    enum thaw_task_kind kind;
    int embd_normalize;            /* EMBED: how a pooled vector is normalised (thaw_embd_normalize) */
    struct thaw_chat_request req;  /* owned */
    llama_token *prompt;           /* owned, n_prompt tokens */
    int n_prompt;
    struct thaw_vision_prompt *vision; /* the prompt's images (vision.h): their positions hold placeholder
                                    * tokens, which pin each image's bytes in every key and block id;
                                    * owned, NULL = text only */
    char *vision_text;             /* with vision: the rendered text it was tokenized from (owned) */
    int max_tokens;                /* resolved: request's, else -n, else context */
    const char *model_name;        /* for the response; the engine's, outlives the task */
    struct thaw_chat_gen gen;      /* grammar, extra stops, reply parser (owned) */
    /* the prompt's identity, all set by thaw_prepare_task (prepare.h) */
    char id_prefix[16];            /* tool-call ids are call_<id_prefix><i> */
    int n_branch;                  /* prompt tokens of the leading system/developer/tool messages
                                    * (thaw_chat_branch_point): where a hybrid snapshots; 0 none */
    int n_gen_prompt;              /* hybrids: tokens the generation prompt adds at the prompt's end
                                    * (thaw_chat_gen_prompt_tokens), checkpointed before; 0 none */
    int retain_tokens[THAW_API_MAX_RETAIN]; /* req.retain[i]: the prompt tokens that mark covers
                                    * (thaw_chat_prefix_tokens) */
    bool has_lookup_key;           /* the conversation has an assistant message */
    uint8_t lookup_key[THAW_KEY_BYTES];
    uint8_t binding[THAW_KEY_BYTES]; /* the store key's (thaw_prepare_store_key, at the reply's end) */
    int64_t t_submit_us;

    /* ---- output: written by the engine under mu ---- */
    pthread_mutex_t mu;
    struct thaw_buf text;          /* reply bytes safe to send so far (complete UTF-8, no partial stop) */
    bool done;
    int http_status;               /* 200, or the error's status */
    char *error;                   /* message when http_status != 200 */
    const char *finish_reason;     /* "stop" | "length" | "tool_calls" (static) */
    const char *stop_sequence;     /* one of req.stop the reply ended on, or NULL */
    bool started;                  /* a slot took the task and chose what to reuse */
    int cache_n;                   /* prompt tokens reused, once started */
    int cache_new_n;               /* prompt tokens to be stored with the reply (thaw_timings), once started */
    char *message_json;            /* the reply as a message (content, reasoning, tool calls), set with done */
    struct thaw_logprobs logprobs; /* req.logprobs: one entry per sampled token (logprobs.h) */
    struct thaw_task_progress *progress; /* req.return_progress on a stream: one report per prefill batch, */
    int n_progress, cap_progress;        /* the first when the slot chose what to reuse */
    struct thaw_timings timings;
    struct thaw_timings live;      /* req.timings_per_token on a stream: prompt_* and predicted_* as of the
                                    * text emitted so far (thaw_task_emit) */
    float *embd;                   /* EMBED / RERANK, set with done: n_embd_rows rows of n_embd floats
                                    * (pooled: one row; pooling none: one per prompt token; RERANK: the
                                    * rank head's outputs, score first), owned */
    int n_embd_rows, n_embd;

    atomic_bool cancelled;         /* the client went away: stop generating */
    atomic_int refs;

    /* ---- the client: set by the route before submit, NULL-safe ---- */
    const struct thaw_task_client *client;
    void *client_ud;               /* released by client->release with the task */
    uint8_t ns[THAW_KEY_BYTES];    /* the tenant's namespace (thaw_keys_namespace) */
};

/* How the engine reaches the client without knowing HTTP. */
struct thaw_task_client {
    /* news for the client (text for a stream, or done): called with t->mu
     * held, must not block */
    void (*wake)(void *ud);
    /* false once the client hung up; called by the engine thread each step */
    bool (*alive)(void *ud);
    /* drops the task's hold on the client (last task reference) */
    void (*release)(void *ud);
};

/* A task owning `req` (moved: the caller's copy is zeroed) and `prompt`
 * (moved). Refcount 1. NULL on ENOMEM (then nothing was moved). */
struct thaw_task *thaw_task_new(struct thaw_chat_request *req, llama_token *prompt, int n_prompt);

void thaw_task_retain(struct thaw_task *t);
/* Drops a reference; the last one frees everything the task owns. */
void thaw_task_release(struct thaw_task *t);

/* Engine side. emit appends reply text (with `live`, non-NULL, the timings
 * as of that text: kept for a stream that asked timings_per_token);
 * finish/fail set done and wake waiters. */
int thaw_task_emit(struct thaw_task *t, const char *s, size_t n, const struct thaw_timings *live);
/* `message_json` (malloc'd, may be NULL) moves into the task.
 * `stop_sequence` is NULL or one of t->req.stop (the request's stop string
 * that ended the reply). */
void thaw_task_finish(struct thaw_task *t, const char *finish_reason, const char *stop_sequence,
                      const struct thaw_timings *timings, char *message_json);
void thaw_task_fail(struct thaw_task *t, int http_status, const char *message);

/* An EMBED or RERANK task for `prompt` (moved: freed with the task),
 * n_prompt tokens; its request is empty (any slot, no cache). Refcount 1.
 * NULL on ENOMEM (then the prompt is the caller's still). */
struct thaw_task *thaw_task_new_embed(enum thaw_task_kind kind, llama_token *prompt, int n_prompt, int embd_normalize);
/* Done with its vectors: `embd` (malloc'd, n_rows x n floats) moves into
 * the task (freed here when the task is already done). */
void thaw_task_finish_embd(struct thaw_task *t, float *embd, int n_rows, int n);

/* Appends a sampled token's probabilities (logprobs.h): its bytes
 * [start, end) of the reply text. 0 or THAW_ENOMEM. */
int thaw_task_add_logprobs(struct thaw_task *t, const struct thaw_logprob_in *sampled,
                           const struct thaw_logprob_in *top, int n_top, uint32_t start, uint32_t end);

/* llama-server's prompt_progress: of the prompt's n_prompt tokens (total)
 * cache_n were reused (cache) and `processed` are in the KV (reused ones
 * included), time_us after the slot took the task. */
struct thaw_task_progress {
    int processed;
    int64_t time_us;
};

/* Records a progress report (only a streamed request with return_progress
 * keeps them) and wakes the client. 0 or THAW_ENOMEM. */
int thaw_task_progress(struct thaw_task *t, int processed, int64_t time_us);

/* Report i (false when there is none yet). */
bool thaw_task_progress_at(struct thaw_task *t, int i, struct thaw_task_progress *out);

/* The slot has chosen what to reuse (`cache_n` prompt tokens, served by
 * `cache_source`, a static string as thaw_timings'; the `cache_new_n` it
 * will store with the reply): a stream whose opening event reports usage
 * (Anthropic's message_start) waits for it, and the live timings
 * (timings_per_token) start from it. Wakes a streaming client. */
void thaw_task_started(struct thaw_task *t, int cache_n, int cache_new_n, const char *cache_source);

/* ---- client side (HTTP threads) ----
 * The output fields above are the engine's until `done`; a client reads
 * them only through these, and after thaw_task_done() returned true it may
 * read http_status, error, finish_reason, message_json and timings
 * directly (nothing writes them again). */

/* What the engine has produced so far, copied under the lock. */
struct thaw_task_news {
    bool done;
    bool started;   /* cache_n is known */
    int cache_n;
    int cache_new_n;
    size_t n_text;  /* bytes of reply text so far */
    int n_progress; /* progress reports so far (thaw_task_progress_at) */
    struct thaw_timings live; /* the task's live timings (zero unless timings_per_token; final when done) */
    char *text;     /* malloc'd copy of text[from, n_text), made valid UTF-8; NULL when from >= n_text */
};
/* Fills `out` (free out->text). Returns 0 or THAW_ENOMEM (then out->text
 * is NULL and nothing else is meaningful). */
int thaw_task_news(struct thaw_task *t, size_t from, struct thaw_task_news *out);

/* The entries from `from` that go with the first n_text bytes of the
 * reply (all of it when done), thaw_logprobs_upto's rule: *to gets the
 * index past them, and the return value their JSON (thaw_logprobs_json
 * with the request's post_sampling_probs; `legacy`: OpenAI completions'
 * object), a new reference, NULL on ENOMEM. */
json_t *thaw_task_logprobs(struct thaw_task *t, size_t from, size_t n_text, bool done, bool legacy, size_t *to);

/* A malloc'd copy of the reply's bytes [from, to) made valid UTF-8
 * (clipped to what exists); NULL on ENOMEM. */
char *thaw_task_text(struct thaw_task *t, size_t from, size_t to);

/* The byte span of entry i of the reply's text: false when there is no
 * such entry yet. */
bool thaw_task_logprob_span(struct thaw_task *t, size_t i, uint32_t *start, uint32_t *end);

/* How a codec reads the task's reply as it grows (codec.h): its text,
 * probabilities and prefill reports, each read under mu. Valid while the
 * caller holds its reference. */
void thaw_task_reader(struct thaw_task *t, struct thaw_reply_reader *out);

/* A done task's reply as a codec writes it (codec.h): all but id, created,
 * verbose and prompt, which are the caller's to set; `rd` is the task's
 * reader. Only once thaw_task_done() returned true (nothing writes these
 * again); the pointers are the task's. */
void thaw_task_reply(struct thaw_task *t, const struct thaw_reply_reader *rd, struct thaw_reply *out);

/* True once the engine finished or failed the task. */
bool thaw_task_done(struct thaw_task *t);

/* The client is done with the task (answered, or gone): the engine stops
 * working for it, and the client's reference is dropped. */
void thaw_task_abandon(struct thaw_task *t);

/* False when the task's client is known to have gone (the engine asks this
 * before and while it works for a task). */
bool thaw_task_client_alive(struct thaw_task *t);

#endif
