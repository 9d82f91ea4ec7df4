/* chat.h — a request's messages -> the prompt and what generation needs,
 * the reply -> the message the client gets.
 *
 * Rendering goes through llama.cpp's chat library (template.h): the model's
 * Jinja template with tools, tool calls, reasoning and a JSON-schema
 * grammar, or a built-in template with --no-jinja.
 *
 * All functions are safe to call from any thread once thaw_chat_new
 * returned (they only read the vocabulary and the templates).
 */
#ifndef THAW_CHAT_H
#define THAW_CHAT_H

#include "api/api.h"

#include <llama.h>
#include <stdbool.h>
#include <stdint.h>

struct thaw_chat;

struct thaw_chat_params {
    const char *template_src;    /* --chat-template / --chat-template-file text; NULL = the model's */
    bool jinja;                  /* --jinja (default) / --no-jinja */
    const char *default_kwargs;  /* --chat-template-kwargs: a JSON object, or NULL */
    const char *reasoning_format; /* --reasoning-format: none | deepseek | auto */
};

/* Returns 0, THAW_EINVAL (the template cannot be used, or the chat library
 * failed its self-test: the reason is logged) or THAW_ENOMEM. */
int thaw_chat_new(const struct llama_model *model, const struct thaw_chat_params *p, struct thaw_chat **out);
void thaw_chat_free(struct thaw_chat *chat);

/* The template in use (text or name), for the start-up log and the binding. */
const char *thaw_chat_template(const struct thaw_chat *chat);

/* What a rendered request needs beyond its tokens: the grammar that
 * constrains sampling (tool calls, response_format), the stops the template
 * adds, and how to parse the reply. Owned arrays; thaw_chat_gen_free. */
struct thaw_chat_gen {
    char *grammar;               /* GBNF, NULL = none */
    bool grammar_lazy;           /* only after a trigger matched */
    char **triggers;             /* regexes for the lazy grammar, n_triggers */
    int n_triggers;
    llama_token *trigger_tokens; /* n_trigger_tokens */
    int n_trigger_tokens;
    llama_token *prefill;        /* a non-lazy grammar first accepts these (the generation prompt) */
    int n_prefill;
    llama_token *preserved;      /* special tokens whose text the reply keeps */
    int n_preserved;
    char **stops;                /* additional stop strings, n_stops */
    int n_stops;
    char *parser;                /* for thaw_chat_parse_reply; NULL = the reply is plain text */
    /* the reasoning budget (engine/budget.h), when the template has a
     * thinking block and the request a budget >= 0; think_start NULL = none */
    int reasoning_budget;        /* tokens inside the block; 0 = end it at once */
    char *think_start;           /* the block's start tag */
    char **think_ends;           /* the tags that end it, n_think_ends (the first is forced) */
    int n_think_ends;
    llama_token *think_forced;   /* what ends a spent budget: the budget message + think_ends[0] */
    int n_think_forced;
    char *gen_prompt;            /* the generation prompt's text, scanned before the first token */
};
void thaw_chat_gen_free(struct thaw_chat_gen *g);

/* Request -> prompt tokens and generation needs. With `text` non-NULL the
 * rendered prompt is not tokenized: it comes back in *text (malloc'd) and
 * *tokens is NULL, for the caller to tokenize (a prompt with images, whose
 * markers vision.h turns into image positions). Returns 0, THAW_EINVAL
 * (the template could not render these messages or tools: reason in
 * err[errlen]) or THAW_ENOMEM. */
int thaw_chat_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **tokens,
                     int *n_tokens, char **text, struct thaw_chat_gen *gen, char *err, size_t errlen);

/* A raw completion's prompt (req->raw): raw_text tokenized (BOS as the
 * vocab wants, special tokens parsed) or raw_tokens checked against the
 * vocabulary; gen holds the request's own grammar (or its JSON schema's)
 * and no parser. Returns 0, THAW_EINVAL (reason in err) or THAW_ENOMEM. */
int thaw_chat_raw_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **tokens,
                         int *n_tokens, struct thaw_chat_gen *gen, char *err, size_t errlen);

/* The tokens the next turn will present for the conversation followed by
 * `reply_json` (a message, as thaw_chat_parse_reply gives it): everything
 * before the next message's own text, so template glue that only appears
 * once another message follows (end-of-turn markers, stripped reasoning)
 * is already in. Returns 0, THAW_EINVAL or THAW_ENOMEM. */
/* The branch point of req's prompt (prompt, n_prompt tokens): how many of
 * its tokens the leading system / developer / tool messages take as every
 * conversation that starts with them renders them (template glue
 * included), the position new conversations share (snapshots.h). 0 when
 * there are no such messages, nothing else, or the rendering fails.
 * The leading messages' rendering is remembered per tenant `ns`
 * (THAW_KEY_BYTES): `*remembered` says whether it was. */
/* How many of prompt's n_prompt tokens the first n_msgs messages of req
 * take (tools and template glue included), as any conversation going on
 * from them renders them: what a cache_control mark on message n_msgs - 1
 * covers (0 messages: the tools). 0 when the rendering fails or for a raw
 * prompt. */
int thaw_chat_prefix_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req, int n_msgs,
                            const llama_token *prompt, int n_prompt);

int thaw_chat_branch_point(const struct thaw_chat *chat, const uint8_t *ns, const struct thaw_chat_request *req,
                           const llama_token *prompt, int n_prompt, bool *remembered);

