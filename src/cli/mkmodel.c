/* mkmodel.c — `thaw mkmodel`: random-weight GGUF models with a real tokenizer.
 *
 * Map of this file:
 *   ---- prng ----         splitmix64 + xoshiro256**, and the weight sampler
 *   ---- options ----      the flag table (cli/flags.h: parsing and --help
 *                          walk it), validation
 *   ---- vocab ----        finding the vocab GGUF and template files, copying
 *                          the tokenizer.* keys, choosing a chat template
 *   ---- model ----        hyper-parameter keys and the tensor list per arch
 *                          (llama, gemma3, qwen3, gemma4, lfm2, qwen35,
 *                          gpt-oss, deepseek2, bert), and the rank heads
 *                          of --rerank (bert, qwen3)
 *   ---- writer ----       streaming the file: meta, then each tensor's data,
 *                          temp file -> fsync -> rename -> fsync(dir)
 *   ---- main ----         thaw_mkmodel_main()
 *
 * Why the file is written by hand after the meta block: gguf_write_to_file()
 * wants every tensor's data in memory at once (0.8 GB for the benchmark
 * shape). gguf_get_meta_data() gives the header, KV pairs and tensor infos
 * (already padded to the alignment); the data section is then produced one
 * chunk at a time in the order and at the offsets gguf recorded, each tensor
 * padded with zeros to the alignment, exactly as gguf's own writer lays it
 * out. Peak memory is the vocab's metadata plus one write buffer.
 *
 * Determinism: every tensor has its own PRNG stream seeded from (--seed,
 * tensor name), the sampler uses only integer ops and exact float ops, and no
 * key holds a time or a path, so the same flags give the same bytes. (A
 * tensor's values also do not depend on the other flags except its shape, so
 * blk.0 of a 2-layer and a 12-layer model with the same width is identical.)
 *
 * Adding an architecture: a row in mk_archs[], its keys in mk_set_hparams()
 * and its tensors in mk_add_tensors(), read off llama.cpp's
 * src/models/<arch>.cpp (load_arch_hparams: every get_key without `false`
 * is required; load_arch_tensors: every create_tensor without
 * TENSOR_NOT_REQUIRED). libllama also refuses a file with a tensor it did
 * not ask for, so optional tensors are written only where they are used.
 */
#include "cli/mkmodel.h"

#include "base/error.h"
#include "cli/flags.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ggml.h>
#include <gguf.h>
#include <llama.h>

#define MK_VOCAB_SUBDIR ".deps/llama.cpp/models"
#define MK_TMPL_SUBDIR "templates" /* of the vocab dir: the real models' Jinja templates */
#define MK_TMPL_MAX (1u << 20)     /* bytes: --chat-template-file limit */
#define MK_LFM2_L_CACHE 3          /* lfm2 short-convolution kernel, tokens (LFM2's value) */
#define MK_MAX_LAYERS 512 /* LLAMA_MAX_LAYERS in llama.cpp v0.4.0 */
#define MK_CHUNK 16384    /* elements generated per step (64 KiB of f32) */
#define MK_WBUF (4u << 20) /* bytes buffered before each write(2) */
/* --mmproj's vision encoder (gemma3): image side, patch side, width, feed-
 * forward width (not the width: clip.cpp takes ffn_down as swapped when its
 * ne0 is the width), heads, layers, and the average pooling's kernel, which
 * leaves (64 / 4 / 4)^2 = 16 tokens per image */
#define MK_V_IMAGE 64
#define MK_V_PATCH 4
#define MK_V_EMBD 64
#define MK_V_FF 128
#define MK_V_HEADS 4
#define MK_V_LAYERS 2
#define MK_V_MERGE 4
#define MK_V_TOKENS 16
/* LFM2-VL's projector (lfm2): the same encoder, then a pixel unshuffle of
 * 2x2 patches into one token and an MLP; images take their own size
 * (aligned to 8 pixels), 64 to 256 tokens each (clip.cpp's limits for it) */
#define MK_V_LFM2_MERGE 2

/* ---- prng ----------------------------------------------------------------- */

struct mk_rng {
    uint64_t s[4];
};

static uint64_t mk_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t mk_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna). */
static uint64_t mk_rng_next(struct mk_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = mk_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = mk_rotl(s[3], 45);
    return out;
}

/* One stream per tensor: seed mixed with the FNV-1a hash of its name. */
static void mk_rng_init(struct mk_rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = mk_splitmix64(&x);
}

/* n samples, mean 0, standard deviation `std`, bell-shaped: the sum of four
 * 16-bit uniforms (Irwin-Hall, n=4) from one 64-bit draw, so a weight is
 * bounded by +-3.46 std. Integer sums and exact float ops only: the same
 * seed gives the same bits on every IEEE machine, unlike a libm Box-Muller. */
static void mk_sample(struct mk_rng *r, float *out, size_t n, float std)
{
    /* Var(sum of 4 U[0,65536)) = 4 * 65536^2 / 12, so this scale gives `std` */
    const float scale = std * sqrtf(3.0f) / 65536.0f;

    for (size_t i = 0; i < n; i++) {
        uint64_t v = mk_rng_next(r);
        uint32_t sum = (uint32_t)(v & 0xffff) + (uint32_t)((v >> 16) & 0xffff) +
                       (uint32_t)((v >> 32) & 0xffff) + (uint32_t)(v >> 48);
        /* each term is uniform on 0..65535, mean 32767.5: centre the sum */
        out[i] = ((float)sum - 131070.0f) * scale;
    }
}

/* ---- options -------------------------------------------------------------- */

enum mk_arch {
    MK_ARCH_LLAMA,
    MK_ARCH_GEMMA3,
    MK_ARCH_QWEN3,
    MK_ARCH_GEMMA4,
    MK_ARCH_LFM2,
    MK_ARCH_QWEN35,
    MK_ARCH_GPTOSS,
    MK_ARCH_DEEPSEEK2,
    MK_ARCH_BERT
};

/* What the flags, the vocab and the template choice need to know of an
 * architecture; the hparams and tensors are in ---- model ----. */
static const struct mk_arch_info {
    const char *name;   /* general.architecture and the hparam key prefix */
    const char *vocab;  /* default --vocab NAME */
    const char *family; /* MK_TMPL_SUBDIR/ file --template auto embeds; NULL: built-ins */
    uint32_t min_layers;
    bool swa;           /* takes --swa-window / --swa-pattern */
    bool hybrid;        /* takes --attn-pattern */
} mk_archs[] = {
    [MK_ARCH_LLAMA] = { "llama", "llama-bpe", NULL, 1, false, false },
    [MK_ARCH_GEMMA3] = { "gemma3", "llama-bpe", NULL, 1, true, false },
    [MK_ARCH_QWEN3] = { "qwen3", "qwen2", "Qwen-Qwen3-0.6B.jinja", 1, false, false },
    /* libllama asserts two KV layers (its KV-sharing hook) */
    [MK_ARCH_GEMMA4] = { "gemma4", "gemma-4", "google-gemma-4-31B-it.jinja", 2, true, false },
    /* LFM2.5-Instruct is the dense lfm2 family's (LFM2-8B-A1B's is lfm2moe's);
     * at least one short-conv and one attention layer */
    [MK_ARCH_LFM2] = { "lfm2", "qwen2", "LFM2.5-Instruct.jinja", 2, false, true },
    /* Qwen3.5's own tokenizer and template; gated delta-net layers with a
     * full-attention layer every --attn-pattern (its full_attention_interval) */
    [MK_ARCH_QWEN35] = { "qwen35", "qwen35", "Qwen3.5-4B.jinja", 2, false, true },
    /* the source tree has no o200k vocab: llama-bpe's tokenizer, and the
     * built-in template that vocab renders (Harmony's markers would be text) */
    [MK_ARCH_GPTOSS] = { "gpt-oss", "llama-bpe", NULL, 1, true, false },
    /* DeepSeek V2's own tokenizer (DeepSeek LLM's, 102400 tokens) and the
     * template it carries; a dense leading layer, then MoE layers */
    [MK_ARCH_DEEPSEEK2] = { "deepseek2", "deepseek-llm", NULL, 2, false, false },
    /* an encoder for thaw serve --embedding (bge-small's shape and its
     * WordPiece vocab): no KV cache, bidirectional attention, CLS pooling */
    [MK_ARCH_BERT] = { "bert", "bert-bge", NULL, 1, false, false },
};
#define MK_N_ARCHS (sizeof mk_archs / sizeof mk_archs[0])

enum mk_template { MK_TMPL_AUTO, MK_TMPL_VOCAB, MK_TMPL_LLAMA3, MK_TMPL_CHATML, MK_TMPL_GEMMA };

struct mk_opts {
    enum mk_arch arch;
    const char *vocab;    /* as given (path or name), NULL: default */
    enum mk_template tmpl;
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;   /* 0 until defaulted */
    uint32_t n_ff;        /* 0 until defaulted */
    uint32_t n_swa;       /* gemma3, gemma4: window in tokens */
    uint32_t swa_pattern; /* gemma3, gemma4: period; UINT32_MAX until defaulted */
    uint32_t attn_pattern; /* lfm2: period of attention layers; UINT32_MAX until defaulted */
    uint32_t n_expert;    /* gpt-oss: experts per layer; 0 until defaulted */
    uint32_t n_ctx_train;
    uint64_t seed;
    enum ggml_type wtype; /* of the weight matrices as generated (f16 when quantizing) */
    int ftype;            /* --type's llama_ftype when quantized (a MK_QUANTS row), -1: none */
    const char *out;
    const char *tmpl_file; /* --chat-template-file, NULL: none */
    const char *tmpl_text; /* its contents, read by thaw_mkmodel_main() */
    bool help;
    bool set_swa;         /* --swa-window / --swa-pattern given: SWA archs only */
    bool set_attn;        /* --attn-pattern given: lfm2 only */
    bool set_swa_window;  /* --swa-window given (gpt-oss defaults to 128) */
    bool set_tmpl;        /* --template or --draft-of given */
    bool rerank;          /* --rerank: a rank head and pooling rank (bert, qwen3) */
    const char *mmproj;   /* --mmproj: also write a vision projector there (gemma3, lfm2); NULL = none */
};

/* Strict unsigned parse: whole string, no sign, no overflow, in [lo, hi]. */
static int mk_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v;

    if (s == NULL || *s == '\0' || *s == '-' || *s == '+' || *s == ' ')
        return THAW_EINVAL;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return THAW_EINVAL;
    *out = (uint64_t)v;
    return 0;
}

static int mk_parse_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi,
                        uint32_t *out)
{
    uint64_t v = 0;

    if (mk_parse_u64(s, lo, hi, &v) != 0) {
        fprintf(stderr, "mkmodel: %s: expected an integer in %" PRIu32 "..%" PRIu32
                        ", got '%s'\n", flag, lo, hi, s ? s : "");
        return THAW_EINVAL;
    }
    *out = (uint32_t)v;
    return 0;
}

/* ---- the flag table: each flag's value, then --help's text ---- */

#define MK_STR2(x) #x
#define MK_STR(x) MK_STR2(x)
#define MK_OFF(f) offsetof(struct mk_opts, f)

/* --layers, --embd, ...: a whole number in [f->min, f->max], decimal or 0x-hex */
static int mk_fn_u32(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    struct mk_opts *o = dst;

    if (!strcmp(flag, "--swa-window"))
        o->set_swa = o->set_swa_window = true;
    else if (!strcmp(flag, "--swa-pattern"))
        o->set_swa = true;
    else if (!strcmp(flag, "--attn-pattern"))
        o->set_attn = true;
    return mk_parse_u32(flag, val, (uint32_t)f->min, (uint32_t)f->max, (uint32_t *)((char *)dst + f->off));
}

static int mk_fn_arch(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    struct mk_opts *o = dst;

    (void)f, (void)flag;
    for (size_t k = 0; k < MK_N_ARCHS; k++)
        if (strcmp(val, mk_archs[k].name) == 0) {
            o->arch = (enum mk_arch)k;
            return 0;
        }
    fprintf(stderr,
            "mkmodel: --arch: expected llama, gemma3, qwen3, gemma4, "
            "lfm2, qwen35, gpt-oss, deepseek2 or bert, got '%s'\n",
            val);
    return THAW_EINVAL;
}

/* a draft for TARGET: its tokenizer and chat template, byte for byte */
static int mk_fn_draft_of(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    struct mk_opts *o = dst;

    (void)f, (void)flag;
    if (*val == '\0') {
        fprintf(stderr, "mkmodel: --draft-of: empty value\n");
        return THAW_EINVAL;
    }
    o->vocab = val;
    o->tmpl = MK_TMPL_VOCAB;
    o->set_tmpl = true;
    return 0;
}

