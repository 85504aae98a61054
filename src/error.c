/* Status strings and the per-thread message that names what went wrong. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

fa_status fa_error(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void fa_clear_error(void) { last_error[0] = '\0'; }

fa_status fa_error_in(fa_status s, const char *fn) {
    if (!s) return s;
    char why[sizeof last_error];
    snprintf(why, sizeof why, "%s", last_error); /* a copy: fa_error rewrites the message */
    return fa_error(s, "%s: %s", fn, why);
}

const char *fa_last_error(void) { return last_error; }

const char *fa_status_string(fa_status s) {
    switch (s) {
    case FA_OK: return "ok";
    case FA_ERR_INVALID: return "invalid argument";
    case FA_ERR_NULL: return "null pointer";
    case FA_ERR_OVERFLOW: return "size overflow";
    case FA_ERR_UNSUPPORTED: return "unsupported";
    case FA_ERR_NO_MEMORY: return "out of memory";
    case FA_ERR_BACKEND: return "backend failure";
    case FA_ERR_IO: return "i/o error";
    case FA_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
