/* fixture_models.h — generated models for the unit tests of the lower
 * layers (llama/, cache/), made by the real `thaw mkmodel` binary: a test
 * below cli/ includes nothing from it.
 *
 * The binary is $THAW_BIN when set, else the build's own thaw (THAW_BIN,
 * a compile definition: CMake builds it before the tests).
 */
#ifndef THAW_FIXTURE_MODELS_H
#define THAW_FIXTURE_MODELS_H

/* Runs `thaw mkmodel argv[1..argc-1]` (argv[0] is "mkmodel", as for the
 * command; argv[argc] need not be NULL) and waits for it. Its summary and
 * errors go to this process's stderr. Returns its exit status (0: the
 * model is written), or -1 when it could not be run or was killed. */
int fixture_mkmodel(int argc, char **argv);

#endif
