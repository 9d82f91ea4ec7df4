/* task.c — the request/engine hand-off: refcounting and the output channel. */
#include "engine/task.h"

#include "base/error.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct thaw_task *thaw_task_new(struct thaw_chat_request *req, llama_token *prompt, int n_prompt)
{
    struct thaw_task *t = calloc(1, sizeof *t);

    if (!t)
        return NULL;
    t->req = *req;
    memset(req, 0, sizeof *req);
    t->prompt = prompt;
    t->n_prompt = n_prompt;
    t->http_status = 200;
    t->t_submit_us = thaw_now_us();
    pthread_mutex_init(&t->mu, NULL);
    atomic_init(&t->refs, 1);
    atomic_init(&t->cancelled, false);
    return t;
}

static void wake(struct thaw_task *t);

struct thaw_task *thaw_task_new_embed(enum thaw_task_kind kind, llama_token *prompt, int n_prompt, int embd_normalize)
{
    struct thaw_chat_request req = {0};

    req.id_slot = -1; /* any slot; cache_prompt false: nothing of a slot is reused */
    struct thaw_task *t = thaw_task_new(&req, prompt, n_prompt);
    if (t) {
        t->kind = kind;
        t->embd_normalize = embd_normalize;
    }
    return t;
}

void thaw_task_finish_embd(struct thaw_task *t, float *embd, int n_rows, int n)
{
    pthread_mutex_lock(&t->mu);
    if (t->done) {
        free(embd);
    } else {
        t->embd = embd;
        t->n_embd_rows = n_rows;
        t->n_embd = n;
        t->done = true;
    }
    wake(t);
    pthread_mutex_unlock(&t->mu);
}

void thaw_task_retain(struct thaw_task *t) { atomic_fetch_add(&t->refs, 1); }

