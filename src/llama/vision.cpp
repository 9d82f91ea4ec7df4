/* vision.cpp — libmtmd behind vision.h's C interface (the second C++ file
 * of thaw, after api/template.cpp). Nothing throws past the boundary.
 *
 * Map:
 *   ---- helpers ----    logging, placeholders
 *   ---- lifecycle ----  the projector loaded for a model
 *   ---- tokenize ----   text + images -> tokens with placeholders, spans
 *   ---- eval ----       one image encoded and decoded into a sequence
 */
extern "C" {
#include "llama/vision.h"

#include "base/error.h"
#include "base/log.h"
}

#include <mtmd-helper.h>
#include <mtmd.h>
#include <sodium.h>
#include <stb/stb_image.h> /* declarations only: the code is in mtmd-helper.cpp */

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

struct thaw_vision {
    mtmd_context *mctx;
    uint8_t identity[32]; /* thaw_vision_params.identity */
};

struct vision_span {
    int pos;       /* first prompt position */
    int n;         /* positions (= tokens: M-RoPE projectors are refused) */
    size_t chunk;  /* index in chunks */
};

struct thaw_vision_prompt {
    mtmd_input_chunks *chunks;
    std::vector<vision_span> spans; /* in prompt order */
};

/* ---- helpers ------------------------------------------------------------------ */

/* libmtmd's and its helper's log lines: errors and warnings as thaw's, the
 * rest (a line per image batch) only at debug level */
static void mtmd_log_cb(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_CONT)
        return;
    enum thaw_log_level v = level >= GGML_LOG_LEVEL_ERROR  ? THAW_LOG_ERROR
                            : level == GGML_LOG_LEVEL_WARN ? THAW_LOG_WARN
                                                           : THAW_LOG_DEBUG;
    if ((int)v > thaw_log_verbosity())
        return;
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        n--;
    thaw_log(v, "mtmd: %.*s", (int)n, text);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The placeholders of an image whose content id (libmtmd's bitmap id: the
 * SHA-256 of its bytes, hex) is `id`, n of them into out: position k's is
 * -1 - (30 bits of BLAKE2b-64 keyed by BLAKE2b-256(projector identity ||
 * id), over k as 4 little-endian bytes). Negative, so never a vocabulary
 * id; a run of them pins the image and the projector (vision.h). */
static void placeholders(const thaw_vision *v, const char *id, int n, llama_token *out)
{
    uint8_t key[crypto_generichash_KEYBYTES];
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, sizeof key);
    crypto_generichash_update(&st, v->identity, sizeof v->identity);
    crypto_generichash_update(&st, (const unsigned char *)id, strlen(id));
    crypto_generichash_final(&st, key, sizeof key);
    for (int k = 0; k < n; k++) {
        const unsigned char le[4] = {(unsigned char)k, (unsigned char)(k >> 8), (unsigned char)(k >> 16),
                                     (unsigned char)(k >> 24)};
        uint8_t h[8];
        crypto_generichash(h, sizeof h, le, sizeof le, key, sizeof key);
        uint32_t x = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        out[k] = (llama_token)(-1 - (int32_t)(x & 0x3fffffff));
    }
}

/* ---- lifecycle ------------------------------------------------------------------ */

int thaw_vision_new(const struct llama_model *model, const struct thaw_vision_params *p, struct thaw_vision **out,
                    char *err, size_t errlen)
{
    *out = nullptr;
    try {
        mtmd_log_set(mtmd_log_cb, nullptr);
        mtmd_helper_log_set(mtmd_log_cb, nullptr);
        mtmd_context_params mp = mtmd_context_params_default();
        mp.use_gpu = p->offload;
        mp.print_timings = false;
        mp.n_threads = p->n_threads > 0 ? p->n_threads : 4;
        mp.warmup = false;
        mp.flash_attn_type = p->flash_attn ? LLAMA_FLASH_ATTN_TYPE_AUTO : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        if (p->image_min_tokens > 0)
            mp.image_min_tokens = p->image_min_tokens;
        if (p->image_max_tokens > 0)
            mp.image_max_tokens = p->image_max_tokens;
        mtmd_context *mctx = mtmd_init_from_file(p->path, model, mp);
        if (!mctx) {
            set_err(err, errlen, "'%s' is not a projector libmtmd loads for this model (see the log above)", p->path);
            return THAW_EINVAL;
        }
        if (mtmd_decode_use_mrope(mctx)) {
            /* an image there takes fewer positions than embeddings: the
             * engine's one-position-per-token layout does not hold */
            mtmd_free(mctx);
            set_err(err, errlen, "'%s' uses M-RoPE positions (Qwen-VL), which thaw does not serve yet", p->path);
            return THAW_EINVAL;
        }
        if (!mtmd_support_vision(mctx)) {
            mtmd_free(mctx);
            set_err(err, errlen, "'%s' has no vision encoder: thaw takes images only", p->path);
            return THAW_EINVAL;
        }
        thaw_vision *v = new (std::nothrow) thaw_vision{mctx, {0}};
        if (!v) {
            mtmd_free(mctx);
            return THAW_ENOMEM;
        }
        memcpy(v->identity, p->identity, sizeof v->identity);
        *out = v;
        return 0;
    } catch (const std::bad_alloc &) {
        return THAW_ENOMEM;
    } catch (const std::exception &e) {
        set_err(err, errlen, "loading '%s': %s", p->path, e.what());
        return THAW_EINVAL;
    }
}

