/* flags.h — the one command-line parser: a command lists its flags in a
 * table, and parsing and --help both walk that table, so a flag cannot
 * exist without being documented. `thaw serve` (cli/config.c), `thaw
 * mkmodel` and `thaw cache` each have their table.
 *
 * What every command accepts: `--flag value` and `--flag=value`; `--a_b`
 * reads as `--a-b` (llama-server's habit); -h, --help, --usage; an
 * argument that does not start with '-' (or is "-") goes to the command's
 * positional function, and is refused where it has none.
 */
#ifndef THAW_CLI_FLAGS_H
#define THAW_CLI_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* How a flag's value is stored, at `off` bytes into the command's struct. */
enum thaw_flag_kind {
    THAW_FLAG_INT,    /* int: a whole number in [min, max] */
    THAW_FLAG_U64,    /* uint64_t: a whole number in [min, max] */
    THAW_FLAG_SIZE,   /* size_t: a whole number in [min, max] */
    THAW_FLAG_FLOAT,  /* float in [min, max] */
    THAW_FLAG_STR,    /* const char *: the argument itself, not empty */
    THAW_FLAG_TRUE,   /* bool set true (a switch) */
    THAW_FLAG_FALSE,  /* bool set false (a switch) */
    THAW_FLAG_FN,     /* the flag's own function takes the value (NULL for a switch) */
    THAW_FLAG_NOOP,   /* accepted with no effect: the table's noop function is told */
    THAW_FLAG_REFUSE, /* refused: "PROG: FLAG: <help>" */
};

struct thaw_flag;

/* A THAW_FLAG_FN flag's function: dst is the command's struct, flag the
 * name as given (after --a_b -> --a-b), value NULL for a switch. Returns 0,
 * or a negative error after printing why on stderr. */
typedef int (*thaw_flag_fn)(void *dst, const struct thaw_flag *f, const char *flag, const char *value);

struct thaw_flag {
    const char *names; /* "-c,--ctx-size": every name the flag answers to */
    const char *arg;   /* the value's metavar ("N", "FILE"); NULL: a switch */
    enum thaw_flag_kind kind;
    size_t off;       /* of the field, for the stored kinds */
    double min, max;  /* bounds of the numeric kinds (an FN may read them too) */
    const char *help; /* one line; '\n' starts another, indented */
    thaw_flag_fn fn;  /* THAW_FLAG_FN only */
};

/* A command's table and what its messages say. */
struct thaw_flags {
    const char *prog; /* prefix of every message: "thaw", "mkmodel", "thaw cache gc" */
    const char *see;  /* "(see SEE --help)": "thaw serve" */
    const struct thaw_flag *flags;
    size_t n_flags;
    /* an argument that is not a flag; NULL: refused ("unexpected argument").
     * Returns 0 or a negative error after printing why. */
    int (*positional)(void *dst, const char *arg);
    /* a THAW_FLAG_NOOP flag was given; NULL: nothing to record */
    void (*noop)(void *dst, const struct thaw_flag *f);
    int width;  /* of the names column in --help (0: 34) */
    int indent; /* spaces before each --help line (0: 2) */
};

/* Parses argv[1..argc-1] into dst. Returns 0, 1 when -h, --help or --usage
 * was given (nothing printed: the caller prints its usage), or THAW_EINVAL
 * (or an FN's error) after printing a one-line reason to stderr. Stops at
 * the first error; what was set before it stays set. */
int thaw_flags_parse(const struct thaw_flags *t, void *dst, int argc, char **argv);

/* The flag of t that answers to `name` ("-c", "--ctx-size"), or NULL. */
const struct thaw_flag *thaw_flags_find(const struct thaw_flags *t, const char *name);

/* Stores one value of flag o (found in t) into dst, as thaw_flags_parse
 * does: `flag` is the name to print in messages, value NULL for a switch
 * (a REFUSE flag is refused). 0, or THAW_EINVAL (or an FN's error) after
 * printing why. */
int thaw_flags_set(const struct thaw_flags *t, const struct thaw_flag *o, void *dst, const char *flag,
                   const char *value);

/* Prints one line per flag of t that `pick` selects (NULL: every flag but
 * NOOP and REFUSE ones): names, metavar, help, and for the stored numeric
 * and string kinds the value in `defaults` (a struct of the command's type
 * holding its defaults; NULL: none shown) unless `show_default` says no. */
void thaw_flags_usage(FILE *f, const struct thaw_flags *t, bool (*pick)(const struct thaw_flag *), const void *defaults,
                      bool (*show_default)(const struct thaw_flag *, const void *defaults));

#endif