void thaw_task_release(struct thaw_task *t)
{
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    if (t->client && t->client->release)
        t->client->release(t->client_ud);
    thaw_chat_request_free(&t->req);
    thaw_chat_gen_free(&t->gen);
    free(t->message_json);
    free(t->embd);
    thaw_logprobs_free(&t->logprobs);
    free(t->progress);
    free(t->prompt);
    thaw_vision_prompt_free(t->vision);
    free(t->vision_text);
    thaw_buf_free(&t->text);
    free(t->error);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Under t->mu. */
static void wake(struct thaw_task *t)
{
    if (t->client && t->client->wake)
        t->client->wake(t->client_ud);
}

bool thaw_task_client_alive(struct thaw_task *t)
{
    if (atomic_load(&t->cancelled))
        return false;
    if (t->client && t->client->alive && !t->client->alive(t->client_ud)) {
        atomic_store(&t->cancelled, true);
        return false;
    }
    return true;
}

int thaw_task_emit(struct thaw_task *t, const char *s, size_t n, const struct thaw_timings *live)
{
    int rc = 0;

    if (n == 0)
        return 0;
    pthread_mutex_lock(&t->mu);
    if ((rc = thaw_buf_append(&t->text, s, n)) != 0)
        goto out;
    if (live && t->req.timings_per_token)
        t->live = *live;
    /* only a stream reads text before the end: waking a non-streaming
     * request per token would steal a core from the decode threads */
    if (t->req.stream)
        wake(t);
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void thaw_task_finish(struct thaw_task *t, const char *finish_reason, const char *stop_sequence,
                      const struct thaw_timings *timings, char *message_json)
{
    pthread_mutex_lock(&t->mu);
    if (t->done) {
        free(message_json);
    } else {
        t->message_json = message_json;
        t->finish_reason = finish_reason;
        t->stop_sequence = stop_sequence;
        t->timings = *timings;
        t->done = true;
    }
    wake(t);
    pthread_mutex_unlock(&t->mu);
}

void thaw_task_fail(struct thaw_task *t, int http_status, const char *message)
{
    pthread_mutex_lock(&t->mu);
    if (!t->done) {
        t->http_status = http_status;
        free(t->error);
        t->error = strdup(message);
        t->done = true;
    }
    wake(t);
    pthread_mutex_unlock(&t->mu);
}

int thaw_task_add_logprobs(struct thaw_task *t, const struct thaw_logprob_in *sampled,
                           const struct thaw_logprob_in *top, int n_top, uint32_t start, uint32_t end)
{
    pthread_mutex_lock(&t->mu);
    int rc = thaw_logprobs_add(&t->logprobs, sampled, top, n_top, start, end);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int thaw_task_progress(struct thaw_task *t, int processed, int64_t time_us)
{
    int rc = 0;

    if (!t->req.return_progress || !t->req.stream)
        return 0;
    pthread_mutex_lock(&t->mu);
    if (t->n_progress == t->cap_progress) {
        int cap = t->cap_progress ? t->cap_progress * 2 : 8;
        struct thaw_task_progress *nb = realloc(t->progress, (size_t)cap * sizeof *nb);
        if (!nb) {
            rc = THAW_ENOMEM;
            goto out;
        }
        t->progress = nb;
        t->cap_progress = cap;
    }
    t->progress[t->n_progress++] = (struct thaw_task_progress){processed, time_us};
    wake(t);
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

bool thaw_task_progress_at(struct thaw_task *t, int i, struct thaw_task_progress *out)
{
    pthread_mutex_lock(&t->mu);
    bool ok = i >= 0 && i < t->n_progress;
    if (ok)
        *out = t->progress[i];
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void thaw_task_started(struct thaw_task *t, int cache_n, int cache_new_n, const char *cache_source)
{
    pthread_mutex_lock(&t->mu);
    t->started = true;
    t->cache_n = cache_n;
    t->cache_new_n = cache_new_n;
    if (t->req.timings_per_token) { /* the prefill's progress reports tell them */
        t->live.cache_n = cache_n;
        t->live.cache_source = cache_source;
    }
    if (t->req.stream)
        wake(t);
    pthread_mutex_unlock(&t->mu);
}

/* ---- client side ------------------------------------------------------------------ */

int thaw_task_news(struct thaw_task *t, size_t from, struct thaw_task_news *out)
{
    int rc = 0;

    pthread_mutex_lock(&t->mu);
    out->done = t->done;
    out->started = t->started || t->done;
    out->cache_n = t->done && t->http_status == 200 ? t->timings.cache_n : t->cache_n;
    out->cache_new_n = t->done && t->http_status == 200 ? t->timings.cache_new_n : t->cache_new_n;
    out->n_text = t->text.len;
    out->n_progress = t->n_progress;
    out->live = t->done && t->http_status == 200 ? t->timings : t->live;
    out->text = NULL;
    if (from < t->text.len && !(out->text = thaw_utf8_sanitize(t->text.data + from, t->text.len - from)))
        rc = THAW_ENOMEM;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

json_t *thaw_task_logprobs(struct thaw_task *t, size_t from, size_t n_text, bool done, bool legacy, size_t *to)
{
    pthread_mutex_lock(&t->mu);
    *to = thaw_logprobs_upto(&t->logprobs, from, n_text, done);
    json_t *v = thaw_logprobs_json(&t->logprobs, from, *to, t->req.post_sampling_probs, legacy);
    pthread_mutex_unlock(&t->mu);
    return v;
}

char *thaw_task_text(struct thaw_task *t, size_t from, size_t to)
{
    pthread_mutex_lock(&t->mu);
    if (to > t->text.len)
        to = t->text.len;
    if (from > to)
        from = to;
    char *s = thaw_utf8_sanitize(t->text.data ? t->text.data + from : "", to - from);
    pthread_mutex_unlock(&t->mu);
    return s;
}

bool thaw_task_logprob_span(struct thaw_task *t, size_t i, uint32_t *start, uint32_t *end)
{
    pthread_mutex_lock(&t->mu);
    bool ok = i < t->logprobs.n;
    if (ok) {
        *start = t->logprobs.v[i].start;
        *end = t->logprobs.v[i].end;
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

/* ---- the reply as a codec reads it ------------------------------------------------- */

static json_t *reader_logprobs(void *ud, size_t from, size_t n_text, bool done, bool legacy, size_t *to)
{
    return thaw_task_logprobs(ud, from, n_text, done, legacy, to);
}

static char *reader_text(void *ud, size_t from, size_t to) { return thaw_task_text(ud, from, to); }

static bool reader_span(void *ud, size_t i, uint32_t *start, uint32_t *end)
{
    return thaw_task_logprob_span(ud, i, start, end);
}

static bool reader_progress(void *ud, int i, int *processed, int64_t *time_us)
{
    struct thaw_task_progress p;

    if (!thaw_task_progress_at(ud, i, &p))
        return false;
    *processed = p.processed;
    *time_us = p.time_us;
    return true;
}

void thaw_task_reader(struct thaw_task *t, struct thaw_reply_reader *out)
{
    *out = (struct thaw_reply_reader){
        .logprobs = reader_logprobs,
        .text = reader_text,
        .span = reader_span,
        .progress = reader_progress,
        .ud = t,
    };
}

void thaw_task_reply(struct thaw_task *t, const struct thaw_reply_reader *rd, struct thaw_reply *out)
{
    *out = (struct thaw_reply){
        .model = t->model_name,
        .req = &t->req,
        .n_prompt = t->n_prompt,
        .max_tokens = t->max_tokens,
        .message_json = t->message_json,
        .finish_reason = t->finish_reason,
        .stop_sequence = t->stop_sequence,
        .timings = &t->timings,
        .rd = rd,
        .n_text = t->text.len,
    };
}

bool thaw_task_done(struct thaw_task *t)
{
    pthread_mutex_lock(&t->mu);
    bool done = t->done;
    pthread_mutex_unlock(&t->mu);
    return done;
}

void thaw_task_abandon(struct thaw_task *t)
{
    atomic_store(&t->cancelled, true);
    thaw_task_release(t);
}
