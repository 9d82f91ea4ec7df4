/* sampling.c — sampler settings: llama-server's defaults, --samplers and
 * its letters, DRY breakers, logit biases. No libllama here: sampler.c
 * builds the chain from them.
 */
#include "base/sampling.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    char letter;
    enum thaw_sampler_stage stage;
} stage_names[] = {
    {"penalties", 'e', THAW_STAGE_PENALTIES},     {"dry", 'd', THAW_STAGE_DRY},
    {"top_n_sigma", 's', THAW_STAGE_TOP_N_SIGMA}, {"top_k", 'k', THAW_STAGE_TOP_K},
    {"typ_p", 'y', THAW_STAGE_TYPICAL_P},         {"top_p", 'p', THAW_STAGE_TOP_P},
    {"min_p", 'm', THAW_STAGE_MIN_P},             {"xtc", 'x', THAW_STAGE_XTC},
    {"temperature", 't', THAW_STAGE_TEMPERATURE}, {"adaptive_p", 'a', THAW_STAGE_ADAPTIVE_P},
};
#define N_STAGE_NAMES (sizeof stage_names / sizeof stage_names[0])

void thaw_sampling_default(struct thaw_sampling *s)
{
    static const uint8_t order[] = {THAW_STAGE_PENALTIES, THAW_STAGE_DRY,   THAW_STAGE_TOP_N_SIGMA,
                                    THAW_STAGE_TOP_K,     THAW_STAGE_TYPICAL_P, THAW_STAGE_TOP_P,
                                    THAW_STAGE_MIN_P,     THAW_STAGE_XTC,   THAW_STAGE_TEMPERATURE};
    char err[8];

    memset(s, 0, sizeof *s);
    s->temp = 0.8f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->min_p = 0.05f;
    s->top_n_sigma = -1.0f;
    s->typ_p = 1.0f;
    s->xtc_probability = 0.0f;
    s->xtc_threshold = 0.1f;
    s->penalty_last_n = 64;
    s->penalty_repeat = 1.0f;
    s->dry_base = 1.75f;
    s->dry_allowed_length = 2;
    s->dry_penalty_last_n = 64;
    s->dynatemp_exponent = 1.0f;
    s->mirostat_tau = 5.0f;
    s->mirostat_eta = 0.1f;
    s->adaptive_target = -1.0f;
    s->adaptive_decay = 0.9f;
    s->seed = THAW_SAMPLING_SEED_RANDOM;
    memcpy(s->stages, order, sizeof order);
    s->n_stages = (int)sizeof order;
    thaw_sampling_add_breaker(s, true, "\\n", err, sizeof err);
    thaw_sampling_add_breaker(s, false, ":", err, sizeof err);
    thaw_sampling_add_breaker(s, false, "\\\"", err, sizeof err);
    thaw_sampling_add_breaker(s, false, "*", err, sizeof err);
}

/* llama-server's names, their kebab-case and no-dash forms, and its aliases. */
static int stage_by_name(const char *name, size_t len)
{
    static const struct {
        const char *alias;
        enum thaw_sampler_stage stage;
    } aliases[] = {{"nucleus", THAW_STAGE_TOP_P}, {"temp", THAW_STAGE_TEMPERATURE}, {"typ", THAW_STAGE_TYPICAL_P}};
    char a[32], b[32];

    if (len == 0 || len >= sizeof a)
        return -1;
    for (size_t i = 0; i < N_STAGE_NAMES; i++) {
        const char *n = stage_names[i].name;
        size_t nl = strlen(n), j, k = 0;
        for (j = 0; j <= nl; j++) {
            a[j] = n[j] == '_' ? '-' : n[j];
            if (n[j] != '_')
                b[k++] = n[j];
        }
        if ((nl == len && strncasecmp(n, name, len) == 0) || (nl == len && strncasecmp(a, name, len) == 0) ||
            (k - 1 == len && strncasecmp(b, name, len) == 0))
            return (int)stage_names[i].stage;
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strlen(aliases[i].alias) == len && strncasecmp(aliases[i].alias, name, len) == 0)
            return (int)aliases[i].stage;
    return -1;
}

