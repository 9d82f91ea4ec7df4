/* vision.h — images in a prompt: llama.cpp's libmtmd behind a C interface
 * (DESIGN §15).
 *
 * libmtmd is not in the prebuilt libraries: the build compiles it from the
 * fetched source (CMakeLists.txt, thaw_mtmd) and vision.cpp is the one file
 * that includes its headers. Every exception is caught at this boundary.
 *
 * How an image becomes part of a prompt:
 *   1. the request's content names the image where it stands with the
 *      marker (thaw_vision_marker()) in the rendered text, and carries the
 *      image's encoded bytes (struct thaw_image);
 *   2. thaw_vision_tokenize decodes each image (PNG, JPEG, GIF, BMP, ...:
 *      libmtmd's stb), runs the projector's preprocessing and splits the
 *      text at the markers: the prompt comes back as one token array in
 *      which each image holds a run of placeholder tokens, and a
 *      thaw_vision_prompt that knows where each image starts, how many
 *      positions it takes and its content's digest;
 *   3. the engine decodes text as tokens, and at an image's first position
 *      calls thaw_vision_eval: the projector encodes the image and its
 *      embeddings are decoded into the slot's sequence there.
 *
 * Placeholder tokens are negative (never a vocabulary id), 30 bits each of
 * BLAKE2b over (the projector's identity: its file's fingerprint and the
 * image-token settings; the image's SHA-256; the index inside the image)
 * (DESIGN §15): two prompts agree on an image's run only where they hold
 * the same image bytes, seen by the same projector the same way. Every
 * reuse of KV is bounded by a token-array prefix match (the slot's own, a
 * stored state's, a block chain's), so an image's KV is never taken for
 * another's, in a slot, after a restart, or in a shared block. A prefix
 * must never end inside an image either (its positions attend to each
 * other both ways on Gemma 3): thaw_vision_prompt_back_off.
 *
 * Thread safety: a thaw_vision is shared; tokenize may run on any thread at
 * once, eval on the engine thread only (it uses the projector's compute
 * buffers). A thaw_vision_prompt is read-only after tokenize.
 */
#ifndef THAW_VISION_H
#define THAW_VISION_H

#include <llama.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An image as a request carries it: its encoded bytes (data, len: owned by
 * whoever owns the request), or a file:// path to read under --media-path
 * (path, owned) before tokenizing. */
struct thaw_image {
    unsigned char *data;
    size_t len;
    char *path;
    char tag[80]; /* the image in the conversation keys: "sha256:HEX" of the bytes, or for a file:// URL
                   * "file:HEX" (BLAKE2b of its path; its placeholders still pin the bytes read) */
};

/* Most bytes one encoded image may have (a data URL's decoded size, a
 * --media-path file's size). */
#define THAW_VISION_MAX_IMAGE_BYTES (20u << 20)
/* Most pixels a decoded image may have (width x height): checked from the
 * header before anything is decoded (a small PNG can claim gigapixels). */
#define THAW_VISION_MAX_PIXELS (64u << 20)

struct thaw_vision;
struct thaw_vision_prompt;

struct thaw_vision_params {
    const char *path;     /* the projector GGUF (--mmproj) */
    bool offload;         /* run it on the GPU when there is one (--mmproj-offload) */
    int n_threads;        /* CPU threads for the projector */
    int image_min_tokens; /* 0: the projector's own (--image-min-tokens; dynamic-resolution models only) */
    int image_max_tokens; /* 0: the projector's own (--image-max-tokens) */
    bool flash_attn;      /* as the text model's context */
    uint8_t identity[32]; /* the projector's identity for the placeholders: its file's fingerprint
                           * (fingerprint.h) mixed with the image-token settings */
};

/* Loads the projector for `model` (which must outlive it). Returns 0,
 * THAW_EINVAL (the file is not a projector for this model: the reason in
 * err) or THAW_ENOMEM. */
int thaw_vision_new(const struct llama_model *model, const struct thaw_vision_params *p, struct thaw_vision **out,
                    char *err, size_t errlen);
void thaw_vision_free(struct thaw_vision *v);

/* Whether the projector reads images (false: audio only). */
bool thaw_vision_images(const struct thaw_vision *v);
/* The text that stands for one image in a rendered prompt. Static. */
const char *thaw_vision_marker(void);

/* Tokenizes `text` (the rendered prompt, special tokens parsed, BOS as the
 * vocabulary wants) with images[0..n_images), one for each marker in
 * order. Returns 0 with *tokens (malloc'd, *n_tokens of them, placeholders
 * at the images' positions) and *out (the images, freed with
 * thaw_vision_prompt_free); THAW_EINVAL when an image cannot be used (not
 * an image this build decodes, too large, or markers and images disagree:
 * the reason in err, fit for a 400); THAW_ENOMEM. */
int thaw_vision_tokenize(const struct thaw_vision *v, const char *text, const struct thaw_image *images,
                         size_t n_images, llama_token **tokens, int *n_tokens, struct thaw_vision_prompt **out,
                         char *err, size_t errlen);
void thaw_vision_prompt_free(struct thaw_vision_prompt *p);

/* Images in the prompt. */
int thaw_vision_prompt_count(const struct thaw_vision_prompt *p);
/* The image that starts at prompt position pos, or -1. */
int thaw_vision_prompt_at(const struct thaw_vision_prompt *p, int pos);
/* Image i's first position and its positions (*pos, *n). */
void thaw_vision_prompt_span(const struct thaw_vision_prompt *p, int i, int *pos, int *n);
/* n, or the start of the image n falls strictly inside: how far a prefix
 * of the prompt may reach and still end between images. */
int thaw_vision_prompt_back_off(const struct thaw_vision_prompt *p, int n);

/* Images in a token array as thaw stores it (a state's or a manifest's
 * tokens): runs of placeholder tokens, which are negative. Two images with
 * no token between them would count as one; the projectors thaw serves put
 * text around each (Gemma 3: its image-start and image-end tokens). */
int thaw_vision_count_images(const llama_token *tokens, size_t n);

/* Encodes image i and decodes its embeddings into sequence `seq` of ctx at
 * its positions (engine thread), in micro-batches of at most n_batch.
 * Returns 0, THAW_ELLAMA (the encode or decode failed; the sequence may
 * hold part of the image: the caller clears it). */
int thaw_vision_eval(struct thaw_vision *v, struct llama_context *ctx, const struct thaw_vision_prompt *p, int i,
                     llama_seq_id seq, int n_batch);

#ifdef __cplusplus
}
#endif

#endif
