/* prepare.c — a parsed request made ready for the engine (prepare.h).
 *
 * Map:
 *   ---- the prompt ----    defaults, bounds, logit bias, the template (or a raw prompt)
 *   ---- the task ----      the prompt's task: reply ids, limits, branch point, binding, lookup key
 *   ---- the store key ---- derived at the reply's end, from the same binding
 */
#include "engine/prepare.h"

#include "api/request_keys.h"
#include "base/error.h"
#include "base/fmt.h"
#include "base/log.h"
#include "engine/engine_state.h"

#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the prompt ---------------------------------------------------------------------- */

/* The server's --grammar / --json-schema for a request that constrains
 * nothing itself (no grammar, schema, or tools). 0 or THAW_ENOMEM. */
static int apply_defaults(const struct thaw_config *cfg, struct thaw_chat_request *req)
{
    if (!cfg->prefill_assistant)
        thaw_api_no_prefill(req);
    if (req->grammar || req->json_schema || req->tools_json)
        return 0;
    if (cfg->json_schema && !(req->json_schema = strdup(cfg->json_schema)))
        return THAW_ENOMEM;
    if (cfg->grammar && !(req->grammar = strdup(cfg->grammar)))
        return THAW_ENOMEM;
    return 0;
}

/* The reasoning budget a request runs with: its own, else the server's
 * (--reasoning-budget, POST /props), and the message likewise. A budget
 * of 0 also turns the template's thinking off (enable_thinking false,
 * unless the request names it): before the keys are derived, so they
 * cover what is rendered. 0 or THAW_ENOMEM. */
static int apply_reasoning(struct thaw_engine *e, struct thaw_chat_request *req)
{
    int budget;
    char *msg;

    if (req->raw)
        return 0;
    if (thaw_engine_reasoning_get(e, &budget, &msg) != 0)
        return THAW_ENOMEM;
    if (req->reasoning_budget < 0)
        req->reasoning_budget = budget;
    if (!req->reasoning_budget_message)
        req->reasoning_budget_message = msg;
    else
        free(msg);
    if (req->reasoning_budget == 0)
        return thaw_api_kwargs_set(req, "enable_thinking", "false", true);
    return 0;
}

/* A file:// image's bytes, read from under --media-path `dir`: `rel` is
 * taken relative to it (leading slashes too, as llama-server does); a ".."
 * component, or a link that resolves outside dir, is refused. 0,
 * THAW_EINVAL (why in err, for a 400) or THAW_ENOMEM. */
static int read_media(const char *dir, struct thaw_image *img, size_t i, char *err, size_t errlen)
{
    char full[PATH_MAX], *rdir = NULL, *rfile = NULL;
    const char *rel = img->path;
    int fd = -1, rc = THAW_EINVAL;
    struct stat st;

    if (!dir) {
        snprintf(err, errlen, "image %zu: file:// URLs are refused: the server has no --media-path", i + 1);
        return THAW_EINVAL;
    }
    for (const char *p = rel; *p;) { /* each component */
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            snprintf(err, errlen, "image %zu: the file:// path may not contain '..'", i + 1);
            return THAW_EINVAL;
        }
        p += n;
        p += *p == '/';
    }
    if (snprintf(full, sizeof full, "%s/%s", dir, rel) >= (int)sizeof full) {
        snprintf(err, errlen, "image %zu: the file:// path is too long", i + 1);
        return THAW_EINVAL;
    }
    rdir = realpath(dir, NULL);
    rfile = realpath(full, NULL);
    size_t nd = rdir ? strlen(rdir) : 0;
    if (!rdir || !rfile || strncmp(rfile, rdir, nd) != 0 || (rfile[nd] != '/' && strcmp(rdir, "/") != 0)) {
        snprintf(err, errlen, "image %zu: no such file under --media-path", i + 1);
        goto out;
    }
    if ((fd = open(rfile, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "image %zu: the file cannot be read", i + 1);
        goto out;
    }
    if (st.st_size <= 0 || (uint64_t)st.st_size > THAW_VISION_MAX_IMAGE_BYTES) {
        snprintf(err, errlen, "image %zu: the file is %s (the limit is %u MiB)", i + 1,
                 st.st_size <= 0 ? "empty" : "too large", THAW_VISION_MAX_IMAGE_BYTES >> 20);
        goto out;
    }
    if (!(img->data = malloc((size_t)st.st_size))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, img->data + got, (size_t)st.st_size - got);
        if (r <= 0) {
            snprintf(err, errlen, "image %zu: the file cannot be read", i + 1);
            free(img->data);
            img->data = NULL;
            goto out;
        }
        got += (size_t)r;
    }
    img->len = got;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(rfile);
    free(rdir);
    return rc;
}

/* A prompt with images: the template's text tokenized by the projector's
 * tokenizer (vision.h), each image's bytes read first where a file:// URL
 * names them. Returns as thaw_prepare_task. */
