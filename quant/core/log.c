/* Logging sink for log.h: one line per event on stderr. */
#include "quant/core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int qd_log_threshold = QD_LOG_INFO;

void qd_log_set_level(int level) { qd_log_threshold = level; }

int qd_log_level_parse(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, names[i]) == 0) return i;
    return -1;
}

void qd_log_emit(int level, const char *event, const char *fmt, ...)
{
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level < 0 ? 0 : level > 4 ? 4 : level], event);
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    if ((size_t)n < sizeof line) vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
