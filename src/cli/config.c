/* config.c — the `thaw serve` flag table, parser and --help.
 *
 * One table describes every flag: its names, its type, where it is stored,
 * its bounds and its help line. Parsing and --help both walk that table, so
 * a flag cannot exist without being documented. The struct it fills, and
 * its defaults, are base/config.h's: the layers below read the config
 * without knowing the command line.
 */
#include "cli/config.h"

#include "cli/flags.h"
#include "cli/preset.h"

#include "base/buf.h"
#include "base/error.h"

#include <ggml.h>
#include <jansson.h>
#include <llama.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether --models-dir names a directory thaw can list; says why not. */
static bool opendir_ok(const char *dir)
{
    DIR *d = opendir(dir);

    if (!d) {
        fprintf(stderr, "thaw: --models-dir: cannot open '%s': %s\n", dir, strerror(errno));
        return false;
    }
    closedir(d);
    return true;
}

/* ---- the flag table -------------------------------------------------------- */

/* The table's kinds are flags.h's. THAW_FLAG_FN: the value goes to the
 * flag's own parser (syntaxes such as "N|auto|all"); THAW_FLAG_NOOP: a
 * llama-server flag accepted with no effect on thaw (its help says why);
 * THAW_FLAG_REFUSE: a llama-server flag thaw does not implement: it stops
 * start-up with "thaw: FLAG: <help>". */
#define OFF(f) offsetof(struct thaw_config, f)
/* a llama-server flag thaw refuses, and one it accepts with no effect */
#define REFUSE(names, arg, why) {names, arg, THAW_FLAG_REFUSE, 0, 0, 0, why, NULL}
#define NOOP(names, arg, why) {names, arg, THAW_FLAG_NOOP, 0, 0, 0, why, NULL}
#define FN(names, arg, fn, help) {names, arg, THAW_FLAG_FN, 0, 0, 0, help, fn}
#define SMP(f) OFF(sampling.f)