static int vision_prompt(struct thaw_engine *e, struct thaw_chat_request *req, const char *text,
                         llama_token **prompt, int *n_prompt, struct thaw_vision_prompt **vp, char *err,
                         size_t errlen)
{
    int rc;

    for (size_t i = 0; i < req->n_images; i++)
        if (!req->images[i].data && (rc = read_media(e->cfg->media_path, &req->images[i], i, err, errlen)) != 0)
            return rc;
    if ((rc = thaw_vision_tokenize(e->vision, text, req->images, req->n_images, prompt, n_prompt, vp, err,
                                   errlen)) != 0)
        return rc;
    for (int i = 0; i < thaw_vision_prompt_count(*vp); i++) {
        int pos, n;
        thaw_vision_prompt_span(*vp, i, &pos, &n);
        /* one micro-batch per image (non-causal inside it), and text after
         * the last one to sample the reply from */
        if (n > e->n_ubatch || pos + n >= *n_prompt) {
            if (n > e->n_ubatch)
                snprintf(err, errlen, "an image takes %d positions: more than a micro-batch (-ub %d)", n, e->n_ubatch);
            else
                snprintf(err, errlen, "the prompt ends with an image: nothing to reply after");
            rc = THAW_EINVAL;
            break;
        }
    }
    if (rc == 0 && *n_prompt >= e->n_ctx_slot) {
        snprintf(err, errlen, "the prompt is %d tokens with its images: a slot's context holds %d (-c / -np)",
                 *n_prompt, e->n_ctx_slot);
        rc = THAW_EINVAL;
    }
    if (rc != 0) {
        free(*prompt);
        *prompt = NULL;
        *n_prompt = 0;
        thaw_vision_prompt_free(*vp);
        *vp = NULL;
    }
    return rc;
}

/* The bounds, the bias, the defaults, the template: the prompt and what
 * generation needs (and the prompt's images, *vp, NULL for none). Returns
 * as thaw_prepare_task; on failure nothing is left to free in prompt, gen
 * or vp (req stays the caller's). */
static int render(struct thaw_engine *e, struct thaw_chat_request *req, llama_token **prompt, int *n_prompt,
                  struct thaw_vision_prompt **vp, char **vtext, struct thaw_chat_gen *gen, char *err, size_t errlen)
{
    int rc;

    *prompt = NULL;
    *n_prompt = 0;
    *vtext = NULL;
    *vp = NULL;
    memset(gen, 0, sizeof *gen);
    if (req->n_images > 0 && !e->vision) {
        snprintf(err, errlen, "image input is not supported: the server was started without --mmproj (the "
                              "model's vision projector)");
        return THAW_EINVAL;
    }
    if (req->n_bias > 0 && (rc = thaw_chat_resolve_bias(e->chat, req, err, errlen)) != 0)
        return rc;
    if (req->id_slot >= e->cfg->n_parallel) {
        snprintf(err, errlen, "'id_slot' %d: the server has %d slots (-np), 0 to %d", req->id_slot,
                 e->cfg->n_parallel, e->cfg->n_parallel - 1);
        return THAW_EINVAL;
    }
    /* cheap bounds first: no template or tokenizer work for what cannot fit */
    if ((rc = thaw_api_admit(req, e->n_ctx_slot, e->max_token_bytes, err, errlen)) != 0)
        return rc;
    if ((rc = apply_defaults(e->cfg, req)) != 0 || (rc = apply_reasoning(e, req)) != 0)
        return rc;
    if (req->raw)
        return thaw_chat_raw_prompt(e->chat, req, prompt, n_prompt, gen, err, errlen);
    if (req->n_images == 0)
        return thaw_chat_prompt(e->chat, req, prompt, n_prompt, NULL, gen, err, errlen);
    char *text = NULL;
    if ((rc = thaw_chat_prompt(e->chat, req, prompt, n_prompt, &text, gen, err, errlen)) != 0)
        return rc;
    rc = vision_prompt(e, req, text, prompt, n_prompt, vp, err, errlen);
    if (rc != 0) {
        free(text);
        thaw_chat_gen_free(gen);
    } else {
        *vtext = text; /* the reply's canonical form splices onto it (generate.c) */
    }
    return rc;
}

int thaw_prepare_count(struct thaw_engine *e, struct thaw_chat_request *req, int *n_prompt, char *err,
                       size_t errlen)
{
    llama_token *prompt;
    struct thaw_chat_gen gen;
    struct thaw_vision_prompt *vp;
    char *vtext;
    int rc = render(e, req, &prompt, n_prompt, &vp, &vtext, &gen, err, errlen);

    free(prompt);
    free(vtext);
    thaw_vision_prompt_free(vp);
    thaw_chat_gen_free(&gen);
    thaw_chat_request_free(req);
    return rc;
}

/* ---- the task ------------------------------------------------------------------------ */

/* A client's conversation id made fit for one log line: printable ASCII as
 * is, every other byte as \xNN (a newline in an id must not forge a line of
 * its own), "-" when absent. buf holds 4 * THAW_API_MAX_CONVERSATION_ID + 1. */