static int mk_fn_template(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    static const struct {
        const char *name;
        enum mk_template t;
    } names[] = {
        {"auto", MK_TMPL_AUTO},     {"vocab", MK_TMPL_VOCAB}, {"llama3", MK_TMPL_LLAMA3},
        {"chatml", MK_TMPL_CHATML}, {"gemma", MK_TMPL_GEMMA},
    };
    struct mk_opts *o = dst;

    (void)f, (void)flag;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (strcmp(val, names[k].name) == 0) {
            o->tmpl = names[k].t;
            o->set_tmpl = true;
            return 0;
        }
    fprintf(stderr,
            "mkmodel: --template: expected auto, vocab, llama3, "
            "chatml or gemma, got '%s'\n",
            val);
    return THAW_EINVAL;
}

static int mk_fn_seed(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    struct mk_opts *o = dst;

    (void)f, (void)flag;
    if (mk_parse_u64(val, 0, UINT64_MAX, &o->seed) != 0) {
        fprintf(stderr,
                "mkmodel: --seed: expected an unsigned 64-bit integer, "
                "got '%s'\n",
                val);
        return THAW_EINVAL;
    }
    return 0;
}

/* --type's quantized kinds: the file is generated in f16, then libllama's
 * own quantizer (llama_model_quantize, what llama-quantize runs) writes it,
 * so the bytes are laid out as a real quantized model's are, with its
 * per-tensor choices (output and embeddings, tensors too narrow for a
 * block). The kinds people run, not every one libllama knows. */
static const struct {
    const char *name;
    int ftype; /* enum llama_ftype */
} MK_QUANTS[] = {
    {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
    {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
    {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"bf16", LLAMA_FTYPE_MOSTLY_BF16},
};
#define MK_N_QUANTS (sizeof MK_QUANTS / sizeof MK_QUANTS[0])

static const char *mk_type_name(const struct mk_opts *o)
{
    for (size_t i = 0; i < MK_N_QUANTS; i++)
        if (MK_QUANTS[i].ftype == o->ftype)
            return MK_QUANTS[i].name;
    return o->wtype == GGML_TYPE_F16 ? "f16" : "f32";
}

static int mk_fn_type(void *dst, const struct thaw_flag *f, const char *flag, const char *val)
{
    struct mk_opts *o = dst;

    (void)f, (void)flag;
    o->ftype = -1;
    o->wtype = GGML_TYPE_F16;
    if (strcmp(val, "f16") == 0)
        return 0;
    if (strcmp(val, "f32") == 0) {
        o->wtype = GGML_TYPE_F32;
        return 0;
    }
    for (size_t i = 0; i < MK_N_QUANTS; i++) {
        if (strcasecmp(val, MK_QUANTS[i].name) == 0) {
            o->ftype = MK_QUANTS[i].ftype;
            return 0;
        }
    }
    fprintf(stderr, "mkmodel: --type: expected f16, f32, q8_0, q6_k, q5_k_m, q4_k_m, q4_0 or bf16, got '%s'\n", val);
    return THAW_EINVAL;
}

#define MK_U32(names, arg, field, lo, hi, help)                                                                        \
    {                                                                                                                  \
        names, arg, THAW_FLAG_FN, MK_OFF(field), lo, hi, help, mk_fn_u32                                               \
    }
#define MK_FN(names, arg, fn, help)                                                                                    \
    {                                                                                                                  \
        names, arg, THAW_FLAG_FN, 0, 0, 0, help, fn                                                                    \
    }

static const struct thaw_flag mk_flags[] = {
    {"-o,--output", "FILE", THAW_FLAG_STR, MK_OFF(out), 0, 0,
     "where to write (required); written to a temp file\n"
     "next to it, fsynced, then renamed into place",
     NULL},
    MK_FN("--arch", "NAME", mk_fn_arch,
          "the architecture (default llama); each has its default vocab:\n"
          "  llama   plain attention                llama-bpe\n"
          "  gemma3  SWA layers, q/k norms, output\n"
          "          tied to the embedding          llama-bpe\n"
          "  qwen3   q/k norms, output tied         qwen2\n"
          "  gemma4  SWA layers, q/k/v norms, GELU,\n"
          "          unscaled attention, tied       gemma-4\n"
          "  lfm2    hybrid: gated short-convolution\n"
          "          (recurrent state) layers and\n"
          "          attention layers, tied         qwen2\n"
          "  qwen35  hybrid (Qwen3.5): gated delta-net\n"
          "          (recurrent state) layers and\n"
          "          gated attention layers, tied   qwen35\n"
          "  gpt-oss SWA layers (window 128, every\n"
          "          2nd global), attention sinks,\n"
          "          MoE feed-forward               llama-bpe\n"
          "  deepseek2 MLA attention (a K-only latent\n"
          "          KV cache: rank 64 + 32 rope\n"
          "          dims), 1 dense layer, then MoE\n"
          "          with a shared expert           deepseek-llm\n"
          "  bert    encoder for embeddings (thaw serve\n"
          "          --embedding): bidirectional, no KV\n"
          "          cache, CLS pooling             bert-bge"),
    {"--vocab", "FILE|NAME", THAW_FLAG_STR, MK_OFF(vocab), 0, 0,
     "vocab GGUF to take the tokenizer from (default: the\n"
     "arch's); a NAME (no '/', no .gguf) means\n"
     "<vocab dir>/ggml-vocab-NAME.gguf. The vocab dir:\n"
     "$THAW_VOCAB_DIR if set, else the first\n" MK_VOCAB_SUBDIR "/ found walking up from the\n"
     "thaw executable, then from the current directory",
     NULL},
    MK_FN("--draft-of", "FILE", mk_fn_draft_of,
          "make a draft model for FILE: take its tokenizer and\n"
          "chat template (same as --vocab FILE --template vocab)"),
    MK_FN("--template", "NAME", mk_fn_template,
          "chat template: auto | vocab | llama3 | chatml | gemma\n"
          "(default auto). auto: qwen3, gemma4, lfm2, qwen35 embed\n"
          "their family's real template from <vocab dir>/" MK_TMPL_SUBDIR "/\n"
          "(Qwen-Qwen3-0.6B, google-gemma-4-31B-it,\n"
          "LFM2.5-Instruct, Qwen3.5-4B .jinja), or the vocab's own\n"
          "if that file is missing, else chatml. llama, gemma3: the\n"
          "vocab's own if llama_chat_apply_template() renders it;\n"
          "else gemma for gemma3; for llama, llama3 if the vocab\n"
          "has <|start_header_id|>, else chatml.\n"
          "vocab: the vocab's own, whatever it is"),
    {"--chat-template-file", "FILE", THAW_FLAG_STR, MK_OFF(tmpl_file), 0, 0,
     "embed FILE's text (Jinja, up to 1 MiB) as\n"
     "tokenizer.chat_template instead; excludes --template\n"
     "and --draft-of",
     NULL},
    MK_U32("--layers", "N", n_layer, 1, MK_MAX_LAYERS,
           "blocks, 1.." MK_STR(MK_MAX_LAYERS) " (gemma4, lfm2, qwen35, deepseek2: 2..)\n"
                                               "(default 2)"),
    MK_U32("--embd", "N", n_embd, 2, 65536, "model width (default 64)"),
    MK_U32("--heads", "N", n_head, 1, 4096,
           "attention heads; the head size embd/heads must be\n"
           "even (default 4)"),
    MK_U32("--kv-heads", "N", n_head_kv, 1, 4096,
           "KV heads (GQA), must divide heads (default heads/2,\n"
           "heads if odd)"),
    MK_U32("--ff", "N", n_ff, 1, 1u << 20, "feed-forward width (default 4*embd)"),
    MK_U32("--swa-window", "N", n_swa, 1, 1u << 24,
           "gemma3, gemma4, gpt-oss: sliding window, tokens\n"
           "(default 32; gpt-oss 128)"),
    MK_U32("--swa-pattern", "N", swa_pattern, 0, MK_MAX_LAYERS,
           "gemma3, gemma4, gpt-oss: every Nth layer is global,\n"
           "the rest SWA; 0 = all SWA (gemma4: not 1)\n"
           "(default 6, gpt-oss 2, or max(2, layers) if fewer)"),
    MK_U32("--moe-experts", "N", n_expert, 2, 64,
           "gpt-oss, deepseek2: experts per MoE layer, 2..64;\n"
           "each token uses 2 of them, each --ff wide (default 4)"),
    MK_U32("--attn-pattern", "N", attn_pattern, 2, MK_MAX_LAYERS,
           "lfm2, qwen35: every Nth layer is attention, the\n"
           "rest short-convolution (lfm2) or gated delta-net\n"
           "(qwen35); 2..layers (default 3, qwen35 4, or layers\n"
           "if fewer)"),
    MK_U32("--ctx-train", "N", n_ctx_train, 16, 1u << 24, "trained context length, tokens (default 8192)"),
    {"--rerank", NULL, THAW_FLAG_TRUE, MK_OFF(rerank), 0, 0,
     "a reranker for thaw serve --rerank (pooling rank):\n"
     "bert: a classification head (cls, cls.output: one\n"
     "score); qwen3: Qwen3-Reranker style, cls.output with\n"
     "labels yes/no (the score is p(yes)) and a rerank\n"
     "prompt template (tokenizer.chat_template.rerank)",
     NULL},
    {"--mmproj", "OUT", THAW_FLAG_STR, MK_OFF(mmproj), 0, 0,
     "also write a vision projector for the model to OUT\n"
     "(gemma3 and lfm2): a SigLIP encoder, random weights,\n"
     "made small: " MK_STR(MK_V_PATCH) "x" MK_STR(MK_V_PATCH) " patches, " MK_STR(MK_V_LAYERS) " layers x " MK_STR(MK_V_EMBD) ". gemma3\n"
     "(clip.projector_type gemma3): " MK_STR(MK_V_IMAGE) "x" MK_STR(MK_V_IMAGE) " pixels pooled to\n"
     MK_STR(MK_V_TOKENS) " tokens per image; lfm2 (LFM2-VL's, a hybrid's):\n"
     "each image at its own size, 2x2 patches a token, 64 to\n"
     "256 tokens; both projected to --embd.\n"
     "thaw serve --mmproj OUT takes images with it",
     NULL},
    MK_FN("--seed", "N", mk_fn_seed, "PRNG seed, decimal or 0x-hex (default 1)"),
    MK_FN("--type", "T", mk_fn_type,
          "the weight matrices: f16 | f32, or quantized by\n"
          "libllama's quantizer (as llama-quantize) from the f16\n"
          "weights: q8_0 | q6_k | q5_k_m | q4_k_m | q4_0 | bf16;\n"
          "norms stay f32 (default f16). A --mmproj projector\n"
          "stays f16 whatever the model's type"),
};

#define MK_HELP_WIDTH 25 /* "--chat-template-file FILE" */

static const struct thaw_flags mk_flag_table = {
    .prog = "mkmodel",
    .see = "thaw mkmodel",
    .flags = mk_flags,
    .n_flags = sizeof mk_flags / sizeof mk_flags[0],
    .width = MK_HELP_WIDTH,
};

/* --help: the text around mk_flags[], which describes each flag */
static void mk_usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: thaw %s -o OUT.gguf [flags]\n"
            "\n"
            "Write a GGUF model with random weights and a real tokenizer (the\n"
            "tokenizer.* keys of a vocab-only GGUF). llama.cpp loads and decodes it\n"
            "like a real model of the same shape; its output is gibberish. The same\n"
            "flags and seed give a byte-identical file.\n"
            "\n",
            prog);
    thaw_flags_usage(f, &mk_flag_table, NULL, NULL, NULL);
    fprintf(f, "  %-*s  %s\n", MK_HELP_WIDTH, "-h,--help", "this text");
    fprintf(f, "\n"
               "thaw serve renders the embedded template with Jinja. With --no-jinja it\n"
               "uses llama_chat_apply_template(), which recognises template families by\n"
               "marker strings: one it does not know (gemma4's) then needs serve's\n"
               "--chat-template NAME; mkmodel notes when that is the case.\n"
               "\n"
               "Flags take their value as the next argument or after '='.\n"
               "Exit status: 0 written, 1 failed (nothing left behind), 2 bad usage.\n");
}

/* Fills *o from argv. Returns 0 (o->help set for --help) or THAW_EINVAL
 * after printing why. */