int thaw_chat_canonical(const struct thaw_chat *chat, const struct thaw_chat_request *req, const char *reply_json,
                        llama_token **tokens, int *n_tokens);

/* thaw_chat_canonical for a prompt with images: prompt[0..n_prompt) is what
 * the vision tokenizer made of `rendered` (the request's text, an image's
 * `marker` where each image stands: vision.h), which tokenizes the text
 * after each marker on its own. The canonical form's text must equal
 * `rendered` up to its last marker (the images are history the reply does
 * not touch): that part keeps the prompt's own tokens (the images'
 * placeholders); the text after it is tokenized as the vision tokenizer
 * would. THAW_EINVAL where the two disagree (the reply is then stored as
 * generated), THAW_ENOMEM. */
int thaw_chat_canonical_spliced(const struct thaw_chat *chat, const struct thaw_chat_request *req,
                                const char *reply_json, const char *rendered, const char *marker,
                                const llama_token *prompt, int n_prompt, llama_token **tokens, int *n_tokens);

/* How many tokens req's generation prompt adds at its prompt's end (the
 * assistant turn's opening, with the template's reasoning glue such as
 * "<think>\n" for the request's kwargs), from a one-message rendering
 * with and without it: a hybrid checkpoints before them, since the next
 * turn renders the reply as history from there (reasoning stripped) and
 * parts from what was generated within them. 0 for a raw prompt, an
 * assistant prefill or a failed rendering. */
int thaw_chat_gen_prompt_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req);

/* Generated text -> the assistant message the client gets (JSON: role,
 * content (null when empty and there are tool calls), reasoning_content?,
 * tool_calls? with ids `call_<id_prefix><i>`), and its normalised form for
 * the store key (api.h). `partial`: the text may stop mid-way. Both
 * malloc'd. Returns 0, THAW_EINVAL (reason in err) or THAW_ENOMEM. */
int thaw_chat_parse_reply(const char *parser, const char *text, bool partial, const char *id_prefix, char **msg_json,
                          char **norm_json, char *err, size_t errlen);

/* The prompt text a request renders to (POST /apply-template). Returns 0
 * and a malloc'd *text, THAW_EINVAL (reason in err) or THAW_ENOMEM. */
int thaw_chat_render_prompt(const struct thaw_chat *chat, const struct thaw_chat_request *req, char **text, char *err,
                            size_t errlen);

/* POST /tokenize: special tokens parsed; BOS/EOS as the vocab adds them
 * when add_special. Returns 0, THAW_EINVAL, THAW_ETOOBIG or THAW_ENOMEM. */
int thaw_chat_tokenize_text(const struct thaw_chat *chat, const char *text, bool add_special, llama_token **out,
                            int *n_out);
/* A rerank prompt for (query, document), as llama-server lays it out: the
 * model's "rerank" template (tokenizer.chat_template.rerank) with {query}
 * and {document} replaced, tokenized with special tokens parsed; without
 * one, [BOS] query [EOS] [SEP] document [EOS], each marker where the vocab
 * adds it. A malloc'd array (at least one element allocated) and its
 * count. Returns 0, THAW_EINVAL, THAW_ETOOBIG or THAW_ENOMEM. */
int thaw_chat_rerank_prompt(const struct thaw_chat *chat, const char *query, const char *doc, llama_token **out,
                            int *n_out);
/* Text as it reads inside a reply (logit_bias's words): no BOS, special
 * tokens taken as text. A malloc'd array (at least one element allocated)
 * and its count. Returns 0, THAW_EINVAL, THAW_ETOOBIG or THAW_ENOMEM. */
int thaw_chat_tokenize_plain(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out);
/* The prompt as the model read it: each token's text as the vocabulary
 * has it (special tokens rendered), made valid UTF-8, as llama-server
 * shows it ("<s> " + text) in __verbose and /completion's reply.
 * malloc'd; NULL on ENOMEM (or a token out of the vocabulary). */
char *thaw_chat_prompt_text(const struct thaw_chat *chat, const llama_token *toks, int n);
/* Resolves req->bias (logit_bias) into bias_tok/bias_val: ids checked
 * against the vocabulary, texts tokenized as they read inside a reply (no
 * BOS, special tokens taken as text), each of their tokens biased.
 * Returns 0, THAW_EINVAL (reason in err[errlen]) or THAW_ENOMEM. */
int thaw_chat_resolve_bias(const struct thaw_chat *chat, struct thaw_chat_request *req, char *err, size_t errlen);
/* POST /detokenize: malloc'd text, or NULL when a token is out of the
 * vocabulary (or ENOMEM). */
char *thaw_chat_detokenize(const struct thaw_chat *chat, const llama_token *toks, int n);
int thaw_chat_n_vocab(const struct thaw_chat *chat);
/* One token's own text (POST /tokenize's pieces): its bytes as the
 * vocabulary has them, leading space kept, special tokens rendered; may be
 * a part of a character. malloc'd, NUL-terminated; NULL on ENOMEM. */
char *thaw_chat_token_piece(const struct thaw_chat *chat, llama_token tok);

/* Tokenizes text (special tokens parsed, BOS added when the vocab wants it)
 * into a malloc'd array. Returns 0 or THAW_ENOMEM / THAW_EINVAL. */
int thaw_chat_tokenize(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out);

#endif