static int fn_ngl(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_devices(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_override_tensor(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_cpu_moe(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_split_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_tensor_split(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_load_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_lazy_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_numa(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_override_kv(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_fit(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_fit_target(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_list_devices(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_version(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_flash_attn(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_cache_type(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_rope_scaling(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_rope_scale(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_seed(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_samplers(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_dry_breaker(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_logit_bias(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_log_colors(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_log_verbosity(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_api_key_file(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_cache_ram(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_cpu_mask(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_api_key(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_verbose(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_pooling(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_spec_type(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);
static int fn_spec_default(void *dst, const struct thaw_flag *fl, const char *flag, const char *v);

#define WHY_DOWNLOAD "thaw downloads nothing: pass a local GGUF with -m"
#define WHY_MEDIA "thaw takes images only: no video or audio"
#define WHY_ADAPTER "thaw loads no LoRA adapters or control vectors (a stored conversation's KV would not say which were applied)"
#define WHY_PIN "thaw places the draft model's threads as the model's: use -C, -Cr, --cpu-strict, --prio, --poll"
#define WHY_NGRAM_CACHE "thaw has no ngram-cache: its n-gram drafts come from the conversation itself (--spec-type)"
#define WHY_SYNTH "thaw has no synthetic-acceptance mode: speculation always verifies real drafts"
#define WHY_NGRAM_REMOVED "removed in llama.cpp: use the kind's own, --spec-ngram-<kind>-size-n, -size-m, -min-hits"
/* the n-gram kinds' settings, by kind (base/config.h) */
#define NGRAM(k, f) OFF(spec_ngram[THAW_SPEC_NGRAM_##k].f)
#define WHY_PRESET "presets download their models: " WHY_DOWNLOAD
#define WHY_NOT_YET "not implemented in thaw yet"
#define WHY_AGENT "thaw runs no tools or MCP servers itself: the client does"

static const struct thaw_flag opts[] = {
    /* ---- model + context */
    {"-m,--model", "FILE", THAW_FLAG_STR, OFF(model_path), 0, 0, "model GGUF to serve (required)", NULL},
    {"-a,--alias", "NAME[,NAME]", THAW_FLAG_STR, OFF(alias), 0, 0,
     "model name(s) reported by /v1/models, comma-separated (default: file name)", NULL},
    {"--tags", "TAG[,TAG]", THAW_FLAG_STR, OFF(tags), 0, 0, "model tags listed by /v1/models, comma-separated (informational)",
     NULL},
    {"--chat-template", "NAME|TEXT", THAW_FLAG_STR, OFF(chat_template), 0, 0,
     "chat template: a llama.cpp built-in name (chatml, llama3, gemma, ...) or template text (default: the model's)", NULL},
    {"--chat-template-file", "FILE", THAW_FLAG_STR, OFF(chat_template_file), 0, 0,
     "chat template (Jinja) read from FILE, instead of the model's", NULL},
    {"--jinja", NULL, THAW_FLAG_TRUE, OFF(jinja), 0, 0,
     "render with the model's Jinja template: tools, tool calls, reasoning, response_format (default)", NULL},
    {"--no-jinja", NULL, THAW_FLAG_FALSE, OFF(jinja), 0, 0, "render with llama.cpp's built-in templates only (no tools)", NULL},
    {"--chat-template-kwargs", "JSON", THAW_FLAG_STR, OFF(chat_template_kwargs), 0, 0,
     "extra template variables for every request, e.g. '{\"enable_thinking\":false}' (a request's own win)", NULL},
    {"--reasoning-format", "FORMAT", THAW_FLAG_STR, OFF(reasoning_format), 0, 0,
     "none: reasoning stays in content; deepseek / auto: split into message.reasoning_content", NULL},
    {"-c,--ctx-size", "N", THAW_FLAG_INT, OFF(n_ctx), 0, 1 << 24,
     "total context in tokens, split evenly across slots (0 = the model's training context)", NULL},
    {"-np,--parallel", "N", THAW_FLAG_INT, OFF(n_parallel), 1, 256, "number of slots decoded together", NULL},
    {"-t,--threads", "N", THAW_FLAG_INT, OFF(n_threads), 1, 1024, "threads for generation (default: number of CPUs)", NULL},
    {"-tb,--threads-batch", "N", THAW_FLAG_INT, OFF(n_threads_batch), 1, 1024, "threads for prompt processing (default: same as -t)", NULL},
    {"-b,--batch-size", "N", THAW_FLAG_INT, OFF(n_batch), 1, 1 << 20, "logical batch: most tokens given to one llama_decode", NULL},
    {"-ub,--ubatch-size", "N", THAW_FLAG_INT, OFF(n_ubatch), 1, 1 << 20, "physical batch size", NULL},
    {"-n,--predict,--n-predict", "N", THAW_FLAG_INT, OFF(n_predict), -1, INT_MAX,
     "default max tokens per reply (-1 = until the slot's context is full)", NULL},
    {"--swa-full", NULL, THAW_FLAG_TRUE, OFF(swa_full), 0, 0, "keep a full-size SWA cache (more memory, no checkpoints needed)", NULL},
    {"-fa,--flash-attn", "on|off|auto", THAW_FLAG_FN, 0, 0, 0, "Flash Attention (default: auto)", fn_flash_attn},
    {"-ctk,--cache-type-k", "TYPE", THAW_FLAG_FN, 0, 0, 0,
     "KV cache type for K: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (default: f16; bound into the cache "
     "keys: entries stored under another type are never read)", fn_cache_type},
    {"-ctv,--cache-type-v", "TYPE", THAW_FLAG_FN, 0, 0, 0, "KV cache type for V, as -ctk (default: f16)", fn_cache_type},
    {"--rope-scaling", "none|linear|yarn", THAW_FLAG_FN, 0, 0, 0, "RoPE frequency scaling (default: the model's)", fn_rope_scaling},
    {"--rope-scale", "N", THAW_FLAG_FN, 0, 0, 0, "RoPE context scaling factor: expands the context N times (sets --rope-freq-scale 1/N)",
     fn_rope_scale},
    {"--rope-freq-base", "N", THAW_FLAG_FLOAT, OFF(rope_freq_base), 0, 1e12, "RoPE base frequency (0 = the model's)", NULL},
    {"--rope-freq-scale", "N", THAW_FLAG_FLOAT, OFF(rope_freq_scale), 0, 1e6, "RoPE frequency scaling factor (0 = the model's)", NULL},
    {"--yarn-orig-ctx", "N", THAW_FLAG_INT, OFF(yarn_orig_ctx), 0, 1 << 24, "YaRN: the model's original context (0 = training context)", NULL},
    {"--yarn-ext-factor", "N", THAW_FLAG_FLOAT, OFF(yarn_ext_factor), -1e6, 1e6, "YaRN: extrapolation mix factor (negative = the model's; 0 = full interpolation)", NULL},
    {"--yarn-attn-factor", "N", THAW_FLAG_FLOAT, OFF(yarn_attn_factor), -1e6, 1e6, "YaRN: attention magnitude scale (negative = the model's)", NULL},
    {"--yarn-beta-slow", "N", THAW_FLAG_FLOAT, OFF(yarn_beta_slow), -1e6, 1e6, "YaRN: high correction dim / alpha (negative = the model's)", NULL},
    {"--yarn-beta-fast", "N", THAW_FLAG_FLOAT, OFF(yarn_beta_fast), -1e6, 1e6, "YaRN: low correction dim / beta (negative = the model's)", NULL},
    {"--backend-dir", "DIR", THAW_FLAG_STR, OFF(backend_dir), 0, 0,
     "load ggml's backends (CPU variants, GPU) from DIR: a folder holding only libggml-cpu-x64.so runs the "
     "portable CPU code on any x86 machine (default: $THAW_BACKEND_DIR, else the llama.cpp thaw was built with)", NULL},

    /* ---- embeddings and rerank */
    {"--embedding,--embeddings", NULL, THAW_FLAG_TRUE, OFF(embedding), 0, 0,
     "serve embeddings only (POST /embedding, /embeddings, /v1/embeddings): chat routes answer 501, and no KV "
     "cache is kept or stored for embeddings (they are computed afresh each time)", NULL},
    {"--rerank,--reranking", NULL, THAW_FLAG_TRUE, OFF(reranking), 0, 0,
     "serve reranking too (POST /rerank, /reranking, /v1/rerank, /v1/reranking): --embedding with --pooling "
     "rank; needs a model with a rank head (a reranker)", NULL},
    FN("--pooling", "none|mean|cls|last|rank", fn_pooling,
       "how --embedding pools a prompt's token vectors into one (none: one vector per token, on /embedding(s) "
       "only) (default: the model's)"),
    {"--embd-normalize", "N", THAW_FLAG_INT, OFF(embd_normalize), -1, 1 << 20,
     "normalisation of pooled embeddings: -1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, "
     ">2 p-norm (a request's embd_normalize wins)", NULL},

    /* ---- placement and memory */
    FN("-ngl,--gpu-layers,--n-gpu-layers", "N|auto|all", fn_ngl,
       "layers to keep in GPU memory: a number, 'auto' (all, or what -fit finds fits) or 'all' (default: auto)"),
    FN("-dev,--device", "DEV[,DEV]", fn_devices, "devices to offload to, by name (none = no offload; see --list-devices)"),
    FN("--list-devices", NULL, fn_list_devices, "print the devices ggml's backends offer, and exit"),
    FN("-ot,--override-tensor", "PATTERN=BUFT[,...]", fn_override_tensor,
       "put tensors whose name matches the regex PATTERN in buffer type BUFT (e.g. 'exps=CPU'); repeatable"),
    FN("-cmoe,--cpu-moe", NULL, fn_cpu_moe, "keep every layer's Mixture-of-Experts weights in host memory"),
    FN("-ncmoe,--n-cpu-moe", "N", fn_cpu_moe, "keep the Mixture-of-Experts weights of the first N layers in host memory"),
    FN("-ncffn,--n-cpu-ffn", "N", fn_cpu_moe, "keep the dense FFN weights of the first N layers in host memory"),
    FN("-sm,--split-mode", "none|layer|row|tensor", fn_split_mode, "how to split the model across GPUs (default: layer)"),
    FN("-ts,--tensor-split", "N0,N1,...", fn_tensor_split, "proportion of the model for each GPU, e.g. 3,1"),
    {"-mg,--main-gpu", "INDEX", THAW_FLAG_INT, OFF(main_gpu), 0, THAW_MAX_DEVICES - 1,
     "the GPU for the whole model (-sm none) or for intermediate results and KV (-sm row)", NULL},
    {"-kvo,--kv-offload", NULL, THAW_FLAG_TRUE, OFF(kv_offload), 0, 0, "KV cache and its ops on the GPU (default)", NULL},
    {"-nkvo,--no-kv-offload", NULL, THAW_FLAG_FALSE, OFF(kv_offload), 0, 0, "KV cache in host memory", NULL},
    {"--op-offload", NULL, THAW_FLAG_TRUE, OFF(op_offload), 0, 0, "offload host tensor operations to the device (default)", NULL},
    {"--no-op-offload", NULL, THAW_FLAG_FALSE, OFF(op_offload), 0, 0, "do not offload host tensor operations", NULL},
    FN("-fit,--fit", "on|off", fn_fit,
       "lower -ngl / -c (those left unset) until the model fits the devices' free memory (default: on)"),
    FN("-fitt,--fit-target", "MiB0,MiB1,...", fn_fit_target, "memory -fit leaves free on each device (one value: every device)"),
    {"-fitc,--fit-ctx", "N", THAW_FLAG_INT, OFF(fit_ctx), 0, 1 << 24, "-fit never lowers the context below this", NULL},
    FN("--mlock", NULL, fn_load_mode, "keep the model in RAM (no swapping or compression; read, not mapped)"),
    FN("--mmap", NULL, fn_load_mode, "memory-map the model"),
    FN("--no-mmap", NULL, fn_load_mode, "read the model into memory instead of mapping it (slower load, fewer page-outs)"),
    FN("-dio,--direct-io", NULL, fn_load_mode, "read the model with direct I/O where available"),
    FN("-ndio,--no-direct-io", NULL, fn_load_mode, "no direct I/O (plain reads)"),
    FN("-lm,--load-mode", "auto|none|mmap|mlock|mmap+mlock|dio", fn_load_mode, "how the model is loaded (default: auto)"),
    FN("-lzm,--lazy-mode", "on|auto|off", fn_lazy_mode, "read marked tensors (e.g. per-layer embeddings) on demand (default: auto)"),
    FN("--numa", "distribute|isolate|numactl", fn_numa, "NUMA optimisations (default: off)"),
    {"--repack", NULL, THAW_FLAG_TRUE, OFF(repack), 0, 0, "repack weights for the CPU's fastest kernels (default)", NULL},
    {"-nr,--no-repack", NULL, THAW_FLAG_FALSE, OFF(repack), 0, 0, "no weight repacking", NULL},
    {"--no-host", NULL, THAW_FLAG_TRUE, OFF(no_host), 0, 0, "bypass the host buffer so extra buffer types can be used", NULL},
    {"--check-tensors", NULL, THAW_FLAG_TRUE, OFF(check_tensors), 0, 0, "check the model's tensor data for invalid values", NULL},
    FN("--override-kv", "KEY=TYPE:VALUE[,...]", fn_override_kv,
       "override model metadata (TYPE: int, float, bool, str), e.g. tokenizer.ggml.add_bos_token=bool:false; repeatable"),

    /* ---- sampling defaults: a request's own fields win */
    FN("--samplers", "S1;S2;...", fn_samplers,
       "sampler order (default: penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    FN("--sampler-seq,--sampling-seq", "LETTERS", fn_samplers, "sampler order, one letter each (default: edskypmxt)"),
    FN("-s,--seed", "SEED", fn_seed, "sampling seed for requests without one (-1 = random each request)"),
    {"--ignore-eos", NULL, THAW_FLAG_TRUE, SMP(ignore_eos), 0, 0, "never end a reply at an end-of-generation token", NULL},
    FN("-l,--logit-bias", "TOKEN_ID(+|-)BIAS", fn_logit_bias,
       "add BIAS to a token's logit for every request, e.g. 15043+1, 15043-1, 2-inf (bans it); repeatable"),
    {"--temp,--temperature", "N", THAW_FLAG_FLOAT, SMP(temp), -1e6, 1e6, "temperature (<= 0: greedy)", NULL},
    {"--top-k", "N", THAW_FLAG_INT, SMP(top_k), -1, 1 << 30, "top-k (0 = off)", NULL},
    {"--top-p", "N", THAW_FLAG_FLOAT, SMP(top_p), 0, 1, "top-p (1 = off)", NULL},
    {"--min-p", "N", THAW_FLAG_FLOAT, SMP(min_p), 0, 1, "min-p (0 = off)", NULL},
    {"--top-nsigma,--top-n-sigma", "N", THAW_FLAG_FLOAT, SMP(top_n_sigma), -1e6, 1e6, "top-n-sigma (< 0 = off)", NULL},
    {"--typical,--typical-p", "N", THAW_FLAG_FLOAT, SMP(typ_p), 0, 1, "locally typical sampling p (1 = off)", NULL},
    {"--xtc-probability", "N", THAW_FLAG_FLOAT, SMP(xtc_probability), 0, 1, "XTC probability (0 = off)", NULL},
    {"--xtc-threshold", "N", THAW_FLAG_FLOAT, SMP(xtc_threshold), 0, 1, "XTC threshold (> 0.5 = off)", NULL},
    {"--repeat-last-n", "N", THAW_FLAG_INT, SMP(penalty_last_n), -1, 1 << 24, "tokens the penalties look back (0 = off, -1 = the slot's context)", NULL},
    {"--repeat-penalty", "N", THAW_FLAG_FLOAT, SMP(penalty_repeat), 0, 1e6, "repeat penalty (1 = off)", NULL},
    {"--presence-penalty", "N", THAW_FLAG_FLOAT, SMP(penalty_present), -1e6, 1e6, "presence penalty (0 = off)", NULL},
    {"--frequency-penalty", "N", THAW_FLAG_FLOAT, SMP(penalty_freq), -1e6, 1e6, "frequency penalty (0 = off)", NULL},
    {"--dry-multiplier", "N", THAW_FLAG_FLOAT, SMP(dry_multiplier), 0, 1e6, "DRY multiplier (0 = off)", NULL},
    {"--dry-base", "N", THAW_FLAG_FLOAT, SMP(dry_base), 0, 1e6, "DRY base", NULL},
    {"--dry-allowed-length", "N", THAW_FLAG_INT, SMP(dry_allowed_length), 0, 1 << 24, "DRY: repetitions longer than this are penalised", NULL},
    {"--dry-penalty-last-n", "N", THAW_FLAG_INT, SMP(dry_penalty_last_n), -1, 1 << 24, "DRY look-back (0 = off, -1 = the slot's context)", NULL},
    FN("--dry-sequence-breaker", "STRING", fn_dry_breaker,
       "a DRY sequence breaker; the first replaces the defaults (\\n : \" *), 'none' clears them; repeatable"),
    {"--adaptive-target", "N", THAW_FLAG_FLOAT, SMP(adaptive_target), -1, 1, "adaptive-p target probability (< 0 = off; needs adaptive_p in --samplers)", NULL},
    {"--adaptive-decay", "N", THAW_FLAG_FLOAT, SMP(adaptive_decay), 0, 0.99, "adaptive-p decay", NULL},
    {"--dynatemp-range", "N", THAW_FLAG_FLOAT, SMP(dynatemp_range), 0, 1e6, "dynamic temperature range (0 = off)", NULL},
    {"--dynatemp-exp", "N", THAW_FLAG_FLOAT, SMP(dynatemp_exponent), 0, 1e6, "dynamic temperature exponent", NULL},
    {"--mirostat", "N", THAW_FLAG_INT, SMP(mirostat), 0, 2, "Mirostat (0 = off, 1, 2 = Mirostat 2.0; replaces the samplers)", NULL},
    {"--mirostat-lr", "N", THAW_FLAG_FLOAT, SMP(mirostat_eta), 0, 1e6, "Mirostat learning rate (eta)", NULL},
    {"--mirostat-ent", "N", THAW_FLAG_FLOAT, SMP(mirostat_tau), 0, 1e6, "Mirostat target entropy (tau)", NULL},

    /* ---- speculative decoding */
    FN("--spec-type", "TYPE[,TYPE]", fn_spec_type,
       "kinds of speculative decoding, tried in this order: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod\n"
       "(drafts copied from the slot's own conversation), then draft-simple (the draft model, -md); none = off\n"
       "(default: draft-simple with -md, else none; -md drafts after any n-gram kind given)"),
    {"--spec-ngram-simple-size-n", "N", THAW_FLAG_INT, NGRAM(SIMPLE, size_n), 1, 1024,
     "ngram-simple: tokens of the n-gram looked up in the conversation (the last ones, the sampled one included)", NULL},
    {"--spec-ngram-simple-size-m", "N", THAW_FLAG_INT, NGRAM(SIMPLE, size_m), 1, 1024,
     "ngram-simple: most tokens drafted: those that followed the n-gram's latest earlier occurrence", NULL},
    {"--spec-ngram-simple-min-hits", "N", THAW_FLAG_INT, NGRAM(SIMPLE, min_hits), 1, 65535,
     "ngram-simple: earlier occurrences of the n-gram needed to draft", NULL},
    {"--spec-ngram-map-k-size-n", "N", THAW_FLAG_INT, NGRAM(MAP_K, size_n), 1, 1024,
     "ngram-map-k: tokens of the n-gram looked up", NULL},
    {"--spec-ngram-map-k-size-m", "N", THAW_FLAG_INT, NGRAM(MAP_K, size_m), 1, 1024,
     "ngram-map-k: most tokens drafted; a key drafts no more than it had accepted the time before", NULL},
    {"--spec-ngram-map-k-min-hits", "N", THAW_FLAG_INT, NGRAM(MAP_K, min_hits), 1, 65535,
     "ngram-map-k: earlier occurrences of the n-gram needed to draft", NULL},
    {"--spec-ngram-map-k4v-size-n", "N", THAW_FLAG_INT, NGRAM(MAP_K4V, size_n), 1, 1024,
     "ngram-map-k4v: tokens of the n-gram looked up", NULL},
    {"--spec-ngram-map-k4v-size-m", "N", THAW_FLAG_INT, NGRAM(MAP_K4V, size_m), 1, 1024,
     "ngram-map-k4v: tokens drafted: the most frequent of up to 4 continuations seen, when it dominates", NULL},
    {"--spec-ngram-map-k4v-min-hits", "N", THAW_FLAG_INT, NGRAM(MAP_K4V, min_hits), 1, 65535,
     "ngram-map-k4v: earlier occurrences of the n-gram needed to draft", NULL},
    {"--spec-ngram-mod-n-match", "N", THAW_FLAG_INT, NGRAM(MOD, size_n), 1, 1024,
     "ngram-mod: tokens of the n-gram looked up for each drafted token", NULL},
    {"--spec-ngram-mod-n-min", "N", THAW_FLAG_INT, NGRAM(MOD, n_min), 0, 1024,
     "ngram-mod: shortest draft worth verifying", NULL},
    {"--spec-ngram-mod-n-max", "N", THAW_FLAG_INT, NGRAM(MOD, size_m), 0, 1024, "ngram-mod: most tokens drafted", NULL},
    FN("--spec-default", NULL, fn_spec_default, "llama-server's default speculation: ngram-mod, n-match 24, n-min 48, n-max 64"),
    {"-md,--model-draft,--spec-draft-model", "FILE", THAW_FLAG_STR, OFF(draft_path), 0, 0,
     "draft model for speculative decoding (same vocabulary as -m)", NULL},
    {"-cd,--ctx-size-draft", "N", THAW_FLAG_INT, OFF(n_ctx_draft), 0, 1 << 24, "draft context, total (0 = same as -c)", NULL},
    {"--draft-max,--draft,--draft-n,--spec-draft-n-max", "N", THAW_FLAG_INT, OFF(draft_max), 0, 256,
     "most tokens drafted per step (0 = speculation off)", NULL},
    {"--draft-min,--draft-n-min,--spec-draft-n-min", "N", THAW_FLAG_INT, OFF(draft_min), 0, 256,
     "drafts shorter than this are not verified", NULL},
    {"--draft-p-min,--spec-draft-p-min", "P", THAW_FLAG_FLOAT, OFF(draft_p_min), 0, 1,
     "stop drafting when the draft's top token is less likely than this", NULL},
    {"-td,--threads-draft,--spec-draft-threads", "N", THAW_FLAG_INT, OFF(draft_threads), 0, 1024,
     "the draft's generation threads (0 = same as -t)", NULL},
    {"-tbd,--threads-batch-draft,--spec-draft-threads-batch", "N", THAW_FLAG_INT, OFF(draft_threads_batch), 0, 1024,
     "the draft's prompt threads (0 = same as -tb)", NULL},
    FN("-ctkd,--cache-type-k-draft,--spec-draft-type-k", "TYPE", fn_cache_type, "the draft's KV cache type for K, as -ctk"),
    FN("-ctvd,--cache-type-v-draft,--spec-draft-type-v", "TYPE", fn_cache_type, "the draft's KV cache type for V, as -ctv"),
    FN("-ngld,--spec-draft-ngl,--gpu-layers-draft,--n-gpu-layers-draft", "N|auto|all", fn_ngl,
       "the draft model's layers in GPU memory, as -ngl (default: auto)"),
    FN("-devd,--spec-draft-device,--device-draft", "DEV[,DEV]", fn_devices, "the draft model's devices, as -dev"),
    FN("-otd,--spec-draft-override-tensor,--override-tensor-draft", "PATTERN=BUFT[,...]", fn_override_tensor,
       "the draft model's tensor overrides, as -ot"),
    FN("-cmoed,--spec-draft-cpu-moe,--cpu-moe-draft", NULL, fn_cpu_moe, "the draft model's experts in host memory, as -cmoe"),
    FN("-ncmoed,--spec-draft-n-cpu-moe,--spec-draft-ncmoe,--n-cpu-moe-draft", "N", fn_cpu_moe,
       "the draft model's first N layers' experts in host memory, as -ncmoe"),

    /* ---- images */
    {"-mm,--mmproj", "FILE", THAW_FLAG_STR, OFF(mmproj_path), 0, 0,
     "the model's vision projector (GGUF): requests may carry images (image_url data: URLs, Anthropic image "
     "blocks, Responses input_image), cached by their content like text; without it an image is a 400", NULL},
    {"--mmproj-offload", NULL, THAW_FLAG_TRUE, OFF(mmproj_offload), 0, 0, "run the projector on the GPU when there is one (default)", NULL},
    {"--no-mmproj-offload", NULL, THAW_FLAG_FALSE, OFF(mmproj_offload), 0, 0, "run the projector on the CPU", NULL},
    {"--image-min-tokens", "N", THAW_FLAG_INT, OFF(image_min_tokens), 0, 1 << 20,
     "fewest tokens an image becomes, for projectors with dynamic resolution (0 = the projector's)", NULL},
    {"--image-max-tokens", "N", THAW_FLAG_INT, OFF(image_max_tokens), 0, 1 << 20,
     "most tokens an image becomes, for projectors with dynamic resolution (0 = the projector's)", NULL},
    {"--media-path", "DIR", THAW_FLAG_STR, OFF(media_path), 0, 0,
     "file:// image URLs are read from under DIR (a path that leaves it, by '..' or a link, is a 400); "
     "without it file:// URLs are refused. thaw fetches no http(s) URLs", NULL},

    /* ---- serving */
    {"--host", "ADDR", THAW_FLAG_STR, OFF(host), 0, 0, "address to listen on", NULL},
    {"--port", "N", THAW_FLAG_INT, OFF(port), 0, 65535, "port to listen on (0 = pick a free one and log it)", NULL},
    {"--api-key", "KEY[,KEY]", THAW_FLAG_FN, 0, 0, 0,
     "require 'Authorization: Bearer KEY'; repeat for several keys, each its own cache namespace "
     "(derived from the key itself: stable across reordering, gone with the key)", fn_api_key},
    FN("--api-key-file", "FILE", fn_api_key_file, "API keys from FILE, one per line ('#' starts a comment line)"),
    {"-sps,--slot-prompt-similarity", "F", THAW_FLAG_FLOAT, OFF(slot_prompt_similarity), 0, 1,
     "reuse the slot whose prompt shares more than this fraction with the request (0 = least recently used only)", NULL},
    {"--fixup-wait-ms", "MS", THAW_FLAG_INT, OFF(fixup_wait_ms), 0, 1 << 20,
     "after a reply a slot re-decodes it as the next turn will present it, then stores it; a request that needs "
     "that slot waits for this work when it has at most this long left, else cuts it short (what is done is "
     "stored; the conversation's next turn prefills the rest)", NULL},
    {"--shutdown-timeout", "S", THAW_FLAG_INT, OFF(shutdown_timeout_s), 1, 3600,
     "on SIGTERM or SIGINT: requests in flight get an error, the slots' re-decoding gets a quarter of this, "
     "then every finished turn still queued is written (in one group commit: its bytes, two syncs) before exit; "
     "meant to end well inside a supervisor's grace (docker stop: 10 s). A second signal exits at once, losing "
     "what is still queued (turns already on disk are safe)", NULL},
    {"--cache-prompt", NULL, THAW_FLAG_TRUE, OFF(cache_prompt), 0, 0, "reuse the common prefix a slot already holds (default)", NULL},
    {"--no-cache-prompt", NULL, THAW_FLAG_FALSE, OFF(cache_prompt), 0, 0, "always prefill the whole prompt", NULL},
    {"--max-queue", "N", THAW_FLAG_INT, OFF(max_queue), 0, 1 << 20, "requests that may wait for a slot; beyond that: 503", NULL},
    {"--max-body", "BYTES", THAW_FLAG_SIZE, OFF(max_body), 1024, (double)(1ull << 32), "largest request body accepted; beyond that: 413", NULL},
    {"--threads-http", "N", THAW_FLAG_INT, OFF(threads_http), 1, 256,
     "HTTP event-loop threads (connections are multiplexed: this is not a connection limit)", NULL},
    {"--max-connections", "N", THAW_FLAG_INT, OFF(max_connections), 1, 1 << 20,
     "open HTTP connections in all; more are refused (raised to fit the open-file limit)", NULL},
    {"--max-connections-per-client", "N", THAW_FLAG_INT, OFF(max_per_client), 0, 1 << 20,
     "open connections per client address (0 = no limit; use 0 behind a proxy, where every client has its address)", NULL},
    {"--cors-origin,--cors-origins", "ORIGIN[,ORIGIN]", THAW_FLAG_STR, OFF(cors_origin), 0, 0,
     "let browser pages from these origins call the API (CORS); '*' for any, refused with --api-key", NULL},
    {"-to,--timeout", "SECONDS", THAW_FLAG_INT, OFF(timeout_s), 1, 86400,
     "drop a connection idle this long, or a client that takes longer to send its request body", NULL},
    {"--webui,--ui", NULL, THAW_FLAG_TRUE, OFF(webui), 0, 0,
     "serve the chat page with its cache view at / (default; the API it calls needs the key as usual)", NULL},
    {"--no-webui,--no-ui", NULL, THAW_FLAG_FALSE, OFF(webui), 0, 0, "no page: / and /webui/ answer 404", NULL},
    {"--metrics", NULL, THAW_FLAG_TRUE, OFF(metrics), 0, 0,
     "GET /metrics: Prometheus text, thaw's names and llama-server's (llamacpp:*) (default, unlike llama-server)",
     NULL},
    {"--no-metrics", NULL, THAW_FLAG_FALSE, OFF(metrics), 0, 0, "GET /metrics answers 501", NULL},
    {"--api-prefix", "PREFIX", THAW_FLAG_STR, OFF(api_prefix), 0, 0,
     "serve every route under PREFIX (e.g. /llm: /llm/v1/chat/completions), without the trailing slash", NULL},
    {"--ssl-key-file", "FILE", THAW_FLAG_STR, OFF(ssl_key_file), 0, 0, "serve HTTPS with this PEM private key (and --ssl-cert-file)", NULL},
    {"--ssl-cert-file", "FILE", THAW_FLAG_STR, OFF(ssl_cert_file), 0, 0, "serve HTTPS with this PEM certificate (and --ssl-key-file)", NULL},
    {"--slots", NULL, THAW_FLAG_TRUE, OFF(slots), 0, 0,
     "GET /slots: each slot's conversation (your own namespace's text only), phase and cache tier (default)", NULL},
    {"--no-slots", NULL, THAW_FLAG_FALSE, OFF(slots), 0, 0, "GET /slots answers 501", NULL},
    {"--sse-ping-interval", "SECONDS", THAW_FLAG_INT, OFF(sse_ping_s), -1, 86400,
     "a streamed reply silent this long gets an SSE comment (':'), so clients and proxies keep it open (<= 0: never)", NULL},
    {"-rea,--reasoning", "on|off|auto", THAW_FLAG_STR, OFF(reasoning), 0, 0,
     "let the template think (on: enable_thinking true, off: false, auto: the template's default); "
     "--chat-template-kwargs, when it names enable_thinking, wins", NULL},
    {"--reasoning-budget", "N", THAW_FLAG_INT, OFF(reasoning_budget), -1, INT_MAX,
     "tokens a reply may think (inside the template's thinking block) before its end tag is forced: "
     "-1 unlimited, 0 no thinking (enable_thinking false); a request's reasoning_budget_tokens wins (default -1)",
     NULL},
    {"--reasoning-budget-message", "MESSAGE", THAW_FLAG_STR, OFF(reasoning_budget_message), 0, 0,
     "text forced before the end-of-thinking tag when the budget is spent (default: none)", NULL},
    {"--reasoning-effort", "LEVEL", THAW_FLAG_STR, OFF(reasoning_effort), 0, 0,
     "the template's reasoning_effort (gpt-oss and others): default (the template's), minimal, low, medium, high, "
     "xhigh, max; a request's reasoning_effort wins", NULL},
    {"--reasoning-preserve", NULL, THAW_FLAG_TRUE, OFF(reasoning_preserve), 0, 0,
     "render earlier turns' reasoning in history where the template can (its preserve_reasoning) (default)", NULL},
    {"--no-reasoning-preserve", NULL, THAW_FLAG_FALSE, OFF(reasoning_preserve), 0, 0,
     "render only the template's default reasoning in history (preserve_reasoning false)", NULL},
    {"--prefill-assistant", NULL, THAW_FLAG_TRUE, OFF(prefill_assistant), 0, 0,
     "a trailing assistant message is a prefill the reply continues (default)", NULL},
    {"--no-prefill-assistant", NULL, THAW_FLAG_FALSE, OFF(prefill_assistant), 0, 0,
     "a trailing assistant message is a whole turn; the reply is a new one after it", NULL},
    {"--props", NULL, THAW_FLAG_TRUE, OFF(props), 0, 0,
     "POST /props may change the reasoning budget and its message at run time (GET /props is always on)", NULL},
    {"--grammar", "GBNF", THAW_FLAG_STR, OFF(grammar), 0, 0,
     "constrain replies with this grammar when a request sets no grammar, schema or tools", NULL},
    {"--grammar-file", "FILE", THAW_FLAG_STR, OFF(grammar_file), 0, 0, "--grammar read from FILE", NULL},
    {"-j,--json-schema", "SCHEMA", THAW_FLAG_STR, OFF(json_schema), 0, 0,
     "constrain replies to JSON matching SCHEMA when a request sets no grammar, schema or tools ('{}': any JSON)", NULL},
    {"-jf,--json-schema-file", "FILE", THAW_FLAG_STR, OFF(json_schema_file), 0, 0, "--json-schema read from FILE", NULL},

    /* ---- caches */
    {"--kv-cache-dir", "PATH", THAW_FLAG_STR, OFF(kv_cache_dir), 0, 0, "enable the on-disk KV cache in PATH (created 0700)", NULL},
    {"--kv-cache-max", "MiB", THAW_FLAG_U64, OFF(kv_cache_max_mib), 0, (double)(1ull << 40),
     "disk cache budget over every file, blocks included: the least recently used conversations are evicted first, "
     "with the blocks only they used (0 = no limit)", NULL},
    {"--kv-cache-ttl", "SECONDS", THAW_FLAG_U64, OFF(kv_cache_ttl_s), 0, (double)(1ull << 40), "disk entries unused this long are evicted", NULL},
    {"--kv-cache-queue", "MiB", THAW_FLAG_U64, OFF(kv_cache_queue_mib), 0, (double)(1ull << 30),
     "state waiting for the disk writer; a store beyond it is dropped and logged (0 = no limit)", NULL},
    {"--kv-cache-block", "N", THAW_FLAG_INT, OFF(kv_cache_block), 0, 1 << 20,
     "store the disk cache as blocks of N tokens, each written once and shared by every conversation with the same "
     "prefix, plus a small manifest per turn (0 = a whole state per turn; recurrent models always use whole states)", NULL},
    {"--kv-cache-min-tokens", "N", THAW_FLAG_INT, OFF(kv_cache_min_tokens), 0, INT_MAX, "do not store conversations shorter than this", NULL},
    FN("-cram,--cache-ram", "MiB", fn_cache_ram, "in-memory cache tier (0 = off, never disables the disk tier; -1 = no limit)"),
    {"--kv-shared", "s3://BUCKET[/PREFIX]", THAW_FLAG_STR, OFF(kv_shared), 0, 0,
     "shared cache tier on an S3-compatible store, for several replicas: every stored turn is uploaded, and a "
     "conversation the local tiers lack is fetched from there (needs --kv-cache-dir and --kv-shared-secret-file; "
     "credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION or AWS_DEFAULT_REGION)", NULL},
    {"--kv-shared-endpoint", "URL", THAW_FLAG_STR, OFF(kv_shared_endpoint), 0, 0,
     "the store's address, http(s)://HOST[:PORT] (default: $AWS_ENDPOINT_URL_S3, then $AWS_ENDPOINT_URL)", NULL},
    {"--kv-shared-secret-file", "FILE", THAW_FLAG_STR, OFF(kv_shared_secret_file), 0, 0,
     "the cluster secret (>= 16 bytes, the same file on every replica): objects are encrypted and authenticated "
     "with it, and one that fails is never used", NULL},
    {"--kv-shared-timeout-ms", "MS", THAW_FLAG_INT, OFF(kv_shared_timeout_ms), 1, 600000,
     "longest a request waits for the shared tier before it is served by prefill", NULL},
    {"--kv-shared-retry-s", "SECONDS", THAW_FLAG_INT, OFF(kv_shared_retry_s), 1, 86400,
     "after 3 failures in a row, leave the store alone this long (circuit breaker)", NULL},
    {"--kv-shared-queue", "N", THAW_FLAG_INT, OFF(kv_shared_queue), 1, 1 << 20,
     "uploads that may wait; beyond that they are dropped and counted", NULL},
    {"--kv-tap", NULL, THAW_FLAG_TRUE, OFF(kv_tap), 0, 0,
     "stores cut each new block straight from the KV cache's memory: as much work on a long conversation as on "
     "a short one (default; CPU only)", NULL},
    {"--no-kv-tap", NULL, THAW_FLAG_FALSE, OFF(kv_tap), 0, 0,
     "stores capture each state whole through libllama, then split it (slower on long conversations; a "
     "diagnostic)", NULL},
    {"-ctxcp,--ctx-checkpoints,--swa-checkpoints", "N", THAW_FLAG_INT, OFF(ctx_checkpoints), 0, 1024,
     "context checkpoints kept per slot (SWA / recurrent models)", NULL},
    {"-cpent,--checkpoint-every-n-tokens", "N", THAW_FLAG_INT, OFF(checkpoint_every), 0, 1 << 24,
     "hybrid / recurrent models: also checkpoint the recurrent state every N tokens of a long prefill, stored as "
     "snapshots new conversations can resume at (besides the end of every turn and of the leading system "
     "messages); 0 = only those (default 4096)", NULL},
    {"--kv-snapshot-idle", "SECONDS", THAW_FLAG_INT, OFF(kv_snapshot_idle_s), 0, 1 << 24,
     "hybrid models: the recurrent state at a turn's end stays in the slot and is written to --kv-cache-dir only "
     "when another conversation takes the slot, at shutdown, or after the slot has been idle this long (0 = never "
     "for idleness). A crash loses only those not written yet: such a conversation resumes at its deepest stored "
     "snapshot and prefills the rest", NULL},

    /* ---- logging */
    FN("-v,--verbose,--log-verbose", NULL, fn_verbose, "more log output (repeatable)"),
    FN("--log-quiet", NULL, fn_verbose, "only warnings and errors"),
    FN("-lv,--verbosity,--log-verbosity", "N", fn_log_verbosity,
       "llama-server's levels: 0 nothing but output, 1 errors, 2 warnings, 3 info (default), 4+ debug"),
    FN("--log-disable", NULL, fn_log_verbosity, "no log lines at all"),
    {"--log-file", "FILE", THAW_FLAG_STR, OFF(log_file), 0, 0, "append every log line to FILE too", NULL},
    FN("--log-colors", "on|off|auto", fn_log_colors, "colour the level of each line (auto: when stderr is a terminal)"),
    {"--log-prefix", NULL, THAW_FLAG_TRUE, OFF(log_prefix), 0, 0, "the level on each line (default)", NULL},
    {"--no-log-prefix", NULL, THAW_FLAG_FALSE, OFF(log_prefix), 0, 0, "no level on the lines", NULL},
    {"--log-timestamps", NULL, THAW_FLAG_TRUE, OFF(log_timestamps), 0, 0, "the time on each line (default)", NULL},
    {"--no-log-timestamps", NULL, THAW_FLAG_FALSE, OFF(log_timestamps), 0, 0, "no time on the lines", NULL},
    FN("--version", NULL, fn_version, "print the version and exit"),

    /* ---- llama-server flags accepted with no effect on thaw */
    NOOP("--no-kv-unified,-no-kvu", NULL, "thaw always keeps each slot's KV cells apart"),
    NOOP("--cache-idle-slots", NULL, "thaw always stores a slot's conversation"),
    NOOP("--no-context-shift", NULL, "thaw never shifts the context"),
    NOOP("-cb,--cont-batching", NULL, "thaw always batches its slots together"),
    NOOP("--perf", NULL, "thaw reports its own timings with every reply"),
    NOOP("--no-perf", NULL, "libllama's performance counters are always off"),
    NOOP("-e,--escape", NULL, "there is no prompt on thaw's command line to unescape"),
    NOOP("--no-escape", NULL, "there is no prompt on thaw's command line to unescape"),
    NOOP("--warmup", NULL, "thaw runs no warm-up decode"),
    NOOP("--no-warmup", NULL, "thaw runs no warm-up decode"),
    NOOP("-bs,--backend-sampling", NULL, "thaw samples on the CPU"),
    NOOP("-dt,--defrag-thold", "N", "deprecated in llama.cpp: the KV cache needs no defragmenting"),
    NOOP("--offline", NULL, "thaw never uses the network for models"),
    NOOP("--no-mmproj,--no-mmproj-auto", NULL, "thaw loads a projector only when --mmproj names one"),
    NOOP("--mmproj-auto", NULL, "thaw downloads no projector"),
    NOOP("--no-agent,-no-ag", NULL, WHY_AGENT),
    NOOP("--no-ui-mcp-proxy,--no-webui-mcp-proxy", NULL, WHY_AGENT),
    NOOP("--no-cors-credentials", NULL, "thaw never allows credentialed CORS requests"),
    NOOP("--no-skip-chat-parsing", NULL, "thaw always parses the reply"),
    NOOP("--no-spec-draft-backend-sampling", NULL, "thaw samples on the CPU"),
    NOOP("--spec-draft-backend-sampling", NULL, "thaw samples on the CPU"),

    /* ---- llama-server flags thaw refuses */
    REFUSE("-cl,--cache-list", NULL, WHY_DOWNLOAD),
    REFUSE("--completion-bash", NULL, "thaw prints no shell completion script"),
    FN("-C,--cpu-mask", "M", fn_cpu_mask, "CPUs the generation threads may run on: a hex mask, the last digit CPUs 0-3 (adds to -Cr)"),
    FN("-Cr,--cpu-range", "LO-HI", fn_cpu_mask, "CPUs the generation threads may run on, a range (adds to -C)"),
    {"--cpu-strict", "0|1", THAW_FLAG_INT, OFF(cpu.strict), 0, 1, "pin each generation thread to one CPU of the mask, in order", NULL},
    {"--prio", "N", THAW_FLAG_INT, OFF(cpu.prio), -1, 3, "thread priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime", NULL},
    {"--poll", "0..100", THAW_FLAG_INT, OFF(cpu.poll), 0, 100,
     "how long a waiting compute thread spins before it sleeps (0: no spinning; 100: mostly spinning)", NULL},
    FN("-Cb,--cpu-mask-batch", "M", fn_cpu_mask, "-C for the prompt-processing threads (default: same as -C)"),
    FN("-Crb,--cpu-range-batch", "LO-HI", fn_cpu_mask, "-Cr for the prompt-processing threads (default: same as -Cr)"),
    {"--cpu-strict-batch", "0|1", THAW_FLAG_INT, OFF(cpu_batch.strict), 0, 1, "--cpu-strict for the prompt-processing threads (default: same as --cpu-strict)", NULL},
    {"--prio-batch", "N", THAW_FLAG_INT, OFF(cpu_batch.prio), -1, 3, "--prio for the prompt-processing threads (default: same as --prio)", NULL},
    {"--poll-batch", "0..100", THAW_FLAG_INT, OFF(cpu_batch.poll), 0, 100, "--poll for the prompt-processing threads (default: same as --poll)", NULL},
    REFUSE("-lcs,--lookup-cache-static", "FILE", WHY_NGRAM_CACHE),
    REFUSE("-lcd,--lookup-cache-dynamic", "FILE", WHY_NGRAM_CACHE),
    REFUSE("--kv-unified-per-slot", "N", "thaw keeps each slot's KV cells apart (-c is split evenly across -np)"),
    REFUSE("--keep", "N", "thaw never shifts the context, so there is nothing to keep: a reply ends when its slot is full"),
    REFUSE("-cms,--checkpoint-min-step", "N", "thaw places its context checkpoints itself (see --ctx-checkpoints)"),
    REFUSE("-kvu,--kv-unified", NULL,
           "thaw keeps each slot's KV cells apart: a slot's state must be its own to store and restore"),
    REFUSE("--no-cache-idle-slots", NULL, "thaw always stores a slot's conversation (use --cache-ram 0 for no RAM tier)"),
    REFUSE("--context-shift", NULL, "thaw never shifts the context: a reply ends with finish_reason length when its slot is full"),
    REFUSE("-r,--reverse-prompt", "PROMPT", "thaw takes stop strings per request (the request's 'stop')"),
    REFUSE("-sp,--special", NULL, "thaw renders special tokens as the chat parser needs them"),
    REFUSE("--spm-infill", NULL, "thaw has no /infill endpoint"),
    REFUSE("-nocb,--no-cont-batching", NULL, "thaw always batches its slots together"),
    REFUSE("-mmu,--mmproj-url", "URL", WHY_DOWNLOAD),
    REFUSE("-mmdev,--mmproj-device", "DEV", "thaw puts the projector on the model's first GPU (--no-mmproj-offload: the CPU)"),
    REFUSE("--mtmd-batch-max-tokens", "N", "thaw encodes one image at a time"),
    REFUSE("--video-fps", "N", WHY_MEDIA),
    REFUSE("--video-timestamp-interval", "N", WHY_MEDIA),
    REFUSE("--video-ffmpeg-dir", "DIR", WHY_MEDIA),
    REFUSE("--rpc", "SERVERS", "thaw loads no RPC backends"),
    REFUSE("--lora", "FILE", WHY_ADAPTER),
    REFUSE("--lora-scaled", "FILE", WHY_ADAPTER),
    REFUSE("--control-vector", "FILE", WHY_ADAPTER),
    REFUSE("--control-vector-scaled", "FILE", WHY_ADAPTER),
    REFUSE("--control-vector-layer-range", "START", WHY_ADAPTER),
    REFUSE("--lora-init-without-apply", NULL, WHY_ADAPTER),
    REFUSE("-mu,--model-url", "URL", WHY_DOWNLOAD),
    REFUSE("-dr,--docker-repo", "REPO", WHY_DOWNLOAD),
    REFUSE("-hf,-hfr,--hf-repo", "REPO", WHY_DOWNLOAD),
    REFUSE("-hff,--hf-file", "FILE", WHY_DOWNLOAD),
    REFUSE("-hft,--hf-token", "TOKEN", WHY_DOWNLOAD),
    REFUSE("--reuse-port", NULL, "thaw does not share its port: run replicas on their own ports"),
    REFUSE("--path", "PATH", "thaw serves its own built-in page (--no-webui for none)"),
    REFUSE("--cors-methods", "METHODS", "thaw allows the methods its API uses (--cors-origin chooses the origins)"),
    REFUSE("--cors-headers", "HEADERS", "thaw allows the headers its API uses (--cors-origin chooses the origins)"),
    REFUSE("--cors-credentials", NULL, "thaw never allows credentialed CORS requests: send the API key"),
    REFUSE("--ui-config,--webui-config", "JSON", "thaw's page takes no configuration"),
    REFUSE("--ui-config-file,--webui-config-file", "FILE", "thaw's page takes no configuration"),
    REFUSE("--ui-mcp-proxy,--webui-mcp-proxy", NULL, WHY_AGENT),
    REFUSE("--tools", "TOOLS", WHY_AGENT),
    REFUSE("--tools-runtime", "RUNTIME", WHY_AGENT),
    REFUSE("--mcp-servers-config", "FILE", WHY_AGENT),
    REFUSE("--mcp-servers-json", "JSON", WHY_AGENT),
    REFUSE("-ag,--agent", NULL, WHY_AGENT),
    REFUSE("--cache-reuse", "N",
           "thaw's cache supersedes it: a conversation's KV is restored from RAM or disk, and shared prefixes are reused as blocks"),
    REFUSE("--slot-save-path", "PATH", "thaw's cache supersedes it: --kv-cache-dir stores every conversation's KV"),
    {"--models-dir", "DIR", THAW_FLAG_STR, OFF(models_dir), 0, 0,
     "serve every GGUF file in DIR (instead of -m), each named by its file name without .gguf; a request's "
     "'model' picks one, loaded on demand (one engine per model; --kv-cache-dir is one store for all of them, each "
     "model finding only its own conversations)", NULL},
    {"--models-preset", "FILE", THAW_FLAG_STR, OFF(models_preset), 0, 0,
     "llama-server's INI of models and their settings: [NAME] is a model (model = PATH.gguf, or NAME.gguf in "
     "--models-dir), [*] every model; keys are flags without dashes (c = 8192, ngl = 99, alias = a,b, mmproj = "
     "FILE) plus load-on-startup = true; the command line wins over [NAME], which wins over [*]; alone, it is "
     "the list of models", NULL},
    {"--models-max", "N", THAW_FLAG_INT, OFF(models_max), 0, 1024,
     "--models-dir: most models loaded at once; loading one more unloads the least recently used, its "
     "conversations stored first; --cache-ram is shared among them, each model getting --cache-ram / N (0 = no "
     "limit, each model getting --cache-ram whole)", NULL},
    {"--models-autoload", NULL, THAW_FLAG_TRUE, OFF(models_autoload), 0, 0,
     "--models-dir: a request for a model not loaded loads it (default)", NULL},
    {"--no-models-autoload", NULL, THAW_FLAG_FALSE, OFF(models_autoload), 0, 0,
     "--models-dir: a request for a model not loaded gets 400 until POST /models/load loads it", NULL},
    REFUSE("--skip-chat-parsing", NULL, "thaw always parses the reply (--reasoning-format none keeps reasoning in content)"),
    {"--sleep-idle-seconds", "SECONDS", THAW_FLAG_INT, OFF(sleep_idle_s), -1, 1 << 30,
     "a model (-m's too) no request has used for this long is unloaded, its conversations stored first, and "
     "loaded again by the next request for it, which restores them from --kv-cache-dir (-1 = never; not 0)", NULL},
    REFUSE("--log-prompts-dir", "DIR", "thaw never writes conversations to its logs"),
    REFUSE("--spec-draft-hf,-hfd,-hfrd,--hf-repo-draft", "REPO", WHY_DOWNLOAD),
    REFUSE("--spec-draft-cpu-mask,-Cd,--cpu-mask-draft", "M", WHY_PIN),
    REFUSE("--spec-draft-cpu-range,-Crd,--cpu-range-draft", "LO-HI", WHY_PIN),
    REFUSE("--spec-draft-cpu-strict,--cpu-strict-draft", "0|1", WHY_PIN),
    REFUSE("--spec-draft-prio,--prio-draft", "N", WHY_PIN),
    REFUSE("--spec-draft-poll,--poll-draft", "0|1", WHY_PIN),
    REFUSE("--spec-draft-cpu-mask-batch,-Cbd,--cpu-mask-batch-draft", "M", WHY_PIN),
    REFUSE("--spec-draft-cpu-strict-batch,--cpu-strict-batch-draft", "0|1", WHY_PIN),
    REFUSE("--spec-draft-prio-batch,--prio-batch-draft", "N", WHY_PIN),
    REFUSE("--spec-draft-poll-batch,--poll-batch-draft", "0|1", WHY_PIN),
    REFUSE("--spec-synth-len", "N", WHY_SYNTH),
    REFUSE("--spec-synth-rates", "R", WHY_SYNTH),
    REFUSE("--spec-draft-p-split,--draft-p-split", "P", "thaw drafts one sequence per slot"),
    REFUSE("--spec-ngram-size-n", "N", WHY_NGRAM_REMOVED),
    REFUSE("--spec-ngram-size-m", "N", WHY_NGRAM_REMOVED),
    REFUSE("--spec-ngram-min-hits", "N", WHY_NGRAM_REMOVED),
    REFUSE("--embd-gemma-default", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-1.5b-default", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-3b-default", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-7b-default", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-7b-spec", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-14b-spec", NULL, WHY_PRESET),
    REFUSE("--fim-qwen-30b-default", NULL, WHY_PRESET),
    REFUSE("--gpt-oss-20b-default", NULL, WHY_PRESET),
    REFUSE("--gpt-oss-120b-default", NULL, WHY_PRESET),
    REFUSE("--vision-gemma-4b-default", NULL, WHY_PRESET),
    REFUSE("--vision-gemma-12b-default", NULL, WHY_PRESET),
};

#define N_OPTS (sizeof opts / sizeof opts[0])

/* ---- values with their own syntax ----------------------------------------------- */

static bool truthy(const char *v) { return !strcmp(v, "on") || !strcmp(v, "enabled") || !strcmp(v, "true") || !strcmp(v, "1"); }
static bool falsey(const char *v) { return !strcmp(v, "off") || !strcmp(v, "disabled") || !strcmp(v, "false") || !strcmp(v, "0"); }
static bool autoy(const char *v) { return !strcmp(v, "auto") || !strcmp(v, "-1"); }

static int bad_value(const char *flag, const char *v, const char *want)
{
    fprintf(stderr, "thaw: %s expects %s, got '%s'\n", flag, want, v);
    return THAW_EINVAL;
}

/* a whole number in [min, max], or THAW_EINVAL naming the flag */
static int whole(const char *flag, const char *v, long long min, long long max, long long *out)
{
    char *end = NULL;
    long long n;

    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno || end == v || *end != '\0' || n < min || n > max) {
        fprintf(stderr, "thaw: %s expects a whole number from %lld to %lld, got '%s'\n", flag, min, max, v);
        return THAW_EINVAL;
    }
    *out = n;
    return 0;
}

/* the draft model's flag of the same family: -ngld, -devd, -otd, -cmoed, -ncmoed */
static bool is_draft_flag(const char *flag)
{
    static const char *const shorts[] = {"-ngld", "-devd", "-otd", "-cmoed", "-ncmoed", "-ctkd", "-ctvd"};

    for (size_t i = 0; i < sizeof shorts / sizeof shorts[0]; i++)
        if (!strcmp(flag, shorts[i]))
            return true;
    return strstr(flag, "draft") != NULL;
}

static int fn_ngl(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    int *ngl = is_draft_flag(flag) ? &cfg->draft_n_gpu_layers : &cfg->n_gpu_layers;
    long long n;

    if (!strcmp(v, "auto"))
        *ngl = -1;
    else if (!strcmp(v, "all"))
        *ngl = -2;
    else {
        char *end = NULL;
        errno = 0;
        n = strtoll(v, &end, 10);
        if (errno || end == v || *end || n < -2 || n > INT_MAX)
            return bad_value(flag, v, "a number of layers, auto or all");
        *ngl = (int)n;
    }
    return 0;
}

static int fn_devices(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    *(is_draft_flag(flag) ? &cfg->draft_devices : &cfg->devices) = v; /* names are checked once the backends are loaded (params.c) */
    return 0;
}

static int fn_override_tensor(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (!eq || eq == p || eq + 1 == p + len)
            return bad_value(flag, v, "PATTERN=BUFFER_TYPE[,...]");
        p += len;
        if (*p == ',')
            p++;
    }
    const char **list = is_draft_flag(flag) ? cfg->draft_tensor_overrides : cfg->tensor_overrides;
    int *n = is_draft_flag(flag) ? &cfg->n_draft_tensor_overrides : &cfg->n_tensor_overrides;
    if (*n == THAW_MAX_OVERRIDES) {
        fprintf(stderr, "thaw: %s given more than %d times: use commas\n", flag, THAW_MAX_OVERRIDES);
        return THAW_EINVAL;
    }
    list[(*n)++] = v;
    return 0;
}

static int fn_cpu_moe(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    long long n;

    if (!v) {
        *(is_draft_flag(flag) ? &cfg->draft_cpu_moe : &cfg->cpu_moe) = true;
        return 0;
    }
    if (whole(flag, v, 0, 1 << 20, &n) != 0)
        return THAW_EINVAL;
    if (is_draft_flag(flag))
        cfg->draft_n_cpu_moe = (int)n;
    else if (!strcmp(flag, "-ncffn") || !strcmp(flag, "--n-cpu-ffn"))
        cfg->n_cpu_ffn = (int)n;
    else
        cfg->n_cpu_moe = (int)n;
    return 0;
}

static int fn_split_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    static const char *const modes[] = {"none", "layer", "row", "tensor"}; /* enum llama_split_mode */

    for (int i = 0; i < 4; i++)
        if (!strcmp(v, modes[i])) {
            cfg->split_mode = i;
            return 0;
        }
    return bad_value(flag, v, "none, layer, row or tensor");
}

static int fn_pooling(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;
    /* enum llama_pooling_type, from 0 */
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};

    (void)fl;
    for (int i = 0; i < 5; i++)
        if (!strcmp(v, names[i])) {
            cfg->pooling = i;
            return 0;
        }
    return bad_value(flag, v, "none, mean, cls, last or rank");
}

/* llama-server's --spec-type names, by enum thaw_spec_kind; the ones thaw
 * refuses, each by name */
static const char *const spec_names[] = {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "draft-simple"};
static const char *const spec_refused[] = {"ngram-cache", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"};

/* "ngram-simple,ngram-map-k": adds each kind (llama-server's flag adds up
 * when repeated); "none" anywhere turns speculation off */
static int fn_spec_type(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;
    unsigned kinds = 0;
    bool none = false;

    (void)fl;
    for (const char *p = v;;) {
        size_t n = strcspn(p, ",");
        int k = -1;
        for (int i = 0; i < (int)(sizeof spec_names / sizeof *spec_names); i++)
            if (strlen(spec_names[i]) == n && !strncmp(p, spec_names[i], n))
                k = i;
        if (n == 4 && !strncmp(p, "none", 4))
            none = true;
        else if (k >= 0)
            kinds |= 1u << k;
        else {
            for (size_t i = 0; i < sizeof spec_refused / sizeof *spec_refused; i++)
                if (strlen(spec_refused[i]) == n && !strncmp(p, spec_refused[i], n)) {
                    fprintf(stderr,
                            "thaw: %s: %s is not implemented in thaw (it has none, ngram-simple, ngram-map-k, "
                            "ngram-map-k4v, ngram-mod, draft-simple)\n",
                            flag, spec_refused[i]);
                    return THAW_EINVAL;
                }
            return bad_value(flag, v, "a comma list of none, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, draft-simple");
        }
        if (!p[n])
            break;
        p += n + 1;
    }
    cfg->spec_types = none ? 0 : cfg->spec_types | kinds;
    cfg->spec_type_given = true;
    return 0;
}

static int fn_spec_default(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl, (void)flag, (void)v;
    cfg->spec_types |= 1u << THAW_SPEC_NGRAM_MOD;
    cfg->spec_type_given = true;
    cfg->spec_ngram[THAW_SPEC_NGRAM_MOD] = (struct thaw_spec_ngram){.size_n = 24, .size_m = 64, .min_hits = 1, .n_min = 48};
    return 0;
}

/* "a,b,c" or "a/b/c" of numbers >= 0 into out[0..max-1], the rest 0 */
static int number_list(const char *flag, const char *v, double *out, int max)
{
    int n = 0;

    for (int i = 0; i < max; i++)
        out[i] = 0;
    for (const char *p = v; *p;) {
        char *end = NULL;
        errno = 0;
        double d = strtod(p, &end);
        if (errno || end == p || d < 0 || (*end && *end != ',' && *end != '/'))
            return bad_value(flag, v, "numbers >= 0 separated by ',' or '/'");
        if (n == max) {
            fprintf(stderr, "thaw: %s: at most %d values\n", flag, max);
            return THAW_EINVAL;
        }
        out[n++] = d;
        p = *end ? end + 1 : end;
    }
    if (n == 0)
        return bad_value(flag, v, "a list of numbers");
    return n;
}

static int fn_tensor_split(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    double d[THAW_MAX_DEVICES];
    int n = number_list(flag, v, d, THAW_MAX_DEVICES);

    if (n < 0)
        return n;
    for (int i = 0; i < THAW_MAX_DEVICES; i++)
        cfg->tensor_split[i] = (float)d[i];
    return 0;
}

static int fn_fit_target(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    double d[THAW_MAX_DEVICES];
    int n = number_list(flag, v, d, THAW_MAX_DEVICES);

    if (n < 0)
        return n;
    for (int i = 0; i < THAW_MAX_DEVICES; i++)
        cfg->fit_target_mib[i] = (uint64_t)(n == 1 ? d[0] : d[i]); /* one value: every device */
    return 0;
}

/* --mlock, --mmap, --no-mmap, -dio, -ndio, -lm MODE: the last one wins, as in llama-server */
static int fn_load_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    static const struct {
        const char *name;
        int mode; /* enum llama_load_mode */
    } modes[] = {{"auto", -1}, {"none", 0}, {"mmap", 1}, {"mlock", 2}, {"mmap+mlock", 3}, {"dio", 4}};

    if (!v) {
        if (!strcmp(flag, "--mlock"))
            cfg->load_mode = 2;
        else if (!strcmp(flag, "--mmap"))
            cfg->load_mode = 1;
        else if (!strcmp(flag, "-dio") || !strcmp(flag, "--direct-io"))
            cfg->load_mode = 4;
        else
            cfg->load_mode = 0; /* --no-mmap, --no-direct-io */
        return 0;
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(v, modes[i].name)) {
            cfg->load_mode = modes[i].mode;
            return 0;
        }
    return bad_value(flag, v, "auto, none, mmap, mlock, mmap+mlock or dio");
}

static int fn_lazy_mode(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (!strcmp(v, "off"))
        cfg->lazy_mode = 0;
    else if (!strcmp(v, "auto"))
        cfg->lazy_mode = 1;
    else if (!strcmp(v, "on"))
        cfg->lazy_mode = 2;
    else
        return bad_value(flag, v, "on, auto or off");
    return 0;
}

static int fn_numa(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (!strcmp(v, "distribute"))
        cfg->numa = 1; /* GGML_NUMA_STRATEGY_DISTRIBUTE */
    else if (!strcmp(v, "isolate"))
        cfg->numa = 2;
    else if (!strcmp(v, "numactl"))
        cfg->numa = 3;
    else
        return bad_value(flag, v, "distribute, isolate or numactl");
    return 0;
}

static int fn_override_kv(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        const char *colon = eq ? memchr(eq, ':', (size_t)(p + len - eq)) : NULL;
        size_t tl = colon ? (size_t)(colon - eq - 1) : 0;
        if (!eq || eq == p || (size_t)(eq - p) >= 128 || !colon ||
            !((tl == 3 && !strncmp(eq + 1, "int", 3)) || (tl == 5 && !strncmp(eq + 1, "float", 5)) ||
              (tl == 4 && !strncmp(eq + 1, "bool", 4)) || (tl == 3 && !strncmp(eq + 1, "str", 3))))
            return bad_value(flag, v, "KEY=TYPE:VALUE[,...] with TYPE int, float, bool or str");
        p += len;
        if (*p == ',')
            p++;
    }
    if (cfg->n_kv_overrides == THAW_MAX_OVERRIDES) {
        fprintf(stderr, "thaw: %s given more than %d times: use commas\n", flag, THAW_MAX_OVERRIDES);
        return THAW_EINVAL;
    }
    cfg->kv_overrides[cfg->n_kv_overrides++] = v;
    return 0;
}

static int fn_fit(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (truthy(v))
        cfg->fit = true;
    else if (falsey(v))
        cfg->fit = false;
    else
        return bad_value(flag, v, "on or off");
    return 0;
}

static int fn_list_devices(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    (void)flag, (void)v;
    cfg->list_devices = true;
    return 0;
}

static int fn_version(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    (void)flag, (void)v;
    cfg->show_version = true;
    return 0;
}

static int fn_flash_attn(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (truthy(v))
        cfg->flash_attn = 1; /* enum llama_flash_attn_type */
    else if (falsey(v))
        cfg->flash_attn = 0;
    else if (autoy(v))
        cfg->flash_attn = -1;
    else
        return bad_value(flag, v, "on, off or auto");
    return 0;
}

/* base/config.c's defaults name GGML_TYPE_F16 by its value */
_Static_assert(GGML_TYPE_F16 == 1, "base/config.c: the default KV type is GGML_TYPE_F16");

static int fn_cache_type(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    /* llama-server's list (common/arg.cpp kv_cache_types) */
    static const enum ggml_type types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,    GGML_TYPE_BF16,
                                           GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,
                                           GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1};
    bool is_k = strstr(flag, "-k") || !strcmp(flag, "-ctk") || !strcmp(flag, "-ctkd"); /* --cache-type-k, --spec-draft-type-k */
    bool draft = is_draft_flag(flag);

    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(v, ggml_type_name(types[i]))) {
            *(draft ? (is_k ? &cfg->draft_type_k : &cfg->draft_type_v) : (is_k ? &cfg->type_k : &cfg->type_v)) =
                (int)types[i];
            return 0;
        }
    return bad_value(flag, v, "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1");
}

static int fn_rope_scaling(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (!strcmp(v, "none"))
        cfg->rope_scaling = 0; /* enum llama_rope_scaling_type */
    else if (!strcmp(v, "linear"))
        cfg->rope_scaling = 1;
    else if (!strcmp(v, "yarn"))
        cfg->rope_scaling = 2;
    else
        return bad_value(flag, v, "none, linear or yarn");
    return 0;
}

static int fn_rope_scale(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    char *end = NULL;
    double d = strtod(v, &end);

    if (end == v || *end || !(d > 0))
        return bad_value(flag, v, "a number > 0");
    cfg->rope_freq_scale = (float)(1.0 / d);
    return 0;
}

static int fn_seed(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    long long n;

    if (whole(flag, v, -1, 0xFFFFFFFFll, &n) != 0)
        return THAW_EINVAL;
    cfg->sampling.seed = n < 0 ? 0xFFFFFFFFu : (uint32_t)n; /* LLAMA_DEFAULT_SEED: random */
    return 0;
}

static int fn_samplers(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    char err[200];
    int rc = !strcmp(flag, "--samplers") ? thaw_sampling_set_stages(&cfg->sampling, v, err, sizeof err)
                                         : thaw_sampling_set_seq(&cfg->sampling, v, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "thaw: %s: %s\n", flag, err);
    return rc;
}

static int fn_dry_breaker(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    char err[200];
    int rc = thaw_sampling_add_breaker(&cfg->sampling, !cfg->dry_breakers_set, v, err, sizeof err);

    if (rc != 0)
        fprintf(stderr, "thaw: %s: %s\n", flag, err);
    cfg->dry_breakers_set = true;
    return rc;
}

static int fn_logit_bias(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    char err[200];
    int rc = thaw_sampling_add_bias(&cfg->sampling, v, err, sizeof err);

    if (rc != 0)
        fprintf(stderr, "thaw: %s %s\n", flag, err);
    return rc;
}

static int fn_log_colors(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    if (truthy(v))
        cfg->log_colors = 1;
    else if (falsey(v))
        cfg->log_colors = 0;
    else if (autoy(v))
        cfg->log_colors = -1;
    else
        return bad_value(flag, v, "on, off or auto");
    return 0;
}

/* llama-server's -lv N: 0 output, 1 error, 2 warning, 3 info, 4 trace, 5 debug;
 * thaw's levels are THAW_LOG_ERROR (-1) .. THAW_LOG_DEBUG (2) */
static int fn_log_verbosity(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    long long n;

    if (!v) { /* --log-disable */
        cfg->verbosity = -2;
        return 0;
    }
    if (whole(flag, v, 0, INT_MAX, &n) != 0)
        return THAW_EINVAL;
    cfg->verbosity = n >= 4 ? 2 : (int)n - 2;
    return 0;
}

static int fn_api_key_file(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    FILE *f = fopen(v, "r");
    char line[4096];
    int rc = 0;

    if (!f) {
        fprintf(stderr, "thaw: %s: cannot read %s: %s\n", flag, v, strerror(errno));
        return THAW_EINVAL;
    }
    while (rc == 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        if (cfg->n_api_keys == THAW_MAX_API_KEYS) {
            fprintf(stderr, "thaw: at most %d API keys\n", THAW_MAX_API_KEYS);
            rc = THAW_EINVAL;
        } else if (!(cfg->api_keys[cfg->n_api_keys] = strdup(line))) {
            rc = THAW_ENOMEM;
        } else {
            cfg->n_api_keys++;
        }
    }
    fclose(f);
    return rc;
}

static int fn_cache_ram(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    long long n;

    if (whole(flag, v, -1, 1ll << 40, &n) != 0)
        return THAW_EINVAL;
    cfg->cache_ram_mib = n < 0 ? (1ull << 40) : (uint64_t)n; /* -1: no limit */
    return 0;
}

/* -C / -Cr and their -batch forms: the CPUs named add to the mask */
static int fn_cpu_mask(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl;
    bool batch = strstr(flag, "batch") != NULL || !strcmp(flag, "-Cb") || !strcmp(flag, "-Crb");
    bool range = strstr(flag, "range") != NULL || !strcmp(flag, "-Cr") || !strcmp(flag, "-Crb");
    struct thaw_cpu_cfg *c = batch ? &cfg->cpu_batch : &cfg->cpu;
    bool ok = range ? thaw_cpumask_parse_range(v, c->mask) : thaw_cpumask_parse_hex(v, c->mask);

    if (!ok) {
        fprintf(stderr, "thaw: %s '%s': expected %s\n", flag, v,
                range ? "a CPU range LO-HI (0-7, 4-, -3)" : "a hex CPU mask (ff, 0x3c)");
        return THAW_EINVAL;
    }
    c->mask_valid = true;
    return 0;
}

/* ---- parsing ------------------------------------------------------------------- */

static int add_keys(struct thaw_config *cfg, const char *value)
{
    const char *p = value;

    /* an empty key (an unset variable, a stray comma) must never turn
     * authentication off, nor authenticate an empty Bearer token */
    if (!*value) {
        fprintf(stderr, "thaw: --api-key is empty (an unset variable?): refusing to start without authentication\n");
        return THAW_EINVAL;
    }
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0 || (p[len] == ',' && p[len + 1] == '\0')) {
            fprintf(stderr, "thaw: --api-key '%s' holds an empty key: refusing to start\n", value);
            return THAW_EINVAL;
        }
        if (len > 0) {
            if (cfg->n_api_keys == THAW_MAX_API_KEYS) {
                fprintf(stderr, "thaw: at most %d API keys\n", THAW_MAX_API_KEYS);
                return THAW_EINVAL;
            }
            char *k = strndup(p, len);
            if (!k)
                return THAW_ENOMEM;
            cfg->api_keys[cfg->n_api_keys++] = k; /* owned: freed by thaw_config_free */
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static int fn_api_key(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    (void)fl, (void)flag;
    return add_keys(dst, v);
}

/* -v raises the log level, --log-quiet lowers it to warnings and errors */
static int fn_verbose(void *dst, const struct thaw_flag *fl, const char *flag, const char *v)
{
    struct thaw_config *cfg = dst;

    (void)fl, (void)v;
    if (!strcmp(flag, "--log-quiet"))
        cfg->verbosity = 0;
    else
        cfg->verbosity++;
    return 0;
}

/* the engine logs these once logging is set up */
static void record_noop(void *dst, const struct thaw_flag *o)
{
    struct thaw_config *cfg = dst;

    if (cfg->n_no_effect < THAW_MAX_OVERRIDES) {
        cfg->no_effect[cfg->n_no_effect].flag = o->names;
        cfg->no_effect[cfg->n_no_effect++].why = o->help;
    }
}

static const struct thaw_flags serve_flags = {
    .prog = "thaw",
    .see = "thaw serve",
    .flags = opts,
    .n_flags = N_OPTS,
    .noop = record_noop,
};

/* A whole file as a malloc'd string in *out (at most 16 MiB). 0, or
 * THAW_EINVAL after printing why. */
static int read_text(const char *flag, const char *path, char **out)
{
    int rc = thaw_read_file(path, 16u << 20, out, NULL);

    if (rc == THAW_ETOOBIG || rc == THAW_ENOMEM)
        fprintf(stderr, "thaw: %s %s: larger than 16 MiB or out of memory\n", flag, path);
    else if (rc != 0)
        fprintf(stderr, "thaw: cannot read %s %s: %s\n", flag, path, strerror(-rc));
    return rc == 0 ? 0 : THAW_EINVAL;
}

/* The template kwargs every request gets (cfg->kwargs_text): the
 * --chat-template-kwargs object, then what -rea, --reasoning-effort and
 * --reasoning-preserve say for each key it does not name (llama-server
 * keeps them in one map too, default_template_kwargs: preserve_reasoning
 * true unless told otherwise). Keys sorted, so the text (which the cache
 * binding hashes) does not depend on the flags' order. 0, or THAW_EINVAL
 * / THAW_ENOMEM after printing why. */
static int merge_kwargs(struct thaw_config *cfg)
{
    json_error_t jerr;
    json_t *kw = cfg->chat_template_kwargs ? json_loads(cfg->chat_template_kwargs, 0, &jerr) : json_object();
    int rc = 0;

    if (!json_is_object(kw)) {
        fprintf(stderr, "thaw: --chat-template-kwargs must be a JSON object: %s\n", kw ? "not an object" : jerr.text);
        json_decref(kw);
        return THAW_EINVAL;
    }
    if (cfg->reasoning && strcmp(cfg->reasoning, "auto") != 0 && !json_object_get(kw, "enable_thinking"))
        json_object_set_new(kw, "enable_thinking", json_boolean(strcmp(cfg->reasoning, "on") == 0));
    if (cfg->reasoning_effort && strcmp(cfg->reasoning_effort, "default") != 0 &&
        !json_object_get(kw, "reasoning_effort"))
        json_object_set_new(kw, "reasoning_effort", json_string(cfg->reasoning_effort));
    if (!json_object_get(kw, "preserve_reasoning"))
        json_object_set_new(kw, "preserve_reasoning", json_boolean(cfg->reasoning_preserve));
    if (!(cfg->kwargs_text = json_dumps(kw, JSON_COMPACT | JSON_SORT_KEYS))) {
        fprintf(stderr, "thaw: out of memory\n");
        rc = THAW_ENOMEM;
    }
    cfg->chat_template_kwargs = cfg->kwargs_text;
    json_decref(kw);
    return rc;
}

/* --grammar-file and -jf: read now, so a missing file stops the start-up
 * with its name; then the template kwargs. A model's own (a preset's). */
static int read_side_files(struct thaw_config *cfg)
{
    int rc;

    if ((cfg->grammar && cfg->grammar_file) || (cfg->json_schema && cfg->json_schema_file)) {
        fprintf(stderr, "thaw: give a grammar (schema) inline or as a file, not both\n");
        return THAW_EINVAL;
    }
    if (cfg->grammar_file) {
        if ((rc = read_text("--grammar-file", cfg->grammar_file, &cfg->file_texts[0])) != 0)
            return rc;
        cfg->grammar = cfg->file_texts[0];
    }
    if (cfg->json_schema_file) {
        if ((rc = read_text("--json-schema-file", cfg->json_schema_file, &cfg->file_texts[1])) != 0)
            return rc;
        cfg->json_schema = cfg->file_texts[1];
    }
    if (cfg->grammar && cfg->json_schema) {
        fprintf(stderr, "thaw: give --grammar or --json-schema, not both\n");
        return THAW_EINVAL;
    }
    if (cfg->reasoning && strcmp(cfg->reasoning, "on") != 0 && strcmp(cfg->reasoning, "off") != 0 &&
        strcmp(cfg->reasoning, "auto") != 0) {
        fprintf(stderr, "thaw: --reasoning expects on, off or auto, got '%s'\n", cfg->reasoning);
        return THAW_EINVAL;
    }
    return merge_kwargs(cfg);
}

/* The TLS key and certificate (read now, as above) and --api-prefix: the
 * server's, not a model's. */
static int check_serving(struct thaw_config *cfg)
{
    int rc;

    if (!cfg->ssl_key_file != !cfg->ssl_cert_file) {
        fprintf(stderr, "thaw: HTTPS needs both --ssl-key-file and --ssl-cert-file\n");
        return THAW_EINVAL;
    }
    if (cfg->ssl_key_file) {
        if ((rc = read_text("--ssl-key-file", cfg->ssl_key_file, &cfg->tls_texts[0])) != 0 ||
            (rc = read_text("--ssl-cert-file", cfg->ssl_cert_file, &cfg->tls_texts[1])) != 0)
            return rc;
        cfg->ssl_key = cfg->tls_texts[0];
        cfg->ssl_cert = cfg->tls_texts[1];
    }
    size_t np = strlen(cfg->api_prefix);
    if (np > 0 && (cfg->api_prefix[0] != '/' || cfg->api_prefix[np - 1] == '/')) {
        fprintf(stderr, "thaw: --api-prefix must start with '/' and not end with one, got '%s'\n", cfg->api_prefix);
        return THAW_EINVAL;
    }
    return 0;
}

/* What one model runs with, checked and completed (files read, defaults
 * resolved): the command line's for -m, each preset's own. 0, or
 * THAW_EINVAL / THAW_ENOMEM after printing why. */
static int check_model(struct thaw_config *cfg)
{
    int rc;

    if (cfg->n_ctx != 0 && cfg->n_ctx < 16 * cfg->n_parallel) {
        fprintf(stderr, "thaw: -c %d leaves fewer than 16 tokens per slot for -np %d\n", cfg->n_ctx, cfg->n_parallel);
        return THAW_EINVAL;
    }
    if (strcmp(cfg->reasoning_format, "none") != 0 && strcmp(cfg->reasoning_format, "deepseek") != 0 &&
        strcmp(cfg->reasoning_format, "auto") != 0) {
        fprintf(stderr, "thaw: --reasoning-format must be none, deepseek or auto, got '%s'\n", cfg->reasoning_format);
        return THAW_EINVAL;
    }
    if (cfg->chat_template_file) {
        if (cfg->chat_template) {
            fprintf(stderr, "thaw: give --chat-template or --chat-template-file, not both\n");
            return THAW_EINVAL;
        }
        if ((rc = read_text("--chat-template-file", cfg->chat_template_file, &cfg->chat_template_text)) != 0)
            return rc;
        cfg->chat_template = cfg->chat_template_text;
    }
    if ((rc = read_side_files(cfg)) != 0)
        return rc;
    if (cfg->draft_min > cfg->draft_max) {
        fprintf(stderr, "thaw: --draft-min %d exceeds --draft-max %d\n", cfg->draft_min, cfg->draft_max);
        return THAW_EINVAL;
    }
    if (cfg->n_ubatch > cfg->n_batch)
        cfg->n_ubatch = cfg->n_batch;
    if (cfg->reranking) {
        /* llama-server's --rerank: embeddings, pooled by the model's rank head */
        if (cfg->pooling >= 0 && cfg->pooling != LLAMA_POOLING_TYPE_RANK) {
            fprintf(stderr, "thaw: --rerank pools with the model's rank head: drop --pooling or give --pooling rank\n");
            return THAW_EINVAL;
        }
        cfg->embedding = true;
        cfg->pooling = LLAMA_POOLING_TYPE_RANK;
    }
    /* -md alone is the draft model's speculation (thaw's habit before
     * --spec-type); beside n-gram kinds it drafts when they find nothing */
    if (cfg->draft_path && cfg->spec_type_given && cfg->spec_types == 0) {
        if (cfg->n_no_effect < THAW_MAX_OVERRIDES) {
            cfg->no_effect[cfg->n_no_effect].flag = "-md";
            cfg->no_effect[cfg->n_no_effect++].why = "--spec-type none: no speculation, the draft model is not loaded";
        }
        cfg->draft_path = NULL;
    } else if (cfg->draft_path) {
        cfg->spec_types |= 1u << THAW_SPEC_DRAFT;
    } else if (cfg->spec_types & (1u << THAW_SPEC_DRAFT)) {
        fprintf(stderr, "thaw: --spec-type draft-simple needs a draft model: give -md FILE\n");
        return THAW_EINVAL;
    }
    if (cfg->embedding && cfg->draft_path) {
        fprintf(stderr, "thaw: --embedding computes no tokens for a draft model to guess: drop -md\n");
        return THAW_EINVAL;
    }
    if (cfg->mmproj_path && cfg->draft_path) {
        fprintf(stderr, "thaw: a draft model (-md) cannot read images yet: drop -md or --mmproj\n");
        return THAW_EINVAL;
    }
    if (cfg->media_path && !cfg->mmproj_path) {
        fprintf(stderr, "thaw: --media-path serves images: it needs --mmproj\n");
        return THAW_EINVAL;
    }
    if (cfg->mmproj_path && cfg->embedding) {
        /* llama-server starts so (a vision model's command line with
         * --embedding added); thaw embeds text only, so the projector is
         * not loaded and an image sent to /embeddings is a 400 */
        fprintf(stderr, "thaw: --embedding embeds text only: --mmproj %s is not loaded\n", cfg->mmproj_path);
        cfg->mmproj_path = NULL;
        cfg->media_path = NULL;
    }
    if (cfg->n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cfg->n_threads = n > 0 ? (int)n : 1;
    }
    if (cfg->n_threads_batch == 0)
        cfg->n_threads_batch = cfg->n_threads;
    if (cfg->cpu_batch.prio == INT_MIN)
        cfg->cpu_batch.prio = cfg->cpu.prio;
    if (cfg->cpu_batch.poll == INT_MIN)
        cfg->cpu_batch.poll = cfg->cpu.poll;
    if (cfg->cpu_batch.strict == INT_MIN)
        cfg->cpu_batch.strict = cfg->cpu.strict;
    if (!cfg->cpu_batch.mask_valid && cfg->cpu.mask_valid) {
        memcpy(cfg->cpu_batch.mask, cfg->cpu.mask, sizeof cfg->cpu.mask);
        cfg->cpu_batch.mask_valid = true;
    }
    return 0;
}

/* ---- --models-preset ------------------------------------------------------------ */

/* Flags that set the server, not a model (listening, keys, logging, the
 * one cache store, the model set, and what the HTTP layer reads from the
 * server's config for every model): in a preset they are an error, not
 * silently ignored. */
static const char *const process_wide[] = {
    "--host", "--port", "--api-key", "--api-key-file", "--threads-http", "--max-connections",
    "--max-connections-per-client", "--cors-origin", "--timeout", "--webui", "--no-webui", "--metrics",
    "--no-metrics", "--api-prefix", "--ssl-key-file", "--ssl-cert-file", "--slots", "--no-slots", "--props",
    "--max-body", "--shutdown-timeout", "--sse-ping-interval", "--cache-prompt", "--no-cache-prompt",
    "--embedding", "--rerank", "--embd-normalize", "--kv-cache-dir", "--kv-cache-max", "--kv-cache-ttl",
    "--kv-cache-queue", "--kv-cache-min-tokens", "--cache-ram", "--kv-shared", "--kv-shared-endpoint",
    "--kv-shared-secret-file", "--kv-shared-timeout-ms", "--kv-shared-retry-s", "--kv-shared-queue",
    "--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
    "--sleep-idle-seconds", "--verbose", "--log-quiet", "--verbosity", "--log-disable", "--log-file",
    "--log-colors", "--log-prefix", "--no-log-prefix", "--log-timestamps", "--no-log-timestamps", "--version",
    "--list-devices", "--backend-dir", "--numa",
};

static bool is_process_wide(const struct thaw_flag *o)
{
    for (size_t i = 0; i < sizeof process_wide / sizeof process_wide[0]; i++)
        if (thaw_flags_find(&serve_flags, process_wide[i]) == o)
            return true;
    return false;
}

/* llama-server's preset-only keys thaw accepts with no effect */
static const struct {
    const char *key, *why;
} preset_noop[] = {
    {"stop-timeout", "thaw unloads a model in-process: its conversations are stored, nothing is killed"},
    {"dedup-cache-models", "thaw lists no downloaded models"},
};

/* One `key = value` of a section onto cfg, as the flag --key (or -key)
 * would set it; a switch takes true or false. 0, or THAW_EINVAL after
 * printing why with FILE:LINE. */
static int apply_kv(struct thaw_config *cfg, const char *path, const struct thaw_preset_kv *kv, bool *load_on_startup)
{
    char name[80];
    const struct thaw_flag *o = NULL;
    int rc;

    if (strcmp(kv->key, "version") == 0)
        return 0;
    if (strcmp(kv->key, "load-on-startup") == 0 || strcmp(kv->key, "load_on_startup") == 0) {
        if (!truthy(kv->value) && !falsey(kv->value))
            goto not_bool;
        *load_on_startup = truthy(kv->value);
        return 0;
    }
    for (size_t i = 0; i < sizeof preset_noop / sizeof preset_noop[0]; i++)
        if (strcmp(kv->key, preset_noop[i].key) == 0) {
            if (cfg->n_no_effect < THAW_MAX_OVERRIDES) {
                cfg->no_effect[cfg->n_no_effect].flag = preset_noop[i].key;
                cfg->no_effect[cfg->n_no_effect++].why = preset_noop[i].why;
            }
            return 0;
        }
    /* as on the command line, llama-server's a_b is a-b */
    for (const char *dashes = "--"; !o && *dashes; dashes++) {
        int n = snprintf(name, sizeof name, "%s%s", dashes, kv->key);
        for (int k = 0; k < n && n < (int)sizeof name; k++)
            if (name[k] == '_')
                name[k] = '-';
        if (n < (int)sizeof name)
            o = thaw_flags_find(&serve_flags, name);
    }
    if (!o) {
        fprintf(stderr, "thaw: %s:%d: unknown key '%s': keys are thaw serve's flags without their dashes "
                        "(see thaw serve --help), or load-on-startup\n", path, kv->line, kv->key);
        return THAW_EINVAL;
    }
    if (is_process_wide(o)) {
        fprintf(stderr, "thaw: %s:%d: '%s' sets the server, not a model: give it on the command line\n", path,
                kv->line, kv->key);
        return THAW_EINVAL;
    }
    if (o->kind == THAW_FLAG_REFUSE) {
        fprintf(stderr, "thaw: %s:%d: %s: %s\n", path, kv->line, kv->key, o->help);
        return THAW_EINVAL;
    }
    if (!o->arg) { /* a switch: on with true; false turns a stored one off */
        bool on = truthy(kv->value);
        if (!on && !falsey(kv->value))
            goto not_bool;
        if (!on && o->kind != THAW_FLAG_TRUE && o->kind != THAW_FLAG_FALSE) {
            fprintf(stderr, "thaw: %s:%d: %s = false: it has no off form; leave the key out\n", path, kv->line,
                    kv->key);
            return THAW_EINVAL;
        }
        if (!on) {
            *(bool *)((char *)cfg + o->off) = o->kind == THAW_FLAG_FALSE;
            return 0;
        }
    }
    if ((rc = thaw_flags_set(&serve_flags, o, cfg, name, o->arg ? kv->value : NULL)) != 0)
        fprintf(stderr, "thaw: %s:%d: in '%s = %s'\n", path, kv->line, kv->key, kv->value);
    return rc;

not_bool:
    fprintf(stderr, "thaw: %s:%d: %s expects true or false, got '%s'\n", path, kv->line, kv->key, kv->value);
    return THAW_EINVAL;
}

/* A model's config from a preset: the defaults, then [*], then its own
 * section (NULL: none), then the command line again: llama-server's order,
 * the command line over the model's section over [*]. Checked as -m's. */
static int preset_config(const struct thaw_preset *p, const struct thaw_preset_section *sec, int argc, char **argv,
                         struct thaw_config **out, bool *load_on_startup)
{
    const struct thaw_preset_section *all = thaw_preset_section(p, "*");
    const struct thaw_preset_section *layers[] = {all, sec};
    struct thaw_config *cfg = malloc(sizeof *cfg);
    int rc = 0;

    *out = NULL;
    *load_on_startup = false;
    if (!cfg)
        return THAW_ENOMEM;
    thaw_config_init(cfg);
    for (int l = 0; rc == 0 && l < 2; l++)
        for (int i = 0; rc == 0 && layers[l] && i < layers[l]->n_kv; i++)
            rc = apply_kv(cfg, p->path, &layers[l]->kv[i], load_on_startup);
    if (rc == 0)
        rc = thaw_flags_parse(&serve_flags, cfg, argc, argv);
    if (rc == 0 && (rc = check_model(cfg)) != 0)
        fprintf(stderr, "thaw: %s:%d: in [%s]\n", p->path, sec ? sec->line : all ? all->line : 1,
                sec ? sec->name : "*");
    if (rc != 0) {
        thaw_config_free(cfg);
        free(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

/* Whether DIR/NAME.gguf is a file: a section named so sets that file's model. */
static bool in_models_dir(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;

    if (!dir || strchr(name, '/'))
        return false;
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* --models-preset: every [NAME] section a model with its own config, and
 * with --models-dir the config of the files no section names. */
static int load_presets(struct thaw_config *cfg, int argc, char **argv)
{
    struct thaw_preset *p;
    bool unused;
    int rc;

    if ((rc = thaw_preset_read(cfg->models_preset, &p)) != 0)
        return rc;
    if (!(cfg->presets = calloc((size_t)p->n, sizeof *cfg->presets))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    for (int i = 0; i < p->n; i++) {
        const struct thaw_preset_section *sec = &p->sections[i];
        struct thaw_model_preset *mp = &cfg->presets[cfg->n_presets];
        if (strcmp(sec->name, "*") == 0)
            continue;
        if ((rc = preset_config(p, sec, argc, argv, &mp->cfg, &mp->load_on_startup)) != 0)
            goto out;
        mp->name = sec->name;
        cfg->n_presets++;
        if (!mp->cfg->model_path && !in_models_dir(cfg->models_dir, sec->name)) {
            fprintf(stderr, "thaw: %s:%d: [%s] names no model: give model = PATH.gguf%s%s%s\n", p->path, sec->line,
                    sec->name, cfg->models_dir ? ", or put " : "", cfg->models_dir ? sec->name : "",
                    cfg->models_dir ? ".gguf in --models-dir" : "");
            rc = THAW_EINVAL;
            goto out;
        }
    }
    if (cfg->n_presets == 0 && !cfg->models_dir) {
        fprintf(stderr, "thaw: %s names no model: add a [NAME] section with model = PATH.gguf\n", p->path);
        rc = THAW_EINVAL;
        goto out;
    }
    if (cfg->models_dir && (rc = preset_config(p, NULL, argc, argv, &cfg->preset_base, &unused)) != 0)
        goto out;
    cfg->preset_text = p->text; /* the configs' strings point into it */
    p->text = NULL;
out:
    thaw_preset_free(p);
    return rc;
}

int thaw_config_parse(struct thaw_config *cfg, int argc, char **argv)
{
    int rc = thaw_flags_parse(&serve_flags, cfg, argc, argv);

    if (rc == 1)
        thaw_config_usage(stdout);
    if (rc != 0)
        return rc;
    if (cfg->show_version) {
        printf("thaw serve, on llama.cpp %s\n", llama_version());
        return 1;
    }
    if (cfg->list_devices)
        return 1; /* main.c lists them */
    if (!cfg->model_path && !cfg->models_dir && !cfg->models_preset) {
        fprintf(stderr, "thaw: no model given: use -m FILE.gguf, --models-dir DIR or --models-preset FILE (see thaw "
                        "serve --help)\n");
        return THAW_EINVAL;
    }
    if (cfg->models_dir && !opendir_ok(cfg->models_dir))
        return THAW_EINVAL;
    if (cfg->model_path && (cfg->models_dir || cfg->models_preset)) {
        fprintf(stderr, "thaw: -m and %s: give one (a file, or a set of models)\n",
                cfg->models_dir ? "--models-dir" : "--models-preset");
        return THAW_EINVAL;
    }
    if (cfg->sleep_idle_s == 0) {
        fprintf(stderr, "thaw: --sleep-idle-seconds 0: give a number of seconds, or -1 for never (llama-server's)\n");
        return THAW_EINVAL;
    }
    if (cfg->kv_shared && !cfg->kv_cache_dir) {
        fprintf(stderr, "thaw: --kv-shared needs --kv-cache-dir: what is fetched is installed into the local disk "
                        "tier first\n");
        return THAW_EINVAL;
    }
    if (cfg->kv_shared && !cfg->kv_shared_secret_file) {
        fprintf(stderr, "thaw: --kv-shared needs --kv-shared-secret-file FILE (the cluster secret, the same on every "
                        "replica; e.g. head -c 32 /dev/urandom | base64 > FILE)\n");
        return THAW_EINVAL;
    }
    if (cfg->cors_origin && cfg->n_api_keys > 0 && strstr(cfg->cors_origin, "*")) {
        fprintf(stderr, "thaw: --cors-origin '*' with --api-key would let any web page use a key a browser holds: "
                        "name the origins\n");
        return THAW_EINVAL;
    }
    if (cfg->mmproj_path && !cfg->model_path) {
        fprintf(stderr, "thaw: --mmproj belongs to one model: give it with -m, or as mmproj = FILE in its "
                        "--models-preset section\n");
        return THAW_EINVAL;
    }
    if ((rc = check_serving(cfg)) != 0 || (rc = check_model(cfg)) != 0)
        return rc;
    return cfg->models_preset ? load_presets(cfg, argc, argv) : 0;
}

/* ---- --help -------------------------------------------------------------------- */

/* the threads' 0 is resolved at start-up, INT_MIN is "same as" another */
static bool show_default(const struct thaw_flag *o, const void *defaults)
{
    const struct thaw_config *d = defaults;

    if (o->kind != THAW_FLAG_INT)
        return true;
    return o->off != OFF(n_threads) && o->off != OFF(n_threads_batch) &&
           *(const int *)((const char *)d + o->off) != INT_MIN;
}

static void usage_section(FILE *f, const char *title, bool (*pick)(const struct thaw_flag *))
{
    struct thaw_config d;

    thaw_config_init(&d);
    fprintf(f, "\n%s:\n", title);
    thaw_flags_usage(f, &serve_flags, pick, &d, show_default);
}

static bool pick_flag(const struct thaw_flag *o) { return o->kind != THAW_FLAG_NOOP && o->kind != THAW_FLAG_REFUSE; }
static bool pick_noop(const struct thaw_flag *o) { return o->kind == THAW_FLAG_NOOP; }
static bool pick_refused(const struct thaw_flag *o) { return o->kind == THAW_FLAG_REFUSE; }

void thaw_config_usage(FILE *f)
{
    fprintf(f, "usage: thaw serve -m MODEL.gguf [flags]\n\n"
               "An OpenAI-compatible chat server (POST /v1/chat/completions, GET /v1/models,\n"
               "/health, /metrics) that keeps conversations' KV state so a returning chat is\n"
               "restored instead of prefilled again. Flags are llama-server's wherever it has one.\n");
    usage_section(f, "flags", pick_flag);
    fprintf(f, "  %-34s  %s\n", "-h,--help,--usage", "this text");
    usage_section(f, "llama-server flags accepted with no effect (why)", pick_noop);
    usage_section(f, "llama-server flags thaw refuses (why)", pick_refused);
    fprintf(f, "\nEvery flag also accepts --flag=value. On a build without a GPU the placement flags\n"
               "(-ngl, -sm, -ts, -mg, -dev, -ot, -cmoe, -ncmoe, -nkvo, -fit...) are accepted and logged\n"
               "as having no effect.\n");
}