static int mk_parse(int argc, char **argv, struct mk_opts *o)
{
    int rc;

    memset(o, 0, sizeof *o);
    o->arch = MK_ARCH_LLAMA;
    o->tmpl = MK_TMPL_AUTO;
    o->n_layer = 2;
    o->n_embd = 64;
    o->n_head = 4;
    o->n_swa = 32;
    o->swa_pattern = UINT32_MAX;
    o->attn_pattern = UINT32_MAX;
    o->n_ctx_train = 8192;
    o->seed = 1;
    o->wtype = GGML_TYPE_F16;
    o->ftype = -1;

    rc = thaw_flags_parse(&mk_flag_table, o, argc, argv);
    if (rc == 1) {
        o->help = true;
        return 0;
    }
    if (rc != 0)
        return THAW_EINVAL;

    /* ---- cross-flag checks and defaults that depend on other flags ---- */
    if (o->out == NULL) {
        fprintf(stderr, "mkmodel: -o OUT.gguf is required (see --help)\n");
        return THAW_EINVAL;
    }
    if (!mk_archs[o->arch].swa && o->set_swa) {
        fprintf(stderr, "mkmodel: --swa-window/--swa-pattern apply to --arch gemma3, "
                        "gemma4 and gpt-oss only\n");
        return THAW_EINVAL;
    }
    if (o->arch != MK_ARCH_GPTOSS && o->arch != MK_ARCH_DEEPSEEK2 && o->n_expert != 0) {
        fprintf(stderr, "mkmodel: --moe-experts applies to --arch gpt-oss and deepseek2 only\n");
        return THAW_EINVAL;
    }
    if (o->arch == MK_ARCH_DEEPSEEK2) {
        if (o->n_expert == 0)
            o->n_expert = 4;
        /* MLA is MQA over the latent: one KV head whatever --heads says */
        if (o->n_head_kv > 1) {
            fprintf(stderr, "mkmodel: --arch deepseek2 has one KV head (the MLA latent)\n");
            return THAW_EINVAL;
        }
        o->n_head_kv = 1;
    }
    if (o->arch == MK_ARCH_GPTOSS) {
        if (o->n_expert == 0)
            o->n_expert = 4;
        if (!o->set_swa_window)
            o->n_swa = 128; /* gpt-oss's own window */
        if (o->swa_pattern == UINT32_MAX)
            o->swa_pattern = 2; /* alternating, as libllama defaults it */
    }
    if (o->rerank && o->arch != MK_ARCH_BERT && o->arch != MK_ARCH_QWEN3) {
        fprintf(stderr, "mkmodel: --rerank applies to --arch bert and qwen3 only\n");
        return THAW_EINVAL;
    }
    if (o->arch == MK_ARCH_BERT) {
        /* bert's q, k, v are all embd wide (libllama's bert.cpp) */
        if (o->n_head_kv != 0 && o->n_head_kv != o->n_head) {
            fprintf(stderr, "mkmodel: --arch bert has as many KV heads as heads\n");
            return THAW_EINVAL;
        }
        o->n_head_kv = o->n_head;
    }
    if (!mk_archs[o->arch].hybrid && o->set_attn) {
        fprintf(stderr, "mkmodel: --attn-pattern applies to --arch lfm2 and qwen35 only\n");
        return THAW_EINVAL;
    }
    if (o->mmproj != NULL && o->arch != MK_ARCH_GEMMA3 && o->arch != MK_ARCH_LFM2) {
        fprintf(stderr, "mkmodel: --mmproj writes a Gemma 3 or an LFM2-VL projector: it needs --arch gemma3 or lfm2\n");
        return THAW_EINVAL;
    }
    if (o->mmproj != NULL && strcmp(o->mmproj, o->out) == 0) {
        fprintf(stderr, "mkmodel: --mmproj must name another file than -o\n");
        return THAW_EINVAL;
    }
    if (o->tmpl_file != NULL && o->set_tmpl) {
        fprintf(stderr, "mkmodel: --chat-template-file excludes --template and --draft-of\n");
        return THAW_EINVAL;
    }
    if (o->n_layer < mk_archs[o->arch].min_layers) {
        fprintf(stderr, "mkmodel: --arch %s needs --layers %" PRIu32 " or more\n",
                mk_archs[o->arch].name, mk_archs[o->arch].min_layers);
        return THAW_EINVAL;
    }
    if (o->n_head > o->n_embd || o->n_embd % o->n_head != 0) {
        fprintf(stderr, "mkmodel: --embd %" PRIu32 " is not a multiple of --heads %" PRIu32
                        "\n", o->n_embd, o->n_head);
        return THAW_EINVAL;
    }
    if ((o->n_embd / o->n_head) % 2 != 0) {
        fprintf(stderr, "mkmodel: head size embd/heads = %" PRIu32 " must be even (RoPE "
                        "rotates pairs)\n", o->n_embd / o->n_head);
        return THAW_EINVAL;
    }
    if (o->n_head_kv == 0)
        o->n_head_kv = o->n_head % 2 == 0 ? o->n_head / 2 : o->n_head;
    if (o->n_head_kv > o->n_head || o->n_head % o->n_head_kv != 0) {
        fprintf(stderr, "mkmodel: --kv-heads %" PRIu32 " must divide --heads %" PRIu32 "\n",
                o->n_head_kv, o->n_head);
        return THAW_EINVAL;
    }
    if (o->n_ff == 0) {
        if ((uint64_t)o->n_embd * 4 > (1u << 20)) {
            fprintf(stderr, "mkmodel: default --ff 4*embd is too large; pass --ff\n");
            return THAW_EINVAL;
        }
        o->n_ff = o->n_embd * 4;
    }
    if (o->swa_pattern == UINT32_MAX) {
        uint32_t p = o->n_layer < 2 ? 2 : o->n_layer;
        o->swa_pattern = p < 6 ? p : 6;
    }
    if (o->arch == MK_ARCH_GEMMA4 && o->swa_pattern == 1) {
        /* libllama asserts a gemma4 model has an SWA layer */
        fprintf(stderr, "mkmodel: --swa-pattern 1 makes every layer global; gemma4 needs "
                        "an SWA layer\n");
        return THAW_EINVAL;
    }
    if (o->attn_pattern == UINT32_MAX) {
        uint32_t p = o->arch == MK_ARCH_QWEN35 ? 4 : 3; /* Qwen3.5's full_attention_interval */
        o->attn_pattern = o->n_layer < p ? o->n_layer : p;
    }
    if (mk_archs[o->arch].hybrid && o->attn_pattern > o->n_layer) {
        fprintf(stderr, "mkmodel: --attn-pattern %" PRIu32 " leaves no attention layer in "
                        "%" PRIu32 " layers\n", o->attn_pattern, o->n_layer);
        return THAW_EINVAL;
    }
    if (mk_archs[o->arch].swa && o->n_swa >= o->n_ctx_train) {
        fprintf(stderr, "mkmodel: --swa-window %" PRIu32 " must be below --ctx-train %" PRIu32
                        "\n", o->n_swa, o->n_ctx_train);
        return THAW_EINVAL;
    }
    return 0;
}

/* ---- vocab ---------------------------------------------------------------- */

/* The templates written when the vocab has none (or --template asks). Each
 * holds the marker llama_chat_apply_template() detects it by
 * (<|start_header_id|>, <|im_start|>, <start_of_turn>), so the C API and a
 * Jinja engine render the same prompt. Gemma has no system role: a system
 * message is prepended to the first user turn, as llama.cpp's built-in does. */
static const char mk_tmpl_llama3[] =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}";

static const char mk_tmpl_chatml[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";

/* --rerank on qwen3: the (query, document) prompt of a Qwen3-Reranker
 * style model; llama-server substitutes {query} and {document} and
 * tokenizes the result with special tokens, as thaw does. */
static const char mk_tmpl_qwen3_rerank[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements of the Query. "
    "Answer only \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";

static const char mk_tmpl_gemma[] =
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] | trim + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set first_user_prefix = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<start_of_turn>model\\n' }}"
    "{%- endif %}";

static bool mk_is_file(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Looks for <dir>/MK_VOCAB_SUBDIR/<file> in `start` and up to 5 parents.
 * On success writes the path to out and returns 0; THAW_ENOTFOUND if none. */
static int mk_find_up(const char *start, const char *file, char *out, size_t cap)
{
    char dir[PATH_MAX];
    size_t n = strlen(start);

    if (n == 0 || n >= sizeof dir)
        return THAW_ENOTFOUND;
    memcpy(dir, start, n + 1);
    for (int up = 0; up <= 5; up++) {
        int w = snprintf(out, cap, "%s/%s/%s", dir, MK_VOCAB_SUBDIR, file);
        char *slash;

        if (w > 0 && (size_t)w < cap && mk_is_file(out))
            return 0;
        slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir)
            break;
        *slash = '\0';
    }
    return THAW_ENOTFOUND;
}

/* Finds `file` (a path relative to the vocab dir: ggml-vocab-NAME.gguf, or
 * MK_TMPL_SUBDIR/NAME.jinja) in the vocab dir: $THAW_VOCAB_DIR alone when it
 * is set, else MK_VOCAB_SUBDIR above the executable, above the current
 * directory, then next to the build's llama install. Writes the path to
 * out[cap]. Returns 0, or THAW_ENOTFOUND (nothing printed). */
static int mk_find_data(const char *file, char *out, size_t cap)
{
    char exe[PATH_MAX];
    char cwd[PATH_MAX];
    const char *env = getenv("THAW_VOCAB_DIR");
    ssize_t n;
    int w;

    if (env != NULL && *env != '\0') {
        w = snprintf(out, cap, "%s/%s", env, file);
        return w > 0 && (size_t)w < cap && mk_is_file(out) ? 0 : THAW_ENOTFOUND;
    }
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        char *slash;

        exe[n] = '\0';
        slash = strrchr(exe, '/');
        if (slash != NULL && slash != exe) {
            *slash = '\0';
            if (mk_find_up(exe, file, out, cap) == 0)
                return 0;
        }
    }
    if (getcwd(cwd, sizeof cwd) != NULL && mk_find_up(cwd, file, out, cap) == 0)
        return 0;
#ifdef THAW_LLAMA_LIB_DIR
    /* the build's llama install: <repo>/.deps/llama/lib -> <repo>/.deps/llama.cpp */
    w = snprintf(out, cap, "%s/../../llama.cpp/models/%s", THAW_LLAMA_LIB_DIR, file);
    if (w > 0 && (size_t)w < cap && mk_is_file(out))
        return 0;
#endif
    return THAW_ENOTFOUND;
}

/* Resolves --vocab (a path, or a NAME meaning ggml-vocab-NAME.gguf; NULL:
 * the arch's default NAME) to a readable file path in out[cap]. Returns 0 or
 * THAW_ENOTFOUND after printing where it looked. */
static int mk_resolve_vocab(const char *arg, enum mk_arch arch, char *out, size_t cap)
{
    const char *name = arg ? arg : mk_archs[arch].vocab;
    size_t len = strlen(name);
    char file[256];
    const char *env = getenv("THAW_VOCAB_DIR");
    int w;

    if (strchr(name, '/') != NULL || (len > 5 && strcmp(name + len - 5, ".gguf") == 0)) {
        if (!mk_is_file(name)) {
            fprintf(stderr, "mkmodel: --vocab %s: no such file\n", name);
            return THAW_ENOTFOUND;
        }
        w = snprintf(out, cap, "%s", name);
        return w > 0 && (size_t)w < cap ? 0 : THAW_ENOTFOUND;
    }
    w = snprintf(file, sizeof file, "ggml-vocab-%s.gguf", name);
    if (w <= 0 || (size_t)w >= sizeof file) {
        fprintf(stderr, "mkmodel: --vocab: name too long\n");
        return THAW_EINVAL;
    }
    if (mk_find_data(file, out, cap) == 0)
        return 0;
    if (env != NULL && *env != '\0')
        fprintf(stderr, "mkmodel: vocab %s not found in THAW_VOCAB_DIR=%s\n", file, env);
    else
        fprintf(stderr, "mkmodel: vocab %s not found under " MK_VOCAB_SUBDIR "/ above the "
                        "executable or the current directory; pass --vocab FILE or set "
                        "THAW_VOCAB_DIR\n", file);
    return THAW_ENOTFOUND;
}

/* Reads a whole chat template file into a NUL-terminated *out (caller
 * frees). Returns 0, -errno, THAW_ENOMEM, or THAW_EINVAL when the file is
 * empty, over MK_TMPL_MAX bytes or holds a NUL byte (a GGUF string could
 * carry it, but every C string the template passes through would be cut
 * short there). */
static int mk_read_text(const char *path, char **out)
{
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    int fd, rc = 0;

    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = S_ISDIR(st.st_mode) ? -EISDIR : THAW_EINVAL;
        goto out_close;
    }
    if (st.st_size <= 0 || (uint64_t)st.st_size > MK_TMPL_MAX) {
        rc = THAW_EINVAL;
        goto out_close;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        rc = THAW_ENOMEM;
        goto out_close;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            goto out_free;
        }
        if (n == 0)
            break; /* shrank under us: take what is there */
        got += (size_t)n;
    }
    buf[got] = '\0';
    if (got == 0 || memchr(buf, '\0', got) != NULL) {
        rc = THAW_EINVAL;
        goto out_free;
    }
    *out = buf;
    goto out_close;

out_free:
    free(buf);
out_close:
    close(fd);
    return rc;
}

/* Copies one KV pair (scalar, or array of scalars or strings) from src[id]
 * to dst under the same key. Returns 0 or THAW_ECORRUPT for a nested array. */