static const char *log_id(const char *id, char *buf)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;

    if (!id)
        return "-";
    for (const unsigned char *p = (const unsigned char *)id; *p && n + 4 <= 4 * THAW_API_MAX_CONVERSATION_ID; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[n++] = (char)*p;
        } else {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n] = '\0';
    return buf;
}

int thaw_prepare_task(struct thaw_engine *e, struct thaw_chat_request *req, const uint8_t ns[THAW_KEY_BYTES],
                      const char *conversation_id, struct thaw_task **out, char *err, size_t errlen)
{
    llama_token *prompt;
    struct thaw_chat_gen gen;
    struct thaw_vision_prompt *vp;
    char *vtext;
    struct thaw_task *t;
    int n_prompt, rc;

    *out = NULL;
    if ((rc = render(e, req, &prompt, &n_prompt, &vp, &vtext, &gen, err, errlen)) != 0)
        goto fail_request;
    if (!(t = thaw_task_new(req, prompt, n_prompt))) {
        free(vtext);
        rc = THAW_ENOMEM;
        goto fail_prompt;
    }
    t->gen = gen;
    t->vision = vp;
    t->vision_text = vtext;
    if (gen.grammar)
        LOG_DBG("chat: grammar of %zu bytes (%s, %d trigger patterns, %d trigger tokens, %d prefill tokens), %d stops",
                strlen(gen.grammar), gen.grammar_lazy ? "lazy" : "from the first token", gen.n_triggers,
                gen.n_trigger_tokens, gen.n_prefill, gen.n_stops);

    /* the reply: tool-call ids, the model's name, how long it may grow;
     * max_tokens 0: nothing to generate, answered after one token as OpenAI does */
    unsigned char rnd[6];
    randombytes_buf(rnd, sizeof rnd);
    thaw_hex(rnd, sizeof rnd, t->id_prefix);
    t->model_name = e->model_name;
    t->max_tokens = t->req.max_tokens > 0 ? t->req.max_tokens : t->req.max_tokens == 0 ? 1 : e->cfg->n_predict;

    /* where a hybrid snapshots (the leading system / developer / tool
     * messages) and checkpoints (before the generation prompt) */
    bool branch_remembered;
    /* (with images too: the leading messages' rendering agrees with the
     * prompt up to the first image at most, whose marker renders as text
     * where the prompt holds its placeholders; a branch point never falls
     * inside an image) */
    t->n_branch = thaw_chat_branch_point(e->chat, ns, &t->req, t->prompt, t->n_prompt, &branch_remembered);
    t->n_branch = thaw_vision_prompt_back_off(vp, t->n_branch);
    if (e->recurrent)
        t->n_gen_prompt = thaw_chat_gen_prompt_tokens(e->chat, &t->req);
    /* cache_control marks: the prompt tokens each covers (a retention hint
     * for what the turn stores) */
    for (int i = 0; i < t->req.n_retain && thaw_kvcache_enabled(e->kv); i++)
        t->retain_tokens[i] = thaw_chat_prefix_tokens(e->chat, &t->req, t->req.retain[i].n_msgs, t->prompt,
                                                      t->n_prompt);

    /* the conversation's identity: the binding (model, settings, tenant,
     * then tools and template kwargs), and the key of what the last turn
     * stored, the conversation up to its last assistant message */
    memcpy(t->ns, ns, THAW_KEY_BYTES);
    thaw_engine_binding(e, ns, t->binding);
    thaw_request_keys_bind(t->binding, &t->req, t->binding);
    long last_asst = thaw_request_keys_last_assistant(t->req.messages, t->req.n_messages);
    if (vp)
        LOG_DBG("chat: a prompt with %d images (%d tokens)", thaw_vision_prompt_count(vp), n_prompt);
    if (last_asst >= 0) {
        t->has_lookup_key = true;
        thaw_request_keys_conversation(t->binding, t->req.messages, (size_t)last_asst + 1, NULL, t->lookup_key);
    }
    if (thaw_log_verbosity() >= THAW_LOG_DEBUG) {
        char pck[4 * THAW_API_MAX_CONVERSATION_ID + 1], xci[4 * THAW_API_MAX_CONVERSATION_ID + 1];
        LOG_DBG("chat: %zu messages, %d prompt tokens (%d of the leading system messages%s)%s, prompt_cache_key %s, "
                "X-Conversation-Id %s",
                t->req.n_messages, n_prompt, t->n_branch, branch_remembered ? ", remembered" : "",
                t->req.stream ? ", streamed" : "", log_id(t->req.prompt_cache_key, pck), log_id(conversation_id, xci));
    }
    *out = t;
    return 0;

fail_prompt:
    free(prompt);
    thaw_vision_prompt_free(vp);
    thaw_chat_gen_free(&gen);
fail_request:
    thaw_chat_request_free(req);
    return rc;
}

/* ---- the store key --------------------------------------------------------------------- */

void thaw_prepare_store_key(const struct thaw_task *t, const char *norm_reply, const llama_token *tokens,
                            int n_tokens, uint8_t out[THAW_KEY_BYTES])
{
    thaw_request_keys_reply(t->binding, &t->req, norm_reply, tokens, n_tokens, out);
}
