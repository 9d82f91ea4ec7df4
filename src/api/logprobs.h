/* logprobs.h — a reply's per-token probabilities: the list the engine
 * fills as it samples, and each API's JSON for it.
 *
 * One entry per sampled token (end-of-generation tokens have none): the
 * token, its probability, its bytes in the reply text, and the request's
 * top N candidates, as llama-server computes them (server-context.cpp
 * populate_token_probs): the softmax over the whole vocabulary of the
 * logits at the sampled position, before any sampler, or with
 * post_sampling_probs the candidates the sampler chain left (ordered by
 * probability, none of probability 0).
 *
 * Which entries go with which text: an entry belongs to the reply once
 * its last byte has been handed out (end <= n_text), or, when the reply
 * is done, once any byte of it is in the final text (start < n_text), so
 * a token the reply was cut inside (a stop string) keeps its entry and one
 * wholly after the cut does not. A stream and a whole reply therefore
 * send the same entries (thaw_logprobs_upto).
 *
 * Not thread-safe: the task's mutex guards its list (task.h).
 */
#ifndef THAW_LOGPROBS_H
#define THAW_LOGPROBS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The request's bounds on N: OpenAI's top_logprobs and /v1/completions'
 * logprobs (OpenAI's documented 20), llama-server's n_probs. */
#define THAW_LOGPROBS_MAX_OAI 20
#define THAW_LOGPROBS_MAX 100

/* One token as the engine hands it in: piece[n_piece] is its text (any
 * bytes, not NUL-terminated), p its probability in [0, 1]. */
struct thaw_logprob_in {
    int32_t tok;
    float p;
    const char *piece;
    size_t n_piece;
};

struct thaw_logprob_entry {
    int32_t tok;
    float p;
    uint32_t start, end;     /* its bytes in the reply text: [start, end) */
    uint32_t piece_off, n_piece; /* in bytes */
    uint32_t top_off, n_top; /* in top */
};

struct thaw_logprob_top {
    int32_t tok;
    float p;
    uint32_t piece_off, n_piece; /* in bytes */
};

struct thaw_logprobs {
    struct thaw_logprob_entry *v; /* n of cap */
    size_t n, cap;
    struct thaw_logprob_top *top; /* n_top of cap_top */
    size_t n_top, cap_top;
    char *bytes;                  /* every piece, back to back: n_bytes of cap_bytes */
    size_t n_bytes, cap_bytes;
};

/* Appends the entry of `sampled` (its bytes [start, end) of the reply) with
 * its n_top candidates. Returns 0 or THAW_ENOMEM (the list unchanged). */
int thaw_logprobs_add(struct thaw_logprobs *lp, const struct thaw_logprob_in *sampled,
                      const struct thaw_logprob_in *top, int n_top, uint32_t start, uint32_t end);

/* Frees what the list owns and empties it (a zeroed list is empty). */
void thaw_logprobs_free(struct thaw_logprobs *lp);

/* The index past the last entry that goes with the first n_text bytes of
 * the reply (done: the final text), starting at `from` (the rule above). */
size_t thaw_logprobs_upto(const struct thaw_logprobs *lp, size_t from, size_t n_text, bool done);

/* llama-server's array for entries [from, to): {"id", "token" (valid
 * UTF-8: a piece cut inside a character is cut before it), "bytes",
 * "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}]}, or
 * with `post` "prob" and "top_probs" holding probabilities. It is both
 * OpenAI's chat logprobs.content and /completion's
 * completion_probabilities. With `legacy` the OpenAI completions fields
 * are returned instead as an object: {"content": that array, "tokens",
 * "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
 * A new reference, NULL on ENOMEM. */
json_t *thaw_logprobs_json(const struct thaw_logprobs *lp, size_t from, size_t to, bool post, bool legacy);

#endif