static int mk_copy_kv(struct gguf_context *dst, const struct gguf_context *src, int64_t id)
{
    const char *key = gguf_get_key(src, id);
    enum gguf_type t = gguf_get_kv_type(src, id);

    switch (t) {
    case GGUF_TYPE_UINT8:   gguf_set_val_u8(dst, key, gguf_get_val_u8(src, id)); break;
    case GGUF_TYPE_INT8:    gguf_set_val_i8(dst, key, gguf_get_val_i8(src, id)); break;
    case GGUF_TYPE_UINT16:  gguf_set_val_u16(dst, key, gguf_get_val_u16(src, id)); break;
    case GGUF_TYPE_INT16:   gguf_set_val_i16(dst, key, gguf_get_val_i16(src, id)); break;
    case GGUF_TYPE_UINT32:  gguf_set_val_u32(dst, key, gguf_get_val_u32(src, id)); break;
    case GGUF_TYPE_INT32:   gguf_set_val_i32(dst, key, gguf_get_val_i32(src, id)); break;
    case GGUF_TYPE_FLOAT32: gguf_set_val_f32(dst, key, gguf_get_val_f32(src, id)); break;
    case GGUF_TYPE_UINT64:  gguf_set_val_u64(dst, key, gguf_get_val_u64(src, id)); break;
    case GGUF_TYPE_INT64:   gguf_set_val_i64(dst, key, gguf_get_val_i64(src, id)); break;
    case GGUF_TYPE_FLOAT64: gguf_set_val_f64(dst, key, gguf_get_val_f64(src, id)); break;
    case GGUF_TYPE_BOOL:    gguf_set_val_bool(dst, key, gguf_get_val_bool(src, id)); break;
    case GGUF_TYPE_STRING:  gguf_set_val_str(dst, key, gguf_get_val_str(src, id)); break;
    case GGUF_TYPE_ARRAY: {
        enum gguf_type at = gguf_get_arr_type(src, id);
        size_t n = gguf_get_arr_n(src, id);

        if (at == GGUF_TYPE_ARRAY)
            return THAW_ECORRUPT;
        if (at == GGUF_TYPE_STRING) {
            const char **strs = malloc((n ? n : 1) * sizeof *strs);
            if (strs == NULL)
                return THAW_ENOMEM;
            for (size_t i = 0; i < n; i++)
                strs[i] = gguf_get_arr_str(src, id, i);
            gguf_set_arr_str(dst, key, strs, n);
            free(strs);
        } else {
            gguf_set_arr_data(dst, key, at, gguf_get_arr_data(src, id), n);
        }
        break;
    }
    default:
        return THAW_ECORRUPT;
    }
    return 0;
}

/* True if llama_chat_apply_template() can render `tmpl`: it recognises a
 * fixed list of template families by marker strings, not by running Jinja,
 * and thaw serve --no-jinja templates with it. (Needs no model and no
 * backend.) */
static bool mk_template_usable(const char *tmpl)
{
    const struct llama_chat_message msg = { "user", "hi" };
    char buf[256];

    return llama_chat_apply_template(tmpl, &msg, 1, true, buf, sizeof buf) >= 0;
}

/* True if the vocab's token list holds `text` exactly. */
static bool mk_vocab_has(const struct gguf_context *v, int64_t tokens_id, const char *text)
{
    size_t n = gguf_get_arr_n(v, tokens_id);

    for (size_t i = 0; i < n; i++)
        if (strcmp(gguf_get_arr_str(v, tokens_id, i), text) == 0)
            return true;
    return false;
}

/* Copies the tokenizer.* keys of the vocab at `path` into dst and sets
 * tokenizer.chat_template: o->tmpl_text if given, else per o->tmpl (auto:
 * the arch's family template file, or the built-in choice). *n_vocab =
 * number of tokens; *tmpl_name = what was chosen (a static string, or
 * o->tmpl_file). Notes on stderr when thaw serve could not render the
 * result with llama_chat_apply_template(). Returns 0, THAW_ECORRUPT
 * (unreadable or no token list), THAW_EINVAL (--template vocab but the vocab
 * has none) or THAW_ENOMEM. */
static int mk_copy_vocab(struct gguf_context *dst, const char *path, const struct mk_opts *o,
                         uint32_t *n_vocab, const char **tmpl_name)
{
    struct gguf_init_params ip = { .no_alloc = true, .ctx = NULL };
    struct gguf_context *v = gguf_init_from_file(path, ip);
    const struct mk_arch_info *info = &mk_archs[o->arch];
    int64_t tokens_id, tmpl_id;
    enum mk_template tmpl;
    size_t n;
    int rc = 0;

    if (v == NULL) {
        fprintf(stderr, "mkmodel: %s: not a readable GGUF file\n", path);
        return THAW_ECORRUPT;
    }
    tokens_id = gguf_find_key(v, "tokenizer.ggml.tokens");
    if (tokens_id < 0 || gguf_get_kv_type(v, tokens_id) != GGUF_TYPE_ARRAY ||
        gguf_get_arr_type(v, tokens_id) != GGUF_TYPE_STRING) {
        fprintf(stderr, "mkmodel: %s: no tokenizer.ggml.tokens: not a vocab file\n", path);
        rc = THAW_ECORRUPT;
        goto out_free_vocab;
    }
    n = gguf_get_arr_n(v, tokens_id);
    if (n == 0 || n > INT32_MAX) {
        fprintf(stderr, "mkmodel: %s: bad token count %zu\n", path, n);
        rc = THAW_ECORRUPT;
        goto out_free_vocab;
    }
    *n_vocab = (uint32_t)n;

    /* only tokenizer.*: the other keys describe the vocab's original model
     * (e.g. llama.rope.dimension_count) and would contradict ours */
    for (int64_t i = 0; i < gguf_get_n_kv(v); i++) {
        if (strncmp(gguf_get_key(v, i), "tokenizer.", 10) != 0)
            continue;
        rc = mk_copy_kv(dst, v, i);
        if (rc != 0) {
            fprintf(stderr, "mkmodel: %s: cannot copy key %s: %s\n", path, gguf_get_key(v, i),
                    thaw_strerror(rc));
            goto out_free_vocab;
        }
    }

    tmpl_id = gguf_find_key(v, "tokenizer.chat_template");
    if (tmpl_id >= 0 && gguf_get_kv_type(v, tmpl_id) != GGUF_TYPE_STRING)
        tmpl_id = -1; /* malformed: treat as absent (it was copied; replaced below) */
    if (o->tmpl_text != NULL) {
        gguf_set_val_str(dst, "tokenizer.chat_template", o->tmpl_text);
        *tmpl_name = o->tmpl_file;
        goto check;
    }
    tmpl = o->tmpl;
    if (tmpl == MK_TMPL_AUTO && info->family != NULL) {
        /* the family's real template; without the source tree's templates/,
         * the vocab's own rather than a guess */
        char tpath[PATH_MAX], file[256];
        char *text = NULL;

        snprintf(file, sizeof file, MK_TMPL_SUBDIR "/%s", info->family);
        if (mk_find_data(file, tpath, sizeof tpath) == 0 && mk_read_text(tpath, &text) == 0) {
            gguf_set_val_str(dst, "tokenizer.chat_template", text);
            free(text);
            *tmpl_name = info->family;
            goto check;
        }
        fprintf(stderr, "mkmodel: note: %s not found in the vocab dir; using %s\n", file,
                tmpl_id >= 0 ? "the vocab's chat template" : "chatml");
        tmpl = tmpl_id >= 0 ? MK_TMPL_VOCAB : MK_TMPL_CHATML;
    }
    if (tmpl == MK_TMPL_AUTO) {
        if (tmpl_id >= 0 && mk_template_usable(gguf_get_val_str(v, tmpl_id)))
            tmpl = MK_TMPL_VOCAB;
        else if (o->arch == MK_ARCH_GEMMA3)
            tmpl = MK_TMPL_GEMMA;
        else if (mk_vocab_has(v, tokens_id, "<|start_header_id|>"))
            tmpl = MK_TMPL_LLAMA3;
        else
            tmpl = MK_TMPL_CHATML;
        if (tmpl != MK_TMPL_VOCAB && tmpl_id >= 0)
            fprintf(stderr, "mkmodel: note: %s's chat template is not one "
                            "llama_chat_apply_template() renders; replacing it "
                            "(--template vocab keeps it)\n", path);
    }
    switch (tmpl) {
    case MK_TMPL_AUTO: /* resolved above */
    case MK_TMPL_VOCAB:
        if (tmpl_id < 0) {
            fprintf(stderr, "mkmodel: --template vocab: %s has no tokenizer.chat_template\n",
                    path);
            rc = THAW_EINVAL;
            goto out_free_vocab;
        }
        *tmpl_name = "vocab";
        break;
    case MK_TMPL_LLAMA3:
        gguf_set_val_str(dst, "tokenizer.chat_template", mk_tmpl_llama3);
        *tmpl_name = "llama3";
        break;
    case MK_TMPL_CHATML:
        gguf_set_val_str(dst, "tokenizer.chat_template", mk_tmpl_chatml);
        *tmpl_name = "chatml";
        break;
    case MK_TMPL_GEMMA:
        gguf_set_val_str(dst, "tokenizer.chat_template", mk_tmpl_gemma);
        *tmpl_name = "gemma";
        break;
    }

check:
    /* thaw serve --no-jinja templates with llama_chat_apply_template(): say
     * so when that will refuse this model without --chat-template */
    tmpl_id = gguf_find_key(dst, "tokenizer.chat_template");
    if (tmpl_id >= 0 && !mk_template_usable(gguf_get_val_str(dst, tmpl_id)))
        fprintf(stderr, "mkmodel: note: the chat template (%s) is Jinja only: "
                        "llama_chat_apply_template() does not render it, so thaw serve "
                        "--no-jinja needs --chat-template NAME for this model\n", *tmpl_name);

out_free_vocab:
    gguf_free(v);
    return rc;
}

/* ---- model ---------------------------------------------------------------- */

enum mk_init { MK_INIT_CONST, MK_INIT_RANDOM };

struct mk_tensor {
    enum mk_init init;
    float value; /* CONST: every element; RANDOM: standard deviation */
};

/* Everything the writer needs, built from the options. */
struct mk_model {
    struct gguf_context *gguf;  /* KV pairs + tensor infos, in file order */
    struct ggml_context *meta;  /* no_alloc: shapes and names only */
    struct mk_tensor *init;     /* [gguf_get_n_tensors] how to fill each */
    int64_t n_tensors;
    uint64_t n_params;
    uint32_t n_vocab;
    const char *tmpl_name;
};

static const char *mk_arch_name(enum mk_arch a)
{
    return mk_archs[a].name;
}

/* gemma3, gemma4: layer il uses the sliding window. Every swa_pattern-th
 * layer is global, as llama.cpp's set_swa_pattern() reads the period
 * (pattern 0: all SWA). */
static bool mk_is_swa(const struct mk_opts *o, uint32_t il)
{
    return mk_archs[o->arch].swa &&
           (o->swa_pattern == 0 || il % o->swa_pattern < o->swa_pattern - 1);
}

/* lfm2: layer il is attention (else a short convolution); other archs: all. */
static bool mk_is_attn(const struct mk_opts *o, uint32_t il)
{
    return !mk_archs[o->arch].hybrid || il % o->attn_pattern == o->attn_pattern - 1;
}

/* Sets "<arch>.<suffix>" = v. */
static void mk_set_arch_u32(struct gguf_context *g, enum mk_arch a, const char *suffix,
                            uint32_t v)
{
    char key[128];

    snprintf(key, sizeof key, "%s.%s", mk_arch_name(a), suffix);
    gguf_set_val_u32(g, key, v);
}

static void mk_set_arch_f32(struct gguf_context *g, enum mk_arch a, const char *suffix, float v)
{
    char key[128];

    snprintf(key, sizeof key, "%s.%s", mk_arch_name(a), suffix);
    gguf_set_val_f32(g, key, v);
}

/* Sets "<arch>.<suffix>" to an array of n elements of `type`. */
static void mk_set_arch_arr(struct gguf_context *g, enum mk_arch a, const char *suffix,
                            enum gguf_type type, const void *data, size_t n)
{
    char key[128];

    snprintf(key, sizeof key, "%s.%s", mk_arch_name(a), suffix);
    gguf_set_arr_data(g, key, type, data, n);
}

/* qwen35's shape of the gated delta-net (llama.cpp src/models/qwen35.cpp):
 * heads of size D = embd/heads, keys with --kv-heads heads and values with
 * --heads heads (Qwen3.5 also has more value than key heads), a 4-token
 * causal convolution (Qwen3.5's) before the delta rule. */
#define MK_QWEN35_CONV 4
static void mk_qwen35_dims(const struct mk_opts *o, int64_t *d, int64_t *n_k, int64_t *n_v)
{
    *d = o->n_embd / o->n_head;
    *n_k = o->n_head_kv;
    *n_v = o->n_head;
}

/* qwen35's own keys: Qwen3.5's rope base and norm epsilon, its interleaved
 * M-RoPE sections (text positions are equal in every section, so the split
 * only has to cover the rotated half of a head), the delta-net sizes. */
