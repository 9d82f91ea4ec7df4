/* server.h — `thaw serve`: wires config, engine and HTTP, and owns the routes. */
#ifndef THAW_SERVER_H
#define THAW_SERVER_H

/* argv[0] is "serve". Returns the process exit code. */
int thaw_serve_main(int argc, char **argv);

#endif
