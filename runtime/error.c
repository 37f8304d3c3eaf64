#include "error.h"

#include <stdarg.h>
#include <stdio.h>

const char *polar_status_name(polar_status s) {
    switch (s) {
    case POLAR_OK: return "ok";
    case POLAR_ERR_ARG: return "argument";
    case POLAR_ERR_IO: return "io";
    case POLAR_ERR_FORMAT: return "format";
    case POLAR_ERR_CONFIG: return "config";
    case POLAR_ERR_UNSUPPORTED: return "unsupported";
    case POLAR_ERR_PROGRAM: return "program";
    case POLAR_ERR_RANGE: return "range";
    case POLAR_ERR_NOMEM: return "out of memory";
    case POLAR_ERR_FULL: return "full";
    }
    return "unknown";
}

polar_status polar_fail(polar_error *err, polar_status code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
