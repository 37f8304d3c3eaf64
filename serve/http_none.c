/* polar serve in a build without libmicrohttpd (its headers were missing
 * when make ran, e.g. on a machine with no package manager): the rest of
 * the CLI and the library are whole, and `polar serve` says why it cannot
 * start. The Makefile picks this file in place of http.c. */
#include <stdio.h>

#include "serve.h"

void serve_block_signals(void) {}

int serve_run(serve_server *s) {
    (void)s;
    fprintf(stderr, "polar serve: error: this polar was built without an HTTP server (libmicrohttpd's headers were "
                    "missing at build time; Debian: apt-get install libmicrohttpd-dev, then make)\n");
    return 1;
}
