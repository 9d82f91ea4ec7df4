/* mkmodel.h — `thaw mkmodel`: write a random-weight GGUF model for tests and
 * benchmarks.
 *
 * The file carries a real tokenizer (the `tokenizer.*` keys of a vocab-only
 * GGUF from the llama.cpp source tree), a real chat template (the vocab's, a
 * built-in, the model family's from the tree's models/templates/, or
 * --chat-template-file) and random weights shaped like a real `llama`,
 * `gemma3` (sliding window), `qwen3`, `gemma4` (sliding window) or `lfm2`
 * (hybrid: recurrent short-convolution and attention layers) model, so
 * llama.cpp v0.4.0 loads it, templates, tokenizes and decodes it at the cost
 * of a real model of that shape; the text it generates is gibberish. Same
 * flags + same --seed + same vocab and template files => byte-identical
 * file.
 *
 * Run `thaw mkmodel --help` for the flags and their defaults.
 */
#ifndef THAW_MKMODEL_H
#define THAW_MKMODEL_H

/* Entry point of the `mkmodel` subcommand. argv[0] is "mkmodel" (it only
 * names the command in messages); argv[1..argc-1] are its flags. Parses the
 * flags, writes the model to a temporary file next to -o, fsyncs it and
 * renames it into place (an existing file at -o is replaced only on
 * success), then prints a one-line summary to stderr.
 *
 * Returns a process exit code: 0 success (also for --help), 1 the model could
 * not be written (message on stderr, no file left behind), 2 usage error,
 * including a vocab or --chat-template-file that cannot be used (message on
 * stderr). Never calls exit(). Does not load any ggml backend. */
int thaw_mkmodel_main(int argc, char **argv);

#endif