static void mk_set_hparams_qwen35(struct gguf_context *g, const struct mk_opts *o)
{
    const enum mk_arch a = MK_ARCH_QWEN35;
    int64_t d, n_k, n_v;
    int32_t half, sections[4];

    mk_qwen35_dims(o, &d, &n_k, &n_v);
    half = (int32_t)(d / 2);
    sections[1] = sections[2] = half / 3;
    sections[0] = half - 2 * (half / 3);
    sections[3] = 0;
    mk_set_arch_f32(g, a, "rope.freq_base", 10000000.0f);
    mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
    mk_set_arch_arr(g, a, "rope.dimension_sections", GGUF_TYPE_INT32, sections, 4);
    mk_set_arch_u32(g, a, "ssm.conv_kernel", MK_QWEN35_CONV);
    mk_set_arch_u32(g, a, "ssm.inner_size", (uint32_t)(d * n_v));
    mk_set_arch_u32(g, a, "ssm.state_size", (uint32_t)d);
    mk_set_arch_u32(g, a, "ssm.time_step_rank", (uint32_t)n_v);
    mk_set_arch_u32(g, a, "ssm.group_count", (uint32_t)n_k);
    mk_set_arch_u32(g, a, "full_attention_interval", o->attn_pattern);
}

/* deepseek2's multi-head latent attention (src/models/deepseek2.cpp, as
 * conversion/deepseek.py writes it): each token's K is one latent row of
 * kv_lora_rank values plus rope dims (the only thing cached: V is a view
 * of the latent, so libllama's cache has no V tensor, hparams.is_mla());
 * queries are per head, qk_nope + rope wide, and attn_k_b / attn_v_b
 * absorb the up-projections per head. The latent row is 96 values, a
 * multiple of q8_0's 32, so -ctk q8_0 works at every --embd/--heads.
 * Real models: rank 512 + 64 rope (576), nope 128, v 128. */
#define MK_MLA_KV_LORA 64
#define MK_MLA_ROPE 32
#define MK_MLA_NOPE 32
#define MK_MLA_V 32
static void mk_set_hparams_deepseek2(struct gguf_context *g, const struct mk_opts *o)
{
    const enum mk_arch a = MK_ARCH_DEEPSEEK2;

    mk_set_arch_f32(g, a, "rope.freq_base", 10000.0f);
    mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
    /* the cached (MQA) head: the latent and the rope part; V: the latent */
    mk_set_arch_u32(g, a, "attention.key_length", MK_MLA_KV_LORA + MK_MLA_ROPE);
    mk_set_arch_u32(g, a, "attention.value_length", MK_MLA_KV_LORA);
    /* the per-head sizes after decompression: their presence is is_mla() */
    mk_set_arch_u32(g, a, "attention.key_length_mla", MK_MLA_NOPE + MK_MLA_ROPE);
    mk_set_arch_u32(g, a, "attention.value_length_mla", MK_MLA_V);
    mk_set_arch_u32(g, a, "rope.dimension_count", MK_MLA_ROPE);
    mk_set_arch_u32(g, a, "attention.q_lora_rank", 0); /* attn_q, as V2-Lite */
    mk_set_arch_u32(g, a, "attention.kv_lora_rank", MK_MLA_KV_LORA);
    mk_set_arch_u32(g, a, "leading_dense_block_count", 1);
    mk_set_arch_u32(g, a, "expert_count", o->n_expert);
    mk_set_arch_u32(g, a, "expert_used_count", 2);
    mk_set_arch_u32(g, a, "expert_shared_count", 1);
    mk_set_arch_u32(g, a, "expert_feed_forward_length", o->n_ff);
    mk_set_arch_u32(g, a, "expert_gating_func", 1); /* softmax, as V2 */
}

/* The architecture's hyper-parameter keys, as llama.cpp v0.4.0 reads them
 * (llama_model_base::load_hparams + the arch's load_arch_hparams in
 * src/models/<arch>.cpp). Real models' values where the shape allows. */
