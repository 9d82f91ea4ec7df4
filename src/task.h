/* task.h — one chat request on its way between an HTTP thread and the engine.
 *
 * The route builds a task (it owns the parsed request and the prompt tokens
 * from then on), submits it to the engine and waits on it; the engine
 * appends reply text as it is generated and finally marks it done or failed.
 * Both sides hold a reference; whoever releases last frees it, so a client
 * that disconnects mid-stream never leaves the engine with a dangling task.
 */
#ifndef THAW_TASK_H
#define THAW_TASK_H

#include "api.h"
#include "chat.h"

#include <llama.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct thaw_task {
    /* ---- input: set before submit, read-only afterwards ---- */
    struct thaw_chat_request req;  /* owned */
    llama_token *prompt;           /* owned, n_prompt tokens */
    int n_prompt;
    int max_tokens;                /* resolved: request's, else -n, else context */
    bool has_lookup_key;           /* the conversation has an assistant message */
    uint8_t lookup_key[THAW_KEY_BYTES];
    uint8_t binding[THAW_KEY_BYTES]; /* to derive the store key from the reply */
    int64_t t_submit_us;

    /* ---- output: written by the engine under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;                    /* reply bytes safe to send so far (complete UTF-8, no partial stop) */
    size_t n_text, cap_text;
    bool done;
    int http_status;               /* 200, or the error's status */
    char *error;                   /* message when http_status != 200 */
    const char *finish_reason;     /* "stop" | "length" (static) */
    struct thaw_timings timings;

    atomic_bool cancelled;         /* the client went away: stop generating */
    atomic_int refs;
};

/* A task owning `req` (moved: the caller's copy is zeroed) and `prompt`
 * (moved). Refcount 1. NULL on ENOMEM (then nothing was moved). */
struct thaw_task *thaw_task_new(struct thaw_chat_request *req, llama_token *prompt, int n_prompt);

void thaw_task_retain(struct thaw_task *t);
/* Drops a reference; the last one frees everything the task owns. */
void thaw_task_release(struct thaw_task *t);

/* Engine side. emit appends reply text; finish/fail set done and wake waiters. */
int thaw_task_emit(struct thaw_task *t, const char *s, size_t n);
void thaw_task_finish(struct thaw_task *t, const char *finish_reason, const struct thaw_timings *timings);
void thaw_task_fail(struct thaw_task *t, int http_status, const char *message);

/* Route side: waits until more than `have` bytes of text exist or the task is
 * done, at most `timeout_ms` (-1 = forever). Call with t->mu NOT held; it
 * returns with nothing locked. Returns true when there is something new. */
bool thaw_task_wait(struct thaw_task *t, size_t have, int timeout_ms);

int64_t thaw_now_us(void);

#endif
