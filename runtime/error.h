/* Filling a polar_error: every fallible internal function returns the status
 * it reports, so callers can write `return polar_fail(err, CODE, fmt, ...)`. */
#ifndef POLAR_ERROR_H
#define POLAR_ERROR_H

#include "polar.h"

#if defined(__GNUC__)
#define POLAR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define POLAR_PRINTF(a, b)
#endif

/* Set err (when not NULL) to code and the formatted message; return code. */
polar_status polar_fail(polar_error *err, polar_status code, const char *fmt, ...) POLAR_PRINTF(3, 4);

#endif
