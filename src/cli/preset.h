/* preset.h — llama-server's --models-preset file, read into sections of
 * key/value lines (the flags they name are cli/config.c's to apply).
 *
 * The format (llama-server's tools/server/README.md, "Model presets"):
 *
 *   ; a comment, as is '#' (a value ends at the first ';' or '#')
 *   version = 1          ; reserved, skipped (also before any section)
 *   [*]                  ; settings every model gets
 *   c = 8192
 *   [NAME]               ; a model named NAME, its own settings
 *   model = /path/x.gguf
 *
 * Keys are [A-Za-z_][A-Za-z0-9_.-]*, the value is the rest of the line
 * (surrounding blanks trimmed, no quoting). Every error names FILE:LINE.
 */
#ifndef THAW_CLI_PRESET_H
#define THAW_CLI_PRESET_H

struct thaw_preset_kv {
    const char *key, *value; /* into thaw_preset.text */
    int line;                /* 1-based */
};

struct thaw_preset_section {
    const char *name; /* "*" or a model's name; into thaw_preset.text */
    int line;         /* of its [header] */
    struct thaw_preset_kv *kv;
    int n_kv;
};

/* A parsed file: plain data, every string pointing into `text`. */
struct thaw_preset {
    const char *path;
    char *text; /* the file, cut into NUL-terminated pieces (owned: a caller may take it, leaving NULL) */
    struct thaw_preset_section *sections; /* in file order */
    int n;
};

/* Reads and parses the file at path into *out. Returns 0, or THAW_EINVAL
 * after printing "thaw: PATH:LINE: why" (or why the file cannot be read)
 * to stderr; THAW_ENOMEM. A section named twice is an error, as is a key
 * before any section other than `version`. `path` must outlive *out. */
int thaw_preset_read(const char *path, struct thaw_preset **out);

/* The section named `name`, or NULL. */
const struct thaw_preset_section *thaw_preset_section(const struct thaw_preset *p, const char *name);

/* Frees p and what it owns. NULL: no-op. */
void thaw_preset_free(struct thaw_preset *p);

#endif
