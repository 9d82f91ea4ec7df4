/* server.h — `thaw serve`: wires config, engine and HTTP, and owns the routes. */
#ifndef THAW_SERVER_H
#define THAW_SERVER_H

#include "base/config.h"

/* Runs the server with cfg (parsed by cli/config.h; copied, its strings
 * must outlive the call) until SIGINT or SIGTERM. Returns the process exit
 * code: 0 after a clean shutdown, 1 when it could not start. */
int thaw_serve(const struct thaw_config *cfg);

#endif
