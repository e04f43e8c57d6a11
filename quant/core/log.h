/* Logging: one level-checked macro with structured key=value fields.
 *
 *   QD_LOG(QD_LOG_INFO, "block done", "job=%s block=%d secs=%.2f", id, i, s);
 *
 * The level test happens before the arguments are evaluated. Output goes to stderr (the
 * daemon's journal under systemd) as `LEVEL event key=value...`. The threshold is set once
 * at start-up with qd_log_set_level; the programs take it from QUANTD_LOG=debug|info|warn|
 * error|off through the runtime options (quant/core/runtime.h, startup/runtime_env.h).
 *
 * Every string and character argument (%s, %c) is escaped by the sink (log.c says how), so a
 * value from a job, from Redis or from a worker can never break a line in two or end a
 * quoted value early: callers write err=\"%s\" and pass the value as it is. */
#ifndef QUANT_CORE_LOG_H
#define QUANT_CORE_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum qd_log_level { QD_LOG_DEBUG = 0, QD_LOG_INFO = 1, QD_LOG_WARN = 2, QD_LOG_ERROR = 3, QD_LOG_OFF = 4 };

extern int qd_log_threshold;   /* written once at start-up, read everywhere */

void qd_log_set_level(int level);
/* Parses "debug", "info", "warn", "error", "off"; returns the level or -1. */
int qd_log_level_parse(const char *s);
void qd_log_emit(int level, const char *event, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The sink's escaping, for whoever writes a log-like line itself: src[0..len) into dst
 * (NUL-terminated, cut at cap without splitting an escape). Returns the length the whole
 * escaped text needs, not counting the NUL (as snprintf). */
size_t qd_log_escape(char *dst, size_t cap, const char *src, size_t len);
/* The sink's formatting: fmt as printf would, with every %s and %c argument escaped.
 * Returns the length the whole text needs (as snprintf). */
size_t qd_log_format(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
size_t qd_log_vformat(char *dst, size_t cap, const char *fmt, va_list ap);

#define QD_LOG(level, event, ...) do { \
    if ((level) >= qd_log_threshold) qd_log_emit((level), (event), __VA_ARGS__); } while (0)

#endif