static void mk_set_hparams(struct gguf_context *g, const struct mk_opts *o)
{
    enum mk_arch a = o->arch;
    uint32_t head_dim = o->n_embd / o->n_head;
    char name[128];

    gguf_set_val_str(g, "general.architecture", mk_arch_name(a));
    gguf_set_val_str(g, "general.type", "model");
    snprintf(name, sizeof name, "thaw-mkmodel-%s-%" PRIu32 "x%" PRIu32, mk_arch_name(a),
             o->n_layer, o->n_embd);
    gguf_set_val_str(g, "general.name", name);
    /* llama_ftype: 0 ALL_F32, 1 MOSTLY_F16 (only shown in descriptions) */
    gguf_set_val_u32(g, "general.file_type", o->wtype == GGML_TYPE_F16 ? 1 : 0);

    mk_set_arch_u32(g, a, "context_length", o->n_ctx_train);
    mk_set_arch_u32(g, a, "embedding_length", o->n_embd);
    mk_set_arch_u32(g, a, "block_count", o->n_layer);
    mk_set_arch_u32(g, a, "feed_forward_length", o->n_ff);
    mk_set_arch_u32(g, a, "attention.head_count", o->n_head);
    if (a == MK_ARCH_LFM2) {
        /* lfm2 tells a short-conv layer by its 0 KV heads */
        uint32_t kv[MK_MAX_LAYERS];
        for (uint32_t il = 0; il < o->n_layer; il++)
            kv[il] = mk_is_attn(o, il) ? o->n_head_kv : 0;
        mk_set_arch_arr(g, a, "attention.head_count_kv", GGUF_TYPE_UINT32, kv, o->n_layer);
    } else {
        mk_set_arch_u32(g, a, "attention.head_count_kv", o->n_head_kv);
    }
    if (a != MK_ARCH_DEEPSEEK2) { /* its own (MLA) head sizes: mk_set_hparams_deepseek2 */
        mk_set_arch_u32(g, a, "attention.key_length", head_dim);
        mk_set_arch_u32(g, a, "attention.value_length", head_dim);
        mk_set_arch_u32(g, a, "rope.dimension_count", head_dim);
    }

    switch (a) {
    case MK_ARCH_LLAMA:
        /* llama 3's values */
        mk_set_arch_f32(g, a, "rope.freq_base", 500000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-5f);
        break;
    case MK_ARCH_GEMMA3:
        /* gemma 3's: global layers rope at 1e6, local (SWA) layers at 1e4.
         * llama.cpp defaults the pattern to 6 when the key is absent, which
         * would make a model under 6 layers all-SWA, so always write it. */
        mk_set_arch_f32(g, a, "rope.freq_base", 1000000.0f);
        mk_set_arch_f32(g, a, "rope.freq_base_swa", 10000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
        mk_set_arch_u32(g, a, "attention.sliding_window", o->n_swa);
        mk_set_arch_u32(g, a, "attention.sliding_window_pattern", o->swa_pattern);
        break;
    case MK_ARCH_QWEN3:
        mk_set_arch_f32(g, a, "rope.freq_base", 1000000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
        break;
    case MK_ARCH_GEMMA4: {
        /* gemma 4's keys, as its converter writes them: the pattern is a
         * per-layer bool array (true = SWA); SWA layers have their own head
         * size and rope dims (the same as the global ones here); no per-layer
         * embeddings, no KV sharing, no experts */
        uint8_t swa[MK_MAX_LAYERS];
        for (uint32_t il = 0; il < o->n_layer; il++)
            swa[il] = mk_is_swa(o, il);
        mk_set_arch_f32(g, a, "rope.freq_base", 1000000.0f);
        mk_set_arch_f32(g, a, "rope.freq_base_swa", 10000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
        mk_set_arch_u32(g, a, "attention.sliding_window", o->n_swa);
        mk_set_arch_arr(g, a, "attention.sliding_window_pattern", GGUF_TYPE_BOOL, swa,
                        o->n_layer);
        mk_set_arch_u32(g, a, "attention.key_length_swa", head_dim);
        mk_set_arch_u32(g, a, "attention.value_length_swa", head_dim);
        mk_set_arch_u32(g, a, "rope.dimension_count_swa", head_dim);
        mk_set_arch_u32(g, a, "attention.shared_kv_layers", 0);
        mk_set_arch_u32(g, a, "embedding_length_per_layer_input", 0);
        mk_set_arch_f32(g, a, "final_logit_softcapping", 30.0f);
        break;
    }
    case MK_ARCH_LFM2:
        mk_set_arch_f32(g, a, "rope.freq_base", 1000000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-5f);
        mk_set_arch_u32(g, a, "shortconv.l_cache", MK_LFM2_L_CACHE);
        break;
    case MK_ARCH_QWEN35:
        mk_set_hparams_qwen35(g, o);
        break;
    case MK_ARCH_GPTOSS:
        /* gpt-oss's: rope base 150000 (no YaRN here: the trained context
         * is the flag's), 2 of the experts per token, each --ff wide */
        mk_set_arch_f32(g, a, "rope.freq_base", 150000.0f);
        mk_set_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-5f);
        mk_set_arch_u32(g, a, "attention.sliding_window", o->n_swa);
        mk_set_arch_u32(g, a, "attention.sliding_window_pattern", o->swa_pattern);
        mk_set_arch_u32(g, a, "expert_count", o->n_expert);
        mk_set_arch_u32(g, a, "expert_used_count", 2);
        mk_set_arch_u32(g, a, "expert_feed_forward_length", o->n_ff);
        break;
    case MK_ARCH_DEEPSEEK2:
        mk_set_hparams_deepseek2(g, o);
        break;
    case MK_ARCH_BERT:
        /* bge's: LayerNorm eps 1e-12, bidirectional, CLS pooling (rank
         * with --rerank: the head reads the CLS row) */
        mk_set_arch_f32(g, a, "attention.layer_norm_epsilon", 1e-12f);
        gguf_set_val_bool(g, "bert.attention.causal", false);
        break;
    }
    if (o->rerank || a == MK_ARCH_BERT)
        /* enum llama_pooling_type: 2 cls, 4 rank */
        mk_set_arch_u32(g, a, "pooling_type", o->rerank ? 4 : 2);
    if (o->rerank && a == MK_ARCH_QWEN3) {
        /* two outputs, softmaxed by libllama: the score is p("yes") */
        const char *labels[] = {"yes", "no"}; /* gguf_set_arr_str takes char ** */
        char key[64];
        snprintf(key, sizeof key, "%s.classifier.output_labels", mk_arch_name(a));
        gguf_set_arr_str(g, key, labels, 2);
    }
}

/* Adds one tensor (ggml order: ne0 = the contiguous, input-side dimension)
 * to the meta context and the gguf, and records how to fill it. */
static void mk_add4(struct mk_model *m, const char *name, enum ggml_type type, int64_t ne0,
                    int64_t ne1, int64_t ne2, int64_t ne3, enum mk_init init, float value)
{
    struct ggml_tensor *t = ne3 > 0   ? ggml_new_tensor_4d(m->meta, type, ne0, ne1, ne2, ne3)
                            : ne2 > 0 ? ggml_new_tensor_3d(m->meta, type, ne0, ne1, ne2)
                            : ne1 > 0 ? ggml_new_tensor_2d(m->meta, type, ne0, ne1)
                                      : ggml_new_tensor_1d(m->meta, type, ne0);

    ggml_set_name(t, name);
    gguf_add_tensor(m->gguf, t);
    m->init[m->n_tensors].init = init;
    m->init[m->n_tensors].value = value;
    m->n_tensors++;
    m->n_params += (uint64_t)ggml_nelements(t);
}

static void mk_add3(struct mk_model *m, const char *name, enum ggml_type type, int64_t ne0,
                    int64_t ne1, int64_t ne2, enum mk_init init, float value)
{
    mk_add4(m, name, type, ne0, ne1, ne2, 0, init, value);
}

static void mk_add(struct mk_model *m, const char *name, enum ggml_type type, int64_t ne0,
                   int64_t ne1, enum mk_init init, float value)
{
    mk_add3(m, name, type, ne0, ne1, 0, init, value);
}

/* gpt-oss's block: attention with biases on the output and a learnt sink
 * per head (0: a sink as likely as one more key), its post-attention norm
 * in front of the MoE, whose router, experts and biases are all required
 * (src/models/openai-moe.cpp). Biases start at 0. */
static void mk_add_gptoss_block(struct mk_model *m, const struct mk_opts *o, uint32_t il)
{
    const int64_t E = o->n_embd, F = o->n_ff, X = o->n_expert;
    const int64_t Q = (int64_t)o->n_head * (o->n_embd / o->n_head);
    const int64_t KV = (int64_t)o->n_head_kv * (o->n_embd / o->n_head);
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    const float sE = 1.0f / sqrtf((float)E), sQ = 1.0f / sqrtf((float)Q), sF = 1.0f / sqrtf((float)F);
    char nm[GGML_MAX_NAME];

#define MK_BLK(suffix) (snprintf(nm, sizeof nm, "blk.%" PRIu32 "." suffix, il), nm)
    mk_add(m, MK_BLK("attn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
    mk_add(m, MK_BLK("attn_q.weight"), W, E, Q, MK_INIT_RANDOM, 4.0f * sE);
    mk_add(m, MK_BLK("attn_k.weight"), W, E, KV, MK_INIT_RANDOM, sE);
    mk_add(m, MK_BLK("attn_v.weight"), W, E, KV, MK_INIT_RANDOM, sE);
    mk_add(m, MK_BLK("attn_output.weight"), W, Q, E, MK_INIT_RANDOM, sQ);
    mk_add(m, MK_BLK("attn_output.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
    mk_add(m, MK_BLK("attn_sinks.weight"), N, o->n_head, 0, MK_INIT_CONST, 0.0f);
    mk_add(m, MK_BLK("post_attention_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
    mk_add(m, MK_BLK("ffn_gate_inp.weight"), N, E, X, MK_INIT_RANDOM, sE);
    mk_add(m, MK_BLK("ffn_gate_inp.bias"), N, X, 0, MK_INIT_CONST, 0.0f);
    mk_add3(m, MK_BLK("ffn_gate_exps.weight"), W, E, F, X, MK_INIT_RANDOM, sE);
    mk_add(m, MK_BLK("ffn_gate_exps.bias"), N, F, X, MK_INIT_CONST, 0.0f);
    mk_add3(m, MK_BLK("ffn_up_exps.weight"), W, E, F, X, MK_INIT_RANDOM, sE);
    mk_add(m, MK_BLK("ffn_up_exps.bias"), N, F, X, MK_INIT_CONST, 0.0f);
    mk_add3(m, MK_BLK("ffn_down_exps.weight"), W, F, E, X, MK_INIT_RANDOM, sF);
    mk_add(m, MK_BLK("ffn_down_exps.bias"), N, E, X, MK_INIT_CONST, 0.0f);
#undef MK_BLK
}

/* Initial values, chosen so that greedy decoding wanders through the vocab
 * instead of repeating one token (checked for 200 tokens at 1..12 layers,
 * 64..1024 wide):
 *  - weight matrices [fan_in, fan_out]: std 1/sqrt(fan_in), so every
 *    projection keeps unit scale and llama's logits come out with std ~1;
 *  - norms: 1.0, the identity for every arch (gemma's (1 + w) is folded
 *    into the stored weight by llama.cpp's converter);
 *  - attention scores with std ~4, not 1: near-uniform attention adds the
 *    same slowly-changing context average at every position, it swamps the
 *    current token and the argmax sticks for tens of tokens. llama: attn_q
 *    std 4/sqrt(embd). gemma3, qwen3 and lfm2 RMS-normalise q and k and
 *    scale by 1/sqrt(head), so their attn_q_norm and attn_k_norm weights
 *    are 2.0 instead; gemma4 does not scale (its score std is
 *    w^2 sqrt(head)), so its weights are 2/head^(1/4);
 *  - an embedding that is RMS-normed before use (llama, qwen3, lfm2): std
 *    1/sqrt(embd). Tied to the output (qwen3, lfm2) that is still fine: the
 *    blocks' outputs outweigh the input token's embedding in the last
 *    hidden state, so its self-match adds ~1/sqrt(2) to a logit of std 1;
 *  - gemma3 and gemma4 multiply the embedding by sqrt(embd) and reuse it as
 *    the output matrix, so a token's logit includes its own embedding's
 *    squared norm: at std 1/sqrt(embd) that self-match beats the other
 *    logits and the model echoes its input token. A quarter of that std
 *    (logit std 0.25) keeps the self-match below the noise;
 *  - lfm2's short convolution y = c * conv(b * x), b, c, x from in_proj:
 *    kernel std 1/sqrt(l_cache) keeps conv's output at unit scale. */
static void mk_add_tensors_qwen35(struct mk_model *m, const struct mk_opts *o);
static void mk_add_tensors_deepseek2(struct mk_model *m, const struct mk_opts *o);
static void mk_add_tensors_bert(struct mk_model *m, const struct mk_opts *o);

static void mk_add_tensors(struct mk_model *m, const struct mk_opts *o)
{
    const int64_t E = o->n_embd, F = o->n_ff, V = m->n_vocab;
    const int64_t Q = (int64_t)o->n_head * (o->n_embd / o->n_head);    /* q width */
    const int64_t KV = (int64_t)o->n_head_kv * (o->n_embd / o->n_head); /* k, v width */
    const int64_t D = o->n_embd / o->n_head;
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    const enum mk_arch a = o->arch;
    const bool gemma = a == MK_ARCH_GEMMA3 || a == MK_ARCH_GEMMA4; /* post-norms, scaled embd */
    const bool tied = a != MK_ARCH_LLAMA && a != MK_ARCH_GPTOSS;
    const bool qk_norm = a != MK_ARCH_LLAMA;
    const float sE = 1.0f / sqrtf((float)E), sQ = 1.0f / sqrtf((float)Q);
    const float sF = 1.0f / sqrtf((float)F);
    const float qk = a == MK_ARCH_GEMMA4 ? 2.0f / sqrtf(sqrtf((float)D)) : 2.0f;
    bool any_global = false;
    char nm[GGML_MAX_NAME];

    if (a == MK_ARCH_QWEN35) {
        mk_add_tensors_qwen35(m, o);
        return;
    }
    if (a == MK_ARCH_DEEPSEEK2) {
        mk_add_tensors_deepseek2(m, o);
        return;
    }
    if (a == MK_ARCH_BERT) {
        mk_add_tensors_bert(m, o);
        return;
    }
    if (o->rerank) /* qwen3's rank head: yes / no */
        mk_add(m, "cls.output.weight", W, E, 2, MK_INIT_RANDOM, sE);
    for (uint32_t il = 0; il < o->n_layer; il++)
        any_global |= !mk_is_swa(o, il);

    mk_add(m, "token_embd.weight", W, E, V, MK_INIT_RANDOM, gemma ? 0.25f * sE : sE);
    /* lfm2's final norm has the name of an embedding norm (llama.cpp's
     * LLM_TENSOR_OUTPUT_NORM_LFM2: "fix for wrong tensor name") */
    mk_add(m, a == MK_ARCH_LFM2 ? "token_embd_norm.weight" : "output_norm.weight", N, E, 0,
           MK_INIT_CONST, 1.0f);
    if (!tied)
        mk_add(m, "output.weight", W, E, V, MK_INIT_RANDOM, sE);
    if (a == MK_ARCH_GEMMA4 && any_global)
        /* the global layers' proportional-rope frequency factors, one tensor
         * shared by them all: 1.0 = plain rope over the whole head */
        mk_add(m, "rope_freqs.weight", N, D / 2, 0, MK_INIT_CONST, 1.0f);

    for (uint32_t il = 0; il < o->n_layer; il++) {
        if (a == MK_ARCH_GPTOSS) {
            mk_add_gptoss_block(m, o, il);
            continue;
        }
#define MK_BLK(suffix) (snprintf(nm, sizeof nm, "blk.%" PRIu32 "." suffix, il), nm)
        mk_add(m, MK_BLK("attn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        if (mk_is_attn(o, il)) {
            mk_add(m, MK_BLK("attn_q.weight"), W, E, Q, MK_INIT_RANDOM, qk_norm ? sE : 4.0f * sE);
            mk_add(m, MK_BLK("attn_k.weight"), W, E, KV, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_v.weight"), W, E, KV, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_output.weight"), W, Q, E, MK_INIT_RANDOM, sQ);
            if (qk_norm) {
                mk_add(m, MK_BLK("attn_q_norm.weight"), N, D, 0, MK_INIT_CONST, qk);
                mk_add(m, MK_BLK("attn_k_norm.weight"), N, D, 0, MK_INIT_CONST, qk);
            }
        } else {
            /* lfm2 short convolution: in_proj -> (b, c, x), conv over the
             * last l_cache tokens (the recurrent state), out_proj */
            mk_add(m, MK_BLK("shortconv.conv.weight"), N, MK_LFM2_L_CACHE, E, MK_INIT_RANDOM,
                   1.0f / sqrtf((float)MK_LFM2_L_CACHE));
            mk_add(m, MK_BLK("shortconv.in_proj.weight"), W, E, 3 * E, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("shortconv.out_proj.weight"), W, E, E, MK_INIT_RANDOM, sE);
        }
        if (gemma)
            mk_add(m, MK_BLK("post_attention_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("ffn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("ffn_gate.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("ffn_up.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("ffn_down.weight"), W, F, E, MK_INIT_RANDOM, sF);
        if (gemma)
            mk_add(m, MK_BLK("post_ffw_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
#undef MK_BLK
    }
}

/* qwen35 (src/models/qwen35.cpp): every block has attn_norm and
 * post_attention_norm (the FFN's input norm) and a SwiGLU FFN. An attention
 * block's attn_q is twice as wide (query and its output gate, interleaved
 * per head), with q/k norms as qwen3's. A gated delta-net block projects
 * q, k, v through one attn_qkv (then the causal convolution ssm_conv1d),
 * the output gate z through attn_gate, the per-head write strength beta and
 * decay alpha (decay = exp(ssm_a * softplus(alpha + ssm_dt.bias))) through
 * ssm_beta and ssm_alpha; ssm_norm is the gated RMS norm before ssm_out.
 * Values as mk_add_tensors explains; ssm_a = -1 and a zero dt bias keep the
 * decay near exp(-softplus(0)) = 0.5 a token: the state remembers a few
 * tokens, as the real models' heads do on average. */
static void mk_add_tensors_qwen35(struct mk_model *m, const struct mk_opts *o)
{
    const int64_t E = o->n_embd, F = o->n_ff, V = m->n_vocab;
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    int64_t D, n_k, n_v;
    char nm[GGML_MAX_NAME];

    mk_qwen35_dims(o, &D, &n_k, &n_v);
    const int64_t Q = o->n_head * D, KV = (int64_t)o->n_head_kv * D;
    const int64_t key_dim = D * n_k, value_dim = D * n_v, conv_dim = 2 * key_dim + value_dim;
    const float sE = 1.0f / sqrtf((float)E), sQ = 1.0f / sqrtf((float)Q);
    const float sF = 1.0f / sqrtf((float)F), sVd = 1.0f / sqrtf((float)value_dim);

    mk_add(m, "token_embd.weight", W, E, V, MK_INIT_RANDOM, sE);
    mk_add(m, "output_norm.weight", N, E, 0, MK_INIT_CONST, 1.0f);
    for (uint32_t il = 0; il < o->n_layer; il++) {
#define MK_BLK(suffix) (snprintf(nm, sizeof nm, "blk.%" PRIu32 "." suffix, il), nm)
        mk_add(m, MK_BLK("attn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("post_attention_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        if (mk_is_attn(o, il)) {
            mk_add(m, MK_BLK("attn_q.weight"), W, E, 2 * Q, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_k.weight"), W, E, KV, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_v.weight"), W, E, KV, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_output.weight"), W, Q, E, MK_INIT_RANDOM, sQ);
            mk_add(m, MK_BLK("attn_q_norm.weight"), N, D, 0, MK_INIT_CONST, 2.0f);
            mk_add(m, MK_BLK("attn_k_norm.weight"), N, D, 0, MK_INIT_CONST, 2.0f);
        } else {
            mk_add(m, MK_BLK("attn_qkv.weight"), W, E, conv_dim, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("attn_gate.weight"), W, E, value_dim, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ssm_conv1d.weight"), N, MK_QWEN35_CONV, conv_dim, MK_INIT_RANDOM,
                   1.0f / sqrtf((float)MK_QWEN35_CONV));
            mk_add(m, MK_BLK("ssm_dt.bias"), N, n_v, 0, MK_INIT_CONST, 0.0f);
            mk_add(m, MK_BLK("ssm_a"), N, n_v, 0, MK_INIT_CONST, -1.0f);
            mk_add(m, MK_BLK("ssm_beta.weight"), W, E, n_v, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ssm_alpha.weight"), W, E, n_v, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ssm_norm.weight"), N, D, 0, MK_INIT_CONST, 1.0f);
            mk_add(m, MK_BLK("ssm_out.weight"), W, value_dim, E, MK_INIT_RANDOM, sVd);
        }
        mk_add(m, MK_BLK("ffn_gate.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("ffn_up.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("ffn_down.weight"), W, F, E, MK_INIT_RANDOM, sF);
#undef MK_BLK
    }
}

/* deepseek2 (src/models/deepseek2.cpp, MLA with the absorbed
 * up-projections): attn_q gives each head's nope + rope query; attn_kv_a_mqa
 * the token's latent (normed by attn_kv_a_norm) and its shared rope key;
 * attn_k_b [nope, rank, head] maps a head's nope query onto the latent,
 * attn_v_b [rank, v, head] the attended latent onto the head's value.
 * Layer 0 has a dense SwiGLU FFN, the rest a routed MoE (router, experts
 * each --ff wide) plus one shared expert of the same width. attn_q has std
 * 4/sqrt(embd) as llama's (scores of std ~4, mk_add_tensors); every other
 * matrix 1/sqrt(fan_in). The output is not tied. */
static void mk_add_tensors_deepseek2(struct mk_model *m, const struct mk_opts *o)
{
    const int64_t E = o->n_embd, F = o->n_ff, V = m->n_vocab, H = o->n_head, X = o->n_expert;
    const int64_t R = MK_MLA_KV_LORA, P = MK_MLA_ROPE, K = MK_MLA_NOPE + MK_MLA_ROPE, Vh = MK_MLA_V;
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    const float sE = 1.0f / sqrtf((float)E), sF = 1.0f / sqrtf((float)F), sR = 1.0f / sqrtf((float)R);
    const float sN = 1.0f / sqrtf((float)MK_MLA_NOPE), sO = 1.0f / sqrtf((float)(H * Vh));
    char nm[GGML_MAX_NAME];

    mk_add(m, "token_embd.weight", W, E, V, MK_INIT_RANDOM, sE);
    mk_add(m, "output_norm.weight", N, E, 0, MK_INIT_CONST, 1.0f);
    mk_add(m, "output.weight", W, E, V, MK_INIT_RANDOM, sE);
    for (uint32_t il = 0; il < o->n_layer; il++) {
#define MK_BLK(suffix) (snprintf(nm, sizeof nm, "blk.%" PRIu32 "." suffix, il), nm)
        mk_add(m, MK_BLK("attn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("attn_q.weight"), W, E, H * K, MK_INIT_RANDOM, 4.0f * sE);
        mk_add(m, MK_BLK("attn_kv_a_mqa.weight"), W, E, R + P, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("attn_kv_a_norm.weight"), N, R, 0, MK_INIT_CONST, 1.0f);
        mk_add3(m, MK_BLK("attn_k_b.weight"), W, MK_MLA_NOPE, R, H, MK_INIT_RANDOM, sN);
        mk_add3(m, MK_BLK("attn_v_b.weight"), W, R, Vh, H, MK_INIT_RANDOM, sR);
        mk_add(m, MK_BLK("attn_output.weight"), W, H * Vh, E, MK_INIT_RANDOM, sO);
        mk_add(m, MK_BLK("ffn_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        if (il == 0) {
            mk_add(m, MK_BLK("ffn_gate.weight"), W, E, F, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ffn_up.weight"), W, E, F, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ffn_down.weight"), W, F, E, MK_INIT_RANDOM, sF);
        } else {
            mk_add(m, MK_BLK("ffn_gate_inp.weight"), N, E, X, MK_INIT_RANDOM, sE);
            mk_add3(m, MK_BLK("ffn_gate_exps.weight"), W, E, F, X, MK_INIT_RANDOM, sE);
            mk_add3(m, MK_BLK("ffn_up_exps.weight"), W, E, F, X, MK_INIT_RANDOM, sE);
            mk_add3(m, MK_BLK("ffn_down_exps.weight"), W, F, E, X, MK_INIT_RANDOM, sF);
            mk_add(m, MK_BLK("ffn_gate_shexp.weight"), W, E, F, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ffn_up_shexp.weight"), W, E, F, MK_INIT_RANDOM, sE);
            mk_add(m, MK_BLK("ffn_down_shexp.weight"), W, F, E, MK_INIT_RANDOM, sF);
        }
#undef MK_BLK
    }
}

/* bert (src/models/bert.cpp): token, token-type and learnt position
 * embeddings summed and LayerNormed (token_embd_norm), then post-norm
 * blocks: attention with biases, its residual LayerNormed
 * (attn_output_norm), a GELU FFN (up, down, biases), its residual
 * LayerNormed (layer_output_norm). With --rerank the classification head:
 * cls (dense + tanh on the CLS row) and cls.output (one score). Values as
 * mk_add_tensors explains (attn_q std 4/sqrt(embd): scores of std ~4, so
 * different inputs give clearly different vectors); biases 0, norms 1. */
static void mk_add_tensors_bert(struct mk_model *m, const struct mk_opts *o)
{
    const int64_t E = o->n_embd, F = o->n_ff, V = m->n_vocab;
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    const float sE = 1.0f / sqrtf((float)E), sF = 1.0f / sqrtf((float)F);
    char nm[GGML_MAX_NAME];

    mk_add(m, "token_embd.weight", W, E, V, MK_INIT_RANDOM, sE);
    mk_add(m, "token_types.weight", N, E, 2, MK_INIT_RANDOM, sE);
    mk_add(m, "position_embd.weight", N, E, o->n_ctx_train, MK_INIT_RANDOM, sE);
    mk_add(m, "token_embd_norm.weight", N, E, 0, MK_INIT_CONST, 1.0f);
    mk_add(m, "token_embd_norm.bias", N, E, 0, MK_INIT_CONST, 0.0f);
    if (o->rerank) {
        mk_add(m, "cls.weight", W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, "cls.bias", N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, "cls.output.weight", W, E, 1, MK_INIT_RANDOM, sE);
        mk_add(m, "cls.output.bias", N, 1, 0, MK_INIT_CONST, 0.0f);
    }
    for (uint32_t il = 0; il < o->n_layer; il++) {
#define MK_BLK(suffix) (snprintf(nm, sizeof nm, "blk.%" PRIu32 "." suffix, il), nm)
        mk_add(m, MK_BLK("attn_q.weight"), W, E, E, MK_INIT_RANDOM, 4.0f * sE);
        mk_add(m, MK_BLK("attn_q.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("attn_k.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("attn_k.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("attn_v.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("attn_v.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("attn_output.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("attn_output.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("attn_output_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("attn_output_norm.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("ffn_up.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_BLK("ffn_up.bias"), N, F, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("ffn_down.weight"), W, F, E, MK_INIT_RANDOM, sF);
        mk_add(m, MK_BLK("ffn_down.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_BLK("layer_output_norm.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_BLK("layer_output_norm.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
#undef MK_BLK
    }
}

static void mk_model_free(struct mk_model *m)
{
    free(m->init);
    if (m->meta != NULL)
        ggml_free(m->meta);
    if (m->gguf != NULL)
        gguf_free(m->gguf);
    memset(m, 0, sizeof *m);
}

/* Builds the KV pairs and tensor list. Returns 0, or a thaw code after
 * printing why; *m is freed on failure. */
static int mk_model_build(struct mk_model *m, const struct mk_opts *o, const char *vocab_path)
{
    /* per block: llama 9 tensors, gemma3 and gemma4 13, qwen3 11, lfm2 at
     * most 11, qwen35 at most 14, gpt-oss 16, deepseek2 at most 15, bert
     * 16; plus at most 9 globals (bert with a rank head) */
    size_t max_tensors = (size_t)o->n_layer * 16 + 9;
    struct ggml_init_params gp = {
        .mem_size = max_tensors * ggml_tensor_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    int rc;

    memset(m, 0, sizeof *m);
    m->gguf = gguf_init_empty();
    m->meta = ggml_init(gp);
    m->init = calloc(max_tensors, sizeof *m->init);
    if (m->gguf == NULL || m->meta == NULL || m->init == NULL) {
        rc = THAW_ENOMEM;
        goto fail;
    }

    /* hparams first (general.architecture leads the file, as converters do);
     * the vocab size is only known after the copy */
    mk_set_hparams(m->gguf, o);
    rc = mk_copy_vocab(m->gguf, vocab_path, o, &m->n_vocab, &m->tmpl_name);
    if (rc != 0)
        goto fail;
    mk_set_arch_u32(m->gguf, o->arch, "vocab_size", m->n_vocab);
    if (o->arch == MK_ARCH_BERT && gguf_find_key(m->gguf, "tokenizer.ggml.token_type_count") < 0)
        gguf_set_val_u32(m->gguf, "tokenizer.ggml.token_type_count", 2); /* BERT's sentence A and B */
    if (o->rerank && o->arch == MK_ARCH_QWEN3)
        /* how llama-server lays out a (query, document) pair for this model */
        gguf_set_val_str(m->gguf, "tokenizer.chat_template.rerank", mk_tmpl_qwen3_rerank);

    mk_add_tensors(m, o);
    return 0;

fail:
    if (rc == THAW_ENOMEM)
        fprintf(stderr, "mkmodel: out of memory\n");
    mk_model_free(m);
    return rc;
}

/* Builds --mmproj's projector: a Gemma 3 style vision encoder (clip.cpp's
 * PROJECTOR_TYPE_GEMMA3: a SigLIP ViT, then average pooling, an RMS norm
 * and a projection to the text model's width), or LFM2-VL's (the same
 * ViT, a pixel unshuffle and an MLP), keys and tensor names as
 * llama.cpp's converter writes them (tools/mtmd/clip-impl.h). Returns 0,
 * or THAW_ENOMEM after printing why; *m is freed on failure. */
static int mk_mmproj_build(struct mk_model *m, const struct mk_opts *o)
{
    const int64_t E = MK_V_EMBD, F = MK_V_FF, P = MK_V_PATCH, T = o->n_embd;
    const int64_t n_patches = (MK_V_IMAGE / MK_V_PATCH) * (MK_V_IMAGE / MK_V_PATCH);
    const enum ggml_type W = o->wtype, N = GGML_TYPE_F32;
    const float sE = 1.0f / sqrtf((float)E), sF = 1.0f / sqrtf((float)F);
    size_t max_tensors = (size_t)MK_V_LAYERS * 16 + 12;
    struct ggml_init_params gp = {
        .mem_size = max_tensors * ggml_tensor_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    const float half[3] = {0.5f, 0.5f, 0.5f};
    char name[96];

    memset(m, 0, sizeof *m);
    m->gguf = gguf_init_empty();
    m->meta = ggml_init(gp);
    m->init = calloc(max_tensors, sizeof *m->init);
    if (m->gguf == NULL || m->meta == NULL || m->init == NULL) {
        fprintf(stderr, "mkmodel: out of memory\n");
        mk_model_free(m);
        return THAW_ENOMEM;
    }
    struct gguf_context *g = m->gguf;
    const bool lfm2 = o->arch == MK_ARCH_LFM2;
    gguf_set_val_str(g, "general.architecture", "clip");
    gguf_set_val_str(g, "general.name", lfm2 ? "thaw mkmodel lfm2 projector" : "thaw mkmodel gemma3 projector");
    gguf_set_val_str(g, "clip.projector_type", lfm2 ? "lfm2" : "gemma3");
    gguf_set_val_bool(g, "clip.has_vision_encoder", true);
    gguf_set_val_bool(g, "clip.use_gelu", true);
    gguf_set_val_u32(g, "clip.vision.image_size", MK_V_IMAGE);
    gguf_set_val_u32(g, "clip.vision.patch_size", MK_V_PATCH);
    gguf_set_val_u32(g, "clip.vision.embedding_length", MK_V_EMBD);
    gguf_set_val_u32(g, "clip.vision.feed_forward_length", MK_V_FF);
    gguf_set_val_u32(g, "clip.vision.block_count", MK_V_LAYERS);
    gguf_set_val_u32(g, "clip.vision.projection_dim", o->n_embd);
    gguf_set_val_u32(g, "clip.vision.attention.head_count", MK_V_HEADS);
    gguf_set_val_f32(g, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    gguf_set_val_u32(g, "clip.vision.projector.scale_factor", lfm2 ? MK_V_LFM2_MERGE : MK_V_MERGE);
    gguf_set_arr_data(g, "clip.vision.image_mean", GGUF_TYPE_FLOAT32, half, 3);
    gguf_set_arr_data(g, "clip.vision.image_std", GGUF_TYPE_FLOAT32, half, 3);

    /* the patch convolution stays f32 (its im2col takes the kernel's type) */
    mk_add4(m, "v.patch_embd.weight", N, P, P, 3, E, MK_INIT_RANDOM, 1.0f / sqrtf((float)(3 * P * P)));
    mk_add(m, "v.patch_embd.bias", N, E, 0, MK_INIT_CONST, 0.0f);
    mk_add(m, "v.position_embd.weight", N, E, n_patches, MK_INIT_RANDOM, 0.02f);
    for (uint32_t il = 0; il < MK_V_LAYERS; il++) {
#define MK_VBLK(suffix) (snprintf(name, sizeof name, "v.blk.%" PRIu32 ".%s", il, suffix), name)
        mk_add(m, MK_VBLK("ln1.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_VBLK("ln1.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("attn_q.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_VBLK("attn_q.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("attn_k.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_VBLK("attn_k.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("attn_v.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_VBLK("attn_v.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("attn_out.weight"), W, E, E, MK_INIT_RANDOM, sE);
        mk_add(m, MK_VBLK("attn_out.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("ln2.weight"), N, E, 0, MK_INIT_CONST, 1.0f);
        mk_add(m, MK_VBLK("ln2.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("ffn_up.weight"), W, E, F, MK_INIT_RANDOM, sE);
        mk_add(m, MK_VBLK("ffn_up.bias"), N, F, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, MK_VBLK("ffn_down.weight"), W, F, E, MK_INIT_RANDOM, sF);
        mk_add(m, MK_VBLK("ffn_down.bias"), N, E, 0, MK_INIT_CONST, 0.0f);
#undef MK_VBLK
    }
    mk_add(m, "v.post_ln.weight", N, E, 0, MK_INIT_CONST, 1.0f);
    mk_add(m, "v.post_ln.bias", N, E, 0, MK_INIT_CONST, 0.0f);
    if (lfm2) {
        /* 2x2 patches side by side (E x 4), then Linear, GELU, Linear (clip.cpp's build_ffn: mm.1 up, mm.2 down) */
        const int64_t M = E * MK_V_LFM2_MERGE * MK_V_LFM2_MERGE;
        mk_add(m, "mm.1.weight", W, M, T, MK_INIT_RANDOM, 1.0f / sqrtf((float)M));
        mk_add(m, "mm.1.bias", N, T, 0, MK_INIT_CONST, 0.0f);
        mk_add(m, "mm.2.weight", W, T, T, MK_INIT_RANDOM, 1.0f / sqrtf((float)T));
        mk_add(m, "mm.2.bias", N, T, 0, MK_INIT_CONST, 0.0f);
        return 0;
    }
    mk_add(m, "mm.soft_emb_norm.weight", N, E, 0, MK_INIT_CONST, 1.0f);
    /* (T, E): clip.cpp multiplies by its transpose, E -> T */
    mk_add(m, "mm.input_projection.weight", W, T, E, MK_INIT_RANDOM, sE);
    return 0;
}

/* ---- writer --------------------------------------------------------------- */

struct mk_out {
    int fd;
    uint8_t *buf;   /* MK_WBUF bytes */
    size_t used;    /* bytes pending in buf */
    uint64_t off;   /* file offset of buf[0] + used: bytes produced so far */
};

static int mk_out_flush(struct mk_out *w)
{
    size_t done = 0;

    while (done < w->used) {
        ssize_t n = write(w->fd, w->buf + done, w->used - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)n;
    }
    w->used = 0;
    return 0;
}

static int mk_out_put(struct mk_out *w, const void *p, size_t n)
{
    const uint8_t *src = p;

    while (n > 0) {
        size_t room = MK_WBUF - w->used;
        size_t k = n < room ? n : room;
        int rc;

        memcpy(w->buf + w->used, src, k);
        w->used += k;
        w->off += k;
        src += k;
        n -= k;
        if (w->used == MK_WBUF && (rc = mk_out_flush(w)) != 0)
            return rc;
    }
    return 0;
}

/* Generates tensor i's data and appends it, then zero padding up to the
 * gguf alignment. `data_start` = file offset of the data section. */
static int mk_write_tensor(struct mk_out *w, const struct mk_model *m, const struct mk_opts *o,
                           int64_t i, uint64_t data_start, float *f32, ggml_fp16_t *f16)
{
    const char *name = gguf_get_tensor_name(m->gguf, i);
    enum ggml_type type = gguf_get_tensor_type(m->gguf, i);
    const int64_t *ne = gguf_get_tensor_ne(m->gguf, i);
    uint64_t count = (uint64_t)ne[0] * (uint64_t)ne[1] * (uint64_t)ne[2] * (uint64_t)ne[3];
    size_t align = gguf_get_alignment(m->gguf);
    static const uint8_t zeros[64];
    struct mk_rng rng;
    int rc;

    /* the offsets gguf wrote into the tensor infos must match our stream */
    if (w->off != data_start + gguf_get_tensor_offset(m->gguf, i))
        return THAW_ECORRUPT;

    mk_rng_init(&rng, o->seed, name);
    for (uint64_t done = 0; done < count;) {
        size_t n = count - done < MK_CHUNK ? (size_t)(count - done) : MK_CHUNK;

        if (m->init[i].init == MK_INIT_CONST) {
            for (size_t k = 0; k < n; k++)
                f32[k] = m->init[i].value;
        } else {
            mk_sample(&rng, f32, n, m->init[i].value);
        }
        if (type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(f32, f16, (int64_t)n);
            rc = mk_out_put(w, f16, n * sizeof *f16);
        } else {
            rc = mk_out_put(w, f32, n * sizeof *f32);
        }
        if (rc != 0)
            return rc;
        done += n;
    }
    while ((w->off - data_start) % align != 0) {
        size_t pad = align - (size_t)((w->off - data_start) % align);
        rc = mk_out_put(w, zeros, pad < sizeof zeros ? pad : sizeof zeros);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* fsync the directory holding `path`, so the rename itself is durable. */
static int mk_sync_dir(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int fd, rc = 0;

    if (slash == NULL) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir)
            return -ENAMETOOLONG;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fsync(fd) != 0 && errno != EINVAL) /* some filesystems can't */
        rc = -errno;
    close(fd);
    return rc;
}

/* Writes the whole model to `path` atomically: <path>.tmp.<pid> is written,
 * fsynced and renamed over path, then the directory is fsynced. On failure
 * the temp file is removed and path is untouched. *n_bytes = file size.
 * Returns 0, -errno or a thaw code. */
static int mk_write(const struct mk_model *m, const struct mk_opts *o, const char *path, uint64_t *n_bytes)
{
    char tmp[PATH_MAX];
    struct stat st;
    struct mk_out w = { .fd = -1 };
    size_t meta_size;
    void *meta = NULL;
    float *f32 = NULL;
    ggml_fp16_t *f16 = NULL;
    int n, rc = 0;

    n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -ENAMETOOLONG;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return -EISDIR; /* fail before writing, not at the rename */

    meta_size = gguf_get_meta_size(m->gguf);
    meta = malloc(meta_size);
    w.buf = malloc(MK_WBUF);
    f32 = malloc(MK_CHUNK * sizeof *f32);
    f16 = malloc(MK_CHUNK * sizeof *f16);
    if (meta == NULL || w.buf == NULL || f32 == NULL || f16 == NULL) {
        rc = THAW_ENOMEM;
        goto out_free;
    }
    gguf_get_meta_data(m->gguf, meta);

    w.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        rc = -errno;
        goto out_free;
    }
    rc = mk_out_put(&w, meta, meta_size);
    for (int64_t i = 0; rc == 0 && i < m->n_tensors; i++)
        rc = mk_write_tensor(&w, m, o, i, meta_size, f32, f16);
    if (rc == 0)
        rc = mk_out_flush(&w);
    if (rc == 0 && fsync(w.fd) != 0)
        rc = -errno;
    if (close(w.fd) != 0 && rc == 0)
        rc = -errno;
    w.fd = -1;
    if (rc != 0)
        goto out_unlink;
    if (rename(tmp, path) != 0) {
        rc = -errno;
        goto out_unlink;
    }
    *n_bytes = w.off;
    rc = mk_sync_dir(path);
    goto out_free;

out_unlink:
    unlink(tmp);
out_free:
    free(f16);
    free(f32);
    free(w.buf);
    free(meta);
    return rc;
}

/* libllama's quantizer logs every tensor it writes: keep its warnings and
 * errors, drop the rest. */
static void mk_quant_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* Writes the model quantized to o->ftype at `path`: the f16 model goes to
 * <path>.f16.<pid> first (mk_write, atomic on its own), libllama's quantizer
 * reads it and writes <path>.q.<pid>, which is fsynced and renamed into
 * place; both temp files are gone whatever happens. *n_bytes = file size. */
static int mk_write_quantized(const struct mk_model *m, const struct mk_opts *o, const char *path,
                              uint64_t *n_bytes)
{
    char f16[PATH_MAX], tmp[PATH_MAX];
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    uint64_t f16_bytes = 0;
    struct stat st;
    int fd, rc;

    if (snprintf(f16, sizeof f16, "%s.f16.%ld", path, (long)getpid()) >= (int)sizeof f16 ||
        snprintf(tmp, sizeof tmp, "%s.q.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return -EISDIR;
    rc = mk_write(m, o, f16, &f16_bytes);
    if (rc != 0)
        return rc;
    qp.ftype = (enum llama_ftype)o->ftype;
    llama_log_set(mk_quant_log, NULL);
    if (llama_model_quantize(f16, tmp, &qp) != 0) {
        fprintf(stderr, "mkmodel: libllama's quantizer failed on %s (see above)\n", f16);
        rc = THAW_ELLAMA;
    }
    llama_log_set(NULL, NULL);
    unlink(f16);
    if (rc == 0) {
        fd = open(tmp, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0 || fsync(fd) != 0)
            rc = -errno;
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    *n_bytes = (uint64_t)st.st_size;
    return mk_sync_dir(path);
}

/* ---- main ----------------------------------------------------------------- */

static double mk_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int thaw_mkmodel_main(int argc, char **argv)
{
    const char *prog = argc > 0 && argv[0] != NULL ? argv[0] : "mkmodel";
    struct mk_opts o;
    struct mk_model m;
    char vocab_path[PATH_MAX];
    char *tmpl_text = NULL;
    char swa[64];
    uint64_t n_bytes = 0;
    double t0 = mk_now();
    int rc;

    if (mk_parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: thaw %s -o OUT.gguf [flags]; see thaw %s --help\n", prog, prog);
        return 2;
    }
    if (o.help) {
        mk_usage(stdout, prog);
        return 0;
    }
    rc = mk_resolve_vocab(o.vocab, o.arch, vocab_path, sizeof vocab_path);
    if (rc != 0)
        return 2;
    if (o.tmpl_file != NULL) {
        rc = mk_read_text(o.tmpl_file, &tmpl_text);
        if (rc != 0) {
            fprintf(stderr, "mkmodel: --chat-template-file %s: %s\n", o.tmpl_file,
                    rc == THAW_EINVAL ? "not a regular file, empty, over 1 MiB or "
                                        "holding a NUL byte"
                                      : thaw_strerror(rc));
            return 2;
        }
        o.tmpl_text = tmpl_text;
    }
    rc = mk_model_build(&m, &o, vocab_path);
    free(tmpl_text); /* copied into the gguf context */
    o.tmpl_text = NULL;
    if (rc != 0)
        return rc == THAW_EINVAL ? 2 : 1;

    rc = o.ftype >= 0 ? mk_write_quantized(&m, &o, o.out, &n_bytes) : mk_write(&m, &o, o.out, &n_bytes);
    if (rc != 0) {
        fprintf(stderr, "mkmodel: writing %s: %s\n", o.out, thaw_strerror(rc));
        mk_model_free(&m);
        return 1;
    }
    if (o.mmproj != NULL) {
        struct mk_model v;
        uint64_t v_bytes = 0;
        if (mk_mmproj_build(&v, &o) != 0) {
            mk_model_free(&m);
            return 1;
        }
        rc = mk_write(&v, &o, o.mmproj, &v_bytes);
        if (rc != 0)
            fprintf(stderr, "mkmodel: writing %s: %s\n", o.mmproj, thaw_strerror(rc));
        else if (o.arch == MK_ARCH_LFM2)
            fprintf(stderr,
                    "mkmodel: %s: lfm2 vision projector, %d layers x %d, images at their own size in %d-pixel "
                    "patches, %dx%d a token (64 to 256), projected to %" PRIu32 ", %.2fM params, %.1f MB\n",
                    o.mmproj, MK_V_LAYERS, MK_V_EMBD, MK_V_PATCH, MK_V_LFM2_MERGE, MK_V_LFM2_MERGE, o.n_embd,
                    (double)v.n_params / 1e6, (double)v_bytes / 1e6);
        else
            fprintf(stderr,
                    "mkmodel: %s: gemma3 vision projector, %d layers x %d, %dx%d images in %d-pixel patches, "
                    "%d tokens per image, projected to %" PRIu32 ", %.2fM params, %.1f MB\n",
                    o.mmproj, MK_V_LAYERS, MK_V_EMBD, MK_V_IMAGE, MK_V_IMAGE, MK_V_PATCH, MK_V_TOKENS, o.n_embd,
                    (double)v.n_params / 1e6, (double)v_bytes / 1e6);
        mk_model_free(&v);
        if (rc != 0) {
            mk_model_free(&m);
            return 1;
        }
    }
    swa[0] = '\0';
    if (mk_archs[o.arch].swa)
        snprintf(swa, sizeof swa, ", swa %" PRIu32 " every %" PRIu32 "%s", o.n_swa, o.swa_pattern,
                 o.arch == MK_ARCH_GPTOSS ? ", moe" : "");
    else if (o.arch == MK_ARCH_DEEPSEEK2)
        snprintf(swa, sizeof swa, ", mla %d+%d, moe %" PRIu32 "+1 shared", MK_MLA_KV_LORA, MK_MLA_ROPE, o.n_expert);
    else if (mk_archs[o.arch].hybrid)
        snprintf(swa, sizeof swa, ", attention every %" PRIu32, o.attn_pattern);
    fprintf(stderr,
            "mkmodel: %s: %s %" PRIu32 " layers x %" PRIu32 " (heads %" PRIu32 ", kv %" PRIu32
            ", ff %" PRIu32 "%s), vocab %" PRIu32 " (%s, template %s), %.2fM params, "
            "%s, %.1f MB, seed %" PRIu64 ", %.2f s\n",
            o.out, mk_arch_name(o.arch), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff,
            swa, m.n_vocab, vocab_path, m.tmpl_name,
            (double)m.n_params / 1e6, mk_type_name(&o),
            (double)n_bytes / 1e6, o.seed, mk_now() - t0);
    mk_model_free(&m);
    return 0;
}
