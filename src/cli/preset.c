/* preset.c — the --models-preset INI reader (preset.h): lines into
 * sections of key/value pairs, cut in place in the file's text. */
#include "cli/preset.h"

#include "base/buf.h"
#include "base/error.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRESET_MAX_BYTES (1u << 20) /* a preset file is a few lines: a larger one is a mistake */

static char *trim(char *s)
{
    char *end;

    while (*s == ' ' || *s == '\t')
        s++;
    end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    return s;
}

static bool is_key(const char *s)
{
    if (!isalpha((unsigned char)*s) && *s != '_')
        return false;
    for (s++; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_.-", *s))
            return false;
    return true;
}

static int fail(const struct thaw_preset *p, int line, const char *why, const char *what)
{
    fprintf(stderr, "thaw: %s:%d: %s%s%s%s\n", p->path, line, why, what ? " '" : "", what ? what : "", what ? "'" : "");
    return THAW_EINVAL;
}

static int add_section(struct thaw_preset *p, const char *name, int line)
{
    const struct thaw_preset_section *seen = thaw_preset_section(p, name);
    struct thaw_preset_section *grown;

    if (seen) {
        fprintf(stderr, "thaw: %s:%d: section [%s] again (first at line %d): one section per model\n", p->path, line,
                name, seen->line);
        return THAW_EINVAL;
    }
    if (!(grown = realloc(p->sections, (size_t)(p->n + 1) * sizeof *grown)))
        return THAW_ENOMEM;
    p->sections = grown;
    p->sections[p->n++] = (struct thaw_preset_section){.name = name, .line = line};
    return 0;
}

static int add_kv(struct thaw_preset_section *s, const char *key, const char *value, int line)
{
    struct thaw_preset_kv *grown = realloc(s->kv, (size_t)(s->n_kv + 1) * sizeof *grown);

    if (!grown)
        return THAW_ENOMEM;
    s->kv = grown;
    s->kv[s->n_kv++] = (struct thaw_preset_kv){.key = key, .value = value, .line = line};
    return 0;
}

/* One line, without its newline: a header, a key = value, a comment or blank. */
static int parse_line(struct thaw_preset *p, char *s, int line)
{
    char *eq;

    s[strcspn(s, ";#")] = '\0'; /* llama-server's: a value ends at a comment */
    s = trim(s);
    if (!*s)
        return 0;
    if (*s == '[') {
        char *end = strchr(s, ']');
        if (!end || end[1] != '\0')
            return fail(p, line, "a section header is [NAME] alone on its line, got", s);
        *end = '\0';
        s = trim(s + 1);
        if (!*s)
            return fail(p, line, "a section needs a name: [*] for every model, [NAME] for one", NULL);
        return add_section(p, s, line);
    }
    if (!(eq = strchr(s, '=')))
        return fail(p, line, "expected KEY = VALUE or [SECTION], got", s);
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    if (!is_key(key))
        return fail(p, line, "not a key (a flag's name without its dashes):", key);
    if (p->n == 0) {
        if (strcmp(key, "version") == 0)
            return 0; /* reserved by llama-server for later formats */
        return fail(p, line, "a setting before any section: put it under [*] (every model) or [NAME]:", key);
    }
    return add_kv(&p->sections[p->n - 1], key, value, line);
}

int thaw_preset_read(const char *path, struct thaw_preset **out)
{
    struct thaw_preset *p = calloc(1, sizeof *p);
    int rc, line = 1;
    char *s;

    *out = NULL;
    if (!p)
        return THAW_ENOMEM;
    p->path = path;
    if ((rc = thaw_read_file(path, PRESET_MAX_BYTES, &p->text, NULL)) != 0) {
        fprintf(stderr, "thaw: --models-preset: cannot read '%s': %s\n", path,
                rc == THAW_ETOOBIG ? "larger than 1 MiB" : thaw_strerror(rc));
        rc = rc == THAW_ENOMEM ? rc : THAW_EINVAL;
        goto error;
    }
    for (s = p->text; *s; line++) {
        char *nl = s + strcspn(s, "\n");
        bool last = *nl == '\0';
        *nl = '\0';
        if (nl > s && nl[-1] == '\r')
            nl[-1] = '\0';
        if ((rc = parse_line(p, s, line)) != 0)
            goto error;
        s = last ? nl : nl + 1;
    }
    *out = p;
    return 0;

error:
    thaw_preset_free(p);
    return rc;
}

const struct thaw_preset_section *thaw_preset_section(const struct thaw_preset *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->sections[i].name, name) == 0)
            return &p->sections[i];
    return NULL;
}

void thaw_preset_free(struct thaw_preset *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        free(p->sections[i].kv);
    free(p->sections);
    free(p->text);
    free(p);
}
