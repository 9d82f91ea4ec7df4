/* api_embed.h — llama-server's embeddings and rerank endpoints: their
 * requests, read into prompts (tokens), and their replies.
 *
 *   POST /embedding, /embeddings   llama-server's own shape: a list of
 *                                  {"index", "embedding": [[floats]...]}
 *                                  (one vector, or one per token with
 *                                  pooling none)
 *   POST /v1/embeddings            OpenAI's: {"object":"list","data":[{"object":
 *                                  "embedding","index","embedding"}],"model",
 *                                  "usage"}; floats or base64 (encoding_format)
 *   POST /rerank, /reranking,      {"query", "documents"} -> {"results":
 *   /v1/rerank, /v1/reranking      [{"index","relevance_score"}]} best first
 *                                  (Jina's shape); {"query","texts"} -> a bare
 *                                  list of {"index","score"[,"text"]} (TEI's)
 *
 * An input ("input", or "content": then llama-server's shape even on
 * /v1/embeddings) is a string, a list of token ids, a list mixing both
 * (one prompt: the strings tokenized in place, special tokens added only
 * to a leading string), or a list of those (one prompt each). Errors are
 * OpenAI's error object (thaw_api_error_json), as llama-server answers.
 */
#ifndef THAW_API_EMBED_H
#define THAW_API_EMBED_H

#include "api/chat.h"

#include <llama.h>
#include <stdbool.h>

/* most inputs (or documents) one request may carry */
#define THAW_API_MAX_EMBED_INPUTS 4096

struct thaw_embed_request {
    bool oai;              /* reply in OpenAI's shape, else llama-server's list */
    bool base64;           /* encoding_format "base64": each vector's float32 bytes (oai only) */
    int embd_normalize;    /* the request's embd_normalize, else the server's */
    char *model;           /* "model" as sent (echoed), NULL when absent */
    llama_token **prompts; /* n_prompts token arrays, each owned until the caller takes it (then NULL) */
    int *n_prompt;         /* tokens of each */
    int n_prompts;
};

/* Reads a body for POST /embedding(s) (oai_route false) or /v1/embeddings
 * (true), tokenizing each input with `chat`; ids are checked against the
 * vocabulary. Returns 0, THAW_EINVAL (reason in err: not JSON, no input,
 * a wrong type, an empty prompt, a bad id, too many inputs) or
 * THAW_ENOMEM; `out` needs thaw_api_embed_request_free either way. */
int thaw_api_parse_embed(const char *body, size_t len, bool oai_route, const struct thaw_chat *chat,
                         int default_normalize, struct thaw_embed_request *out, char *err, size_t errlen);
void thaw_api_embed_request_free(struct thaw_embed_request *r);

/* One input's answer: rows x n floats (the caller's), from n_tokens tokens. */
struct thaw_embed_vec {
    const float *v;
    int rows, n;
    int n_tokens;
};

/* The reply to `r` with one vector set per prompt (vecs[n_prompts]), in
 * the request's shape; `model` when the request named none. malloc'd JSON,
 * NULL on ENOMEM. */
char *thaw_api_embed_reply(const struct thaw_embed_request *r, const char *model, const struct thaw_embed_vec *vecs);

struct thaw_rerank_request {
    bool tei;              /* "texts" given: TEI's shape */
    bool return_text;      /* TEI's return_text: each result carries its text */
    int top_n;             /* results kept, best first (default: all) */
    char *model;           /* as sent, NULL when absent */
    char **docs;           /* n_docs documents (owned) */
    llama_token **prompts; /* one (query, document) prompt per document, owned until taken (then NULL) */
    int *n_prompt;
    int n_docs;
};

/* Reads a body for POST /rerank & co.: "query" (a string) and
 * "documents" (or TEI's "texts": a non-empty list of strings), each pair
 * made a prompt by thaw_chat_rerank_prompt. Returns 0, THAW_EINVAL (reason
 * in err) or THAW_ENOMEM; `out` needs thaw_api_rerank_request_free either
 * way. */
int thaw_api_parse_rerank(const char *body, size_t len, const struct thaw_chat *chat, struct thaw_rerank_request *out,
                          char *err, size_t errlen);
void thaw_api_rerank_request_free(struct thaw_rerank_request *r);

/* The reply: scores[i] and n_tokens[i] for document i; sorted best first,
 * cut to top_n. malloc'd JSON, NULL on ENOMEM. */
char *thaw_api_rerank_reply(const struct thaw_rerank_request *r, const char *model, const float *scores,
                            const int *n_tokens);

#endif