void thaw_vision_free(struct thaw_vision *v)
{
    if (!v)
        return;
    mtmd_free(v->mctx);
    delete v;
}

bool thaw_vision_images(const struct thaw_vision *v) { return v && mtmd_support_vision(v->mctx); }

const char *thaw_vision_marker(void) { return mtmd_default_marker(); }

/* ---- tokenize -------------------------------------------------------------------- */

/* Image i's bytes made a bitmap, after the checks that keep a hostile file
 * cheap: the size, a header stb recognises, the pixel count. NULL with
 * err set. */
static mtmd_bitmap *decode_image(const thaw_vision *v, const thaw_image *img, size_t i, char *err, size_t errlen)
{
    int w = 0, h = 0, comp = 0;

    if (!img->data || img->len == 0) {
        set_err(err, errlen, "image %zu is empty", i + 1);
        return nullptr;
    }
    if (img->len > THAW_VISION_MAX_IMAGE_BYTES) {
        set_err(err, errlen, "image %zu is %zu bytes: the limit is %u MiB", i + 1, img->len,
                THAW_VISION_MAX_IMAGE_BYTES >> 20);
        return nullptr;
    }
    if (!stbi_info_from_memory(img->data, (int)img->len, &w, &h, &comp)) {
        set_err(err, errlen, "image %zu is not an image this server decodes (PNG, JPEG, GIF, BMP, TGA, PSD, PNM): %s",
                i + 1, stbi_failure_reason() ? stbi_failure_reason() : "unknown format");
        return nullptr;
    }
    if (w <= 0 || h <= 0) {
        set_err(err, errlen, "image %zu has no pixels (a corrupt header)", i + 1);
        return nullptr;
    }
    if ((uint64_t)w * (uint64_t)h > THAW_VISION_MAX_PIXELS) {
        set_err(err, errlen, "image %zu is %dx%d pixels: the limit is %u megapixels", i + 1, w, h,
                THAW_VISION_MAX_PIXELS >> 20);
        return nullptr;
    }
    mtmd_helper_bitmap_wrapper bw =
        mtmd_helper_bitmap_init_from_buf(v->mctx, img->data, img->len, false, mtmd_helper_init_opt_default());
    if (!bw.bitmap || mtmd_bitmap_is_audio(bw.bitmap)) {
        if (bw.bitmap)
            mtmd_bitmap_free(bw.bitmap);
        set_err(err, errlen, "image %zu could not be decoded (truncated or corrupt)", i + 1);
        return nullptr;
    }
    return bw.bitmap;
}

