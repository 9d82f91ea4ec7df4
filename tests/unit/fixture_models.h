/* fixture_models.h — generated models for the unit tests of the lower
 * layers (llama/, cache/), made by the real `thaw mkmodel` binary: a test
 * below cli/ includes nothing from it.
 *
 * The binary is $THAW_BIN when set, else the build's own thaw (THAW_BIN,
 * a compile definition: CMake builds it before the tests).
 */
#ifndef THAW_FIXTURE_MODELS_H
#define THAW_FIXTURE_MODELS_H

struct llama_model;

/* Runs `thaw mkmodel argv[1..argc-1]` (argv[0] is "mkmodel", as for the
 * command; argv[argc] need not be NULL) and waits for it. Its summary and
 * errors go to this process's stderr. Returns its exit status (0: the
 * model is written), or -1 when it could not be run or was killed. */
int fixture_mkmodel(int argc, char **argv);

/* The start of a test group that loads models: libllama quiet (its
 * errors shown with THAW_TEST_VERBOSE set), its backends loaded (from
 * $THAW_BACKEND_DIR when set, as the server takes it: another CPU
 * variant; else the build's), and dir (a mkdtemp template,
 * "/tmp/name_XXXXXX") made. Returns 0 or -1. */
int fixture_llama_open(char *dir);

/* llama.cpp's vocabulary file ggml-vocab-NAME.gguf (fetched by setup
 * into .deps/llama.cpp/models), loaded vocab only; NULL when it cannot be.
 * The caller frees it with llama_model_free. */
struct llama_model *fixture_vocab_model(const char *name);

/* The end of such a group: dir and all in it removed, libllama's
 * backends freed. Returns 0 or -1. */
int fixture_llama_close(const char *dir);

#endif