int thaw_sampling_set_stages(struct thaw_sampling *s, const char *names, char *err, size_t errlen)
{
    uint8_t st[THAW_SAMPLING_MAX_STAGES];
    int n = 0;
    const char *p = names;

    while (*p) {
        size_t len = strcspn(p, ";");
        if (len > 0) {
            int k = stage_by_name(p, len);
            if (k < 0) {
                snprintf(err, errlen, "unknown sampler '%.*s' (penalties, dry, top_n_sigma, top_k, typ_p, top_p, "
                                      "min_p, xtc, temperature, adaptive_p)", (int)len, p);
                return THAW_EINVAL;
            }
            if (n == THAW_SAMPLING_MAX_STAGES) {
                snprintf(err, errlen, "at most %d samplers", THAW_SAMPLING_MAX_STAGES);
                return THAW_EINVAL;
            }
            st[n++] = (uint8_t)k;
        }
        p += len;
        if (*p == ';')
            p++;
    }
    memcpy(s->stages, st, (size_t)n);
    s->n_stages = n;
    return 0;
}

int thaw_sampling_set_seq(struct thaw_sampling *s, const char *letters, char *err, size_t errlen)
{
    uint8_t st[THAW_SAMPLING_MAX_STAGES];
    int n = 0;

    for (const char *p = letters; *p; p++) {
        size_t i;
        for (i = 0; i < N_STAGE_NAMES && stage_names[i].letter != *p; i++)
            ;
        if (i == N_STAGE_NAMES) {
            snprintf(err, errlen, "unknown sampler letter '%c' (e d s k y p m x t a)", *p);
            return THAW_EINVAL;
        }
        if (n == THAW_SAMPLING_MAX_STAGES) {
            snprintf(err, errlen, "at most %d samplers", THAW_SAMPLING_MAX_STAGES);
            return THAW_EINVAL;
        }
        st[n++] = (uint8_t)stage_names[i].stage;
    }
    memcpy(s->stages, st, (size_t)n);
    s->n_stages = n;
    return 0;
}

int thaw_sampling_add_breaker(struct thaw_sampling *s, bool first, const char *value, char *err, size_t errlen)
{
    size_t used = 0;
    char buf[THAW_SAMPLING_BREAKERS_BYTES];
    size_t n = 0;

    if (first) {
        s->n_dry_breakers = 0;
    } else {
        for (int i = 0; i < s->n_dry_breakers; i++)
            used += strlen(s->dry_breakers + used) + 1;
    }
    if (strcmp(value, "none") == 0) {
        s->n_dry_breakers = 0;
        return 0;
    }
    const char *p = value;
    for (; *p && n < sizeof buf - 1; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            buf[n++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
        } else {
            buf[n++] = *p;
        }
    }
    if (n == 0 || *p || used + n + 1 > sizeof s->dry_breakers) {
        snprintf(err, errlen, n == 0 ? "an empty sequence breaker" : "sequence breakers longer than %zu bytes in all",
                 sizeof s->dry_breakers);
        return THAW_EINVAL;
    }
    memcpy(s->dry_breakers + used, buf, n);
    s->dry_breakers[used + n] = '\0';
    s->n_dry_breakers++;
    return 0;
}

void thaw_sampling_stages_str(const struct thaw_sampling *s, char *out, size_t outlen)
{
    size_t n = 0;

    if (outlen)
        out[0] = '\0';
    for (int i = 0; i < s->n_stages && n < outlen; i++)
        for (size_t j = 0; j < N_STAGE_NAMES; j++)
            if ((uint8_t)stage_names[j].stage == s->stages[i]) {
                int w = snprintf(out + n, outlen - n, "%s%s", i ? ";" : "", stage_names[j].name);
                n += w > 0 ? (size_t)w : 0;
            }
}

int thaw_sampling_add_bias(struct thaw_sampling *s, const char *value, char *err, size_t errlen)
{
    char *end = NULL;
    long tok = strtol(value, &end, 10);
    float b;

    if (end == value || tok < 0 || tok > INT32_MAX || (*end != '+' && *end != '-')) {
        snprintf(err, errlen, "expects TOKEN_ID(+|-)BIAS, e.g. 15043+1, got '%s'", value);
        return THAW_EINVAL;
    }
    char sign = *end;
    const char *num = end + 1;
    b = strtof(num, &end);
    if (end == num || *end || isnan(b)) {
        snprintf(err, errlen, "expects TOKEN_ID(+|-)BIAS, e.g. 15043+1, got '%s'", value);
        return THAW_EINVAL;
    }
    if (s->n_logit_bias == THAW_SAMPLING_MAX_BIAS) {
        snprintf(err, errlen, "at most %d biases", THAW_SAMPLING_MAX_BIAS);
        return THAW_EINVAL;
    }
    s->logit_bias[s->n_logit_bias].token = (int32_t)tok;
    s->logit_bias[s->n_logit_bias++].bias = sign == '-' ? -b : b;
    return 0;
}
