/* config.h — the `thaw serve` command line: llama-server's flag names, one
 * table that drives parsing, validation and --help (cli/config.c). What it
 * fills is base/config.h's struct thaw_config.
 */
#ifndef THAW_CLI_CONFIG_H
#define THAW_CLI_CONFIG_H

#include "base/config.h"

#include <stdio.h>

/* Parses `argv[1..argc-1]` (argv[0] is the subcommand name) into cfg, which
 * thaw_config_init() filled with the defaults. Returns 0 on success, 1 when
 * --help or --version was printed or --list-devices given (the caller lists
 * them; it exits 0), and a negative THAW_EINVAL after printing a one-line
 * reason to stderr. Every llama-server flag is known: one thaw does not
 * implement is refused with "thaw: FLAG: why" (see --help). What it
 * allocates, thaw_config_free() frees, also after a failure. */
int thaw_config_parse(struct thaw_config *cfg, int argc, char **argv);

/* Prints the serve usage text to `f`. */
void thaw_config_usage(FILE *f);

#endif