int thaw_vision_tokenize(const struct thaw_vision *v, const char *text, const struct thaw_image *images,
                         size_t n_images, llama_token **tokens, int *n_tokens, struct thaw_vision_prompt **out,
                         char *err, size_t errlen)
{
    std::vector<mtmd_bitmap *> bitmaps;
    thaw_vision_prompt *vp = nullptr;
    llama_token *toks = nullptr;
    int rc = THAW_EINVAL;

    *tokens = nullptr;
    *n_tokens = 0;
    *out = nullptr;
    try {
        bitmaps.reserve(n_images);
        for (size_t i = 0; i < n_images; i++) {
            mtmd_bitmap *b = decode_image(v, &images[i], i, err, errlen);
            if (!b)
                goto done;
            bitmaps.push_back(b);
        }
        vp = new thaw_vision_prompt();
        vp->chunks = mtmd_input_chunks_init();
        mtmd_input_text in = {text, strlen(text), true, true};
        int32_t r = mtmd_tokenize(v->mctx, vp->chunks, &in, const_cast<const mtmd_bitmap **>(bitmaps.data()),
                                  bitmaps.size());
        if (r == 1) {
            set_err(err, errlen,
                    "the prompt names %s images than it carries (is '%s' in the text? it stands for an image)",
                    "more or fewer", thaw_vision_marker());
            goto done;
        }
        if (r != 0) {
            set_err(err, errlen, "an image could not be prepared for the projector (error %d)", (int)r);
            goto done;
        }
        size_t n_chunks = mtmd_input_chunks_size(vp->chunks);
        size_t total = 0;
        for (size_t c = 0; c < n_chunks; c++)
            total += mtmd_input_chunk_get_n_tokens(mtmd_input_chunks_get(vp->chunks, c));
        if (total == 0 || total > (size_t)INT32_MAX / 2) {
            set_err(err, errlen, "the prompt is %s", total == 0 ? "empty" : "too long");
            goto done;
        }
        if (!(toks = (llama_token *)malloc((total + 1) * sizeof *toks))) {
            rc = THAW_ENOMEM;
            goto done;
        }
        int n = 0;
        for (size_t c = 0; c < n_chunks; c++) {
            const mtmd_input_chunk *ch = mtmd_input_chunks_get(vp->chunks, c);
            enum mtmd_input_chunk_type ty = mtmd_input_chunk_get_type(ch);
            if (ty == MTMD_INPUT_CHUNK_TYPE_TEXT) {
                size_t nt = 0;
                const llama_token *t = mtmd_input_chunk_get_tokens_text(ch, &nt);
                memcpy(toks + n, t, nt * sizeof *t);
                n += (int)nt;
                continue;
            }
            if (ty != MTMD_INPUT_CHUNK_TYPE_IMAGE) {
                set_err(err, errlen, "only images are taken (not audio)");
                goto done;
            }
            int nt = (int)mtmd_input_chunk_get_n_tokens(ch);
            if (mtmd_input_chunk_get_n_pos(ch) != nt) {
                set_err(err, errlen, "this projector gives an image fewer positions than embeddings (M-RoPE)");
                goto done;
            }
            const char *id = mtmd_input_chunk_get_id(ch);
            if (!id || !*id) { /* libmtmd's helper always names a bitmap by its SHA-256 */
                set_err(err, errlen, "an image has no content id");
                goto done;
            }
            placeholders(v, id, nt, toks + n);
            vp->spans.push_back(vision_span{n, nt, c});
            n += nt;
        }
        *tokens = toks;
        *n_tokens = n;
        *out = vp;
        toks = nullptr;
        vp = nullptr;
        rc = 0;
    } catch (const std::bad_alloc &) {
        rc = THAW_ENOMEM;
    } catch (const std::exception &e) {
        set_err(err, errlen, "the images could not be read: %s", e.what());
        rc = THAW_EINVAL;
    }
done:
    for (mtmd_bitmap *b : bitmaps)
        mtmd_bitmap_free(b);
    free(toks);
    thaw_vision_prompt_free(vp);
    return rc;
}

void thaw_vision_prompt_free(struct thaw_vision_prompt *p)
{
    if (!p)
        return;
    if (p->chunks)
        mtmd_input_chunks_free(p->chunks);
    delete p;
}

int thaw_vision_prompt_count(const struct thaw_vision_prompt *p) { return p ? (int)p->spans.size() : 0; }

int thaw_vision_prompt_at(const struct thaw_vision_prompt *p, int pos)
{
    if (!p)
        return -1;
    for (size_t i = 0; i < p->spans.size(); i++)
        if (p->spans[i].pos == pos)
            return (int)i;
    return -1;
}

void thaw_vision_prompt_span(const struct thaw_vision_prompt *p, int i, int *pos, int *n)
{
    *pos = p->spans[(size_t)i].pos;
    *n = p->spans[(size_t)i].n;
}

int thaw_vision_count_images(const llama_token *tokens, size_t n)
{
    int images = 0;

    for (size_t i = 0; i < n; i++)
        images += tokens[i] < 0 && (i == 0 || tokens[i - 1] >= 0);
    return images;
}

int thaw_vision_prompt_back_off(const struct thaw_vision_prompt *p, int n)
{
    if (!p)
        return n;
    for (const vision_span &s : p->spans)
        if (n > s.pos && n < s.pos + s.n)
            return s.pos;
    return n;
}

/* ---- eval ---------------------------------------------------------------------- */

int thaw_vision_eval(struct thaw_vision *v, struct llama_context *ctx, const struct thaw_vision_prompt *p, int i,
                     llama_seq_id seq, int n_batch)
{
    try {
        const vision_span &s = p->spans[(size_t)i];
        const mtmd_input_chunk *ch = mtmd_input_chunks_get(p->chunks, s.chunk);
        llama_pos new_n_past = 0;
        /* a non-causal image (Gemma 3) must be one micro-batch: libmtmd
         * decodes it n_batch embeddings at a time */
        int nb = n_batch < s.n ? s.n : n_batch;
        int32_t r = mtmd_helper_eval_chunk_single(v->mctx, ctx, ch, s.pos, seq, nb, false, &new_n_past);
        if (r != 0) {
            LOG_ERR("image %d of the prompt: encode or decode failed (%d)", i + 1, (int)r);
            return THAW_ELLAMA;
        }
        return 0;
    } catch (const std::exception &e) {
        LOG_ERR("image %d of the prompt: %s", i + 1, e.what());
        return THAW_ELLAMA;
    }
}
