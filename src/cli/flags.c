/* flags.c — the table-driven command-line parser and its --help (flags.h). */
#include "cli/flags.h"

#include "base/error.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------------- */

static bool name_matches(const char *names, const char *arg)
{
    size_t n = strlen(arg);
    const char *p = names;

    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, arg, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

static int parse_number(const struct thaw_flags *t, const struct thaw_flag *o, const char *flag, const char *value,
                        double *out)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(value, &end);
    if (errno || end == value || *end != '\0') {
        fprintf(stderr, "%s: %s expects a number, got '%s'\n", t->prog, flag, value);
        return THAW_EINVAL;
    }
    if (o->kind != THAW_FLAG_FLOAT && v != (double)(long long)v) {
        fprintf(stderr, "%s: %s expects a whole number, got '%s'\n", t->prog, flag, value);
        return THAW_EINVAL;
    }
    if (v < o->min || v > o->max) {
        fprintf(stderr, "%s: %s must be between %g and %g, got '%s'\n", t->prog, flag, o->min, o->max, value);
        return THAW_EINVAL;
    }
    *out = v;
    return 0;
}

const struct thaw_flag *thaw_flags_find(const struct thaw_flags *t, const char *name)
{
    for (size_t j = 0; j < t->n_flags; j++)
        if (name_matches(t->flags[j].names, name))
            return &t->flags[j];
    return NULL;
}

int thaw_flags_set(const struct thaw_flags *t, const struct thaw_flag *o, void *dst, const char *flag,
                   const char *value)
{
    char *field = (char *)dst + o->off;
    double v = 0;
    int rc;

    switch (o->kind) {
    case THAW_FLAG_INT:
        if ((rc = parse_number(t, o, flag, value, &v)) != 0)
            return rc;
        *(int *)field = (int)v;
        break;
    case THAW_FLAG_U64:
        if ((rc = parse_number(t, o, flag, value, &v)) != 0)
            return rc;
        *(uint64_t *)field = (uint64_t)v;
        break;
    case THAW_FLAG_SIZE:
        if ((rc = parse_number(t, o, flag, value, &v)) != 0)
            return rc;
        *(size_t *)field = (size_t)v;
        break;
    case THAW_FLAG_FLOAT:
        if ((rc = parse_number(t, o, flag, value, &v)) != 0)
            return rc;
        *(float *)field = (float)v;
        break;
    case THAW_FLAG_STR:
        if (!*value) {
            fprintf(stderr, "%s: %s must not be empty\n", t->prog, flag);
            return THAW_EINVAL;
        }
        *(const char **)field = value;
        break;
    case THAW_FLAG_TRUE:
        *(bool *)field = true;
        break;
    case THAW_FLAG_FALSE:
        *(bool *)field = false;
        break;
    case THAW_FLAG_FN:
        return o->fn(dst, o, flag, value);
    case THAW_FLAG_NOOP:
        if (t->noop)
            t->noop(dst, o);
        break;
    case THAW_FLAG_REFUSE:
        fprintf(stderr, "%s: %s: %s\n", t->prog, flag, o->help);
        return THAW_EINVAL;
    }
    return 0;
}

int thaw_flags_parse(const struct thaw_flags *t, void *dst, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        const char *value = NULL;
        const struct thaw_flag *o;
        char name[64];
        int rc;

        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0 || strcmp(flag, "--usage") == 0)
            return 1;
        if (flag[0] != '-' || flag[1] == '\0') {
            if (!t->positional) {
                fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", t->prog, flag, t->see);
                return THAW_EINVAL;
            }
            if ((rc = t->positional(dst, flag)) != 0)
                return rc;
            continue;
        }
        /* llama-server reads "--a_b" as "--a-b", and takes --flag=value */
        if (flag[0] == '-' && flag[1] == '-') {
            size_t len = strcspn(flag, "=");
            if (len < sizeof name) {
                for (size_t k = 0; k < len; k++)
                    name[k] = flag[k] == '_' ? '-' : flag[k];
                name[len] = '\0';
                if (flag[len] == '=')
                    value = flag + len + 1;
                flag = name;
            }
        }
        if (!(o = thaw_flags_find(t, flag))) {
            fprintf(stderr, "%s: unknown flag '%s' (see %s --help)\n", t->prog, argv[i], t->see);
            return THAW_EINVAL;
        }
        if (o->kind == THAW_FLAG_REFUSE)
            return thaw_flags_set(t, o, dst, flag, NULL);
        if (o->arg && !value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value (%s)\n", t->prog, flag, o->arg);
                return THAW_EINVAL;
            }
            value = argv[++i];
        } else if (!o->arg && value) {
            fprintf(stderr, "%s: %s takes no value\n", t->prog, flag);
            return THAW_EINVAL;
        }
        if ((rc = thaw_flags_set(t, o, dst, flag, value)) != 0)
            return rc;
    }
    return 0;
}

/* ---- --help -------------------------------------------------------------------- */

static void print_default(FILE *f, const struct thaw_flag *o, const void *defaults)
{
    const char *field = (const char *)defaults + o->off;

    switch (o->kind) {
    case THAW_FLAG_INT:
        fprintf(f, " [default: %d]", *(const int *)field);
        break;
    case THAW_FLAG_U64:
        fprintf(f, " [default: %llu]", (unsigned long long)*(const uint64_t *)field);
        break;
    case THAW_FLAG_SIZE:
        fprintf(f, " [default: %zu]", *(const size_t *)field);
        break;
    case THAW_FLAG_FLOAT:
        fprintf(f, " [default: %g]", *(const float *)field);
        break;
    case THAW_FLAG_STR:
        if (*(const char *const *)field)
            fprintf(f, " [default: %s]", *(const char *const *)field);
        break;
    default:
        break;
    }
}

void thaw_flags_usage(FILE *f, const struct thaw_flags *t, bool (*pick)(const struct thaw_flag *), const void *defaults,
                      bool (*show_default)(const struct thaw_flag *, const void *defaults))
{
    int width = t->width > 0 ? t->width : 34;
    int indent = t->indent > 0 ? t->indent : 2;

    for (size_t i = 0; i < t->n_flags; i++) {
        const struct thaw_flag *o = &t->flags[i];
        char left[160];

        if (pick ? !pick(o) : (o->kind == THAW_FLAG_NOOP || o->kind == THAW_FLAG_REFUSE))
            continue;
        snprintf(left, sizeof left, "%s%s%s", o->names, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "%*s%-*s  ", indent, "", width, left);
        for (const char *p = o->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "%*s%-*s  ", indent, "", width, "");
        }
        if (defaults && (!show_default || show_default(o, defaults)))
            print_default(f, o, defaults);
        fputc('\n', f);
    }
}
