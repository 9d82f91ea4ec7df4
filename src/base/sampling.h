/* sampling.h — the sampler settings a reply is drawn with (the chain of
 * llama.cpp samplers they build is sampler.c's).
 *
 * The server's defaults (--temp, --top-k, --samplers, ...) fill one of
 * these at start-up; a request's own fields override them for that request
 * (engine.c). Names, meanings and defaults are llama-server's
 * (common_params_sampling), so the same command line samples the same way.
 */
#ifndef THAW_SAMPLING_H
#define THAW_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THAW_SAMPLING_MAX_STAGES 16
#define THAW_SAMPLING_BREAKERS_BYTES 256
#define THAW_SAMPLING_MAX_BIAS 64
#define THAW_SAMPLING_SEED_RANDOM 0xFFFFFFFFu /* libllama's LLAMA_DEFAULT_SEED (sampler.c checks) */

/* One stage of the chain, in --samplers order. */
enum thaw_sampler_stage {
    THAW_STAGE_PENALTIES,
    THAW_STAGE_DRY,
    THAW_STAGE_TOP_N_SIGMA,
    THAW_STAGE_TOP_K,
    THAW_STAGE_TYPICAL_P,
    THAW_STAGE_TOP_P,
    THAW_STAGE_MIN_P,
    THAW_STAGE_XTC,
    THAW_STAGE_TEMPERATURE,
    THAW_STAGE_ADAPTIVE_P,
};

struct thaw_sampling {
    float temp;              /* <= 0: greedy */
    int top_k;               /* <= 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float top_n_sigma;       /* < 0: off */
    float typ_p;             /* 1: off */
    float xtc_probability;   /* 0: off */
    float xtc_threshold;     /* > 0.5: off */
    int penalty_last_n;      /* tokens looked back; 0 = off, -1 = the slot's context */
    float penalty_repeat;    /* 1: off */
    float penalty_freq;      /* 0: off */
    float penalty_present;   /* 0: off */
    float dry_multiplier;    /* 0: off */
    float dry_base;
    int dry_allowed_length;
    int dry_penalty_last_n;  /* 0 = off, -1 = the slot's context */
    char dry_breakers[THAW_SAMPLING_BREAKERS_BYTES]; /* n_dry_breakers NUL-terminated strings, back to back */
    int n_dry_breakers;
    float dynatemp_range;    /* 0: off */
    float dynatemp_exponent;
    int mirostat;            /* 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces the stage list) */
    float mirostat_tau;      /* --mirostat-ent */
    float mirostat_eta;      /* --mirostat-lr */
    float adaptive_target;   /* < 0: off */
    float adaptive_decay;
    uint32_t seed;           /* THAW_SAMPLING_SEED_RANDOM (LLAMA_DEFAULT_SEED) = a random seed per request */
    bool ignore_eos;         /* end-of-generation tokens get a -inf logit */
    struct {
        int32_t token;
        float bias;          /* added to the logit; -INFINITY bans the token */
    } logit_bias[THAW_SAMPLING_MAX_BIAS]; /* --logit-bias, n_logit_bias of them */
    int n_logit_bias;
    uint8_t stages[THAW_SAMPLING_MAX_STAGES]; /* enum thaw_sampler_stage, n_stages of them */
    int n_stages;
};

/* llama-server's defaults. */
void thaw_sampling_default(struct thaw_sampling *s);

/* --samplers: names separated by ';' (llama-server's names and aliases:
 * top_k, top-k, topk, temperature, temp, ...). Returns 0, or THAW_EINVAL with
 * the offending name in err[errlen]; `s` is unchanged on error. */
int thaw_sampling_set_stages(struct thaw_sampling *s, const char *names, char *err, size_t errlen);

/* --sampler-seq: one letter a stage (e d s k y p m x t a). Same returns. */
int thaw_sampling_set_seq(struct thaw_sampling *s, const char *letters, char *err, size_t errlen);

/* --dry-sequence-breaker: the first call replaces the defaults, later ones
 * add; "none" clears them. `value` takes \n, \t, \", \\ escapes. Returns 0,
 * or THAW_EINVAL (too many bytes) with the reason in err. */
int thaw_sampling_add_breaker(struct thaw_sampling *s, bool first, const char *value, char *err, size_t errlen);

/* --logit-bias TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 2-inf: adds one. Returns
 * 0, or THAW_EINVAL with the reason in err. */
int thaw_sampling_add_bias(struct thaw_sampling *s, const char *value, char *err, size_t errlen);

/* The stage names in order, ';'-separated, for --help and the start-up log. */
void thaw_sampling_stages_str(const struct thaw_sampling *s, char *out, size_t outlen);

#endif
