/* Logging sink for log.h: one line per event on stderr, whatever the arguments hold.
 *
 * Values in a log line often come from outside (a job's paths and id, a Redis error, a
 * worker's message), and a newline in one of them would start a forged line, a quote would
 * end a quoted value early and forge a key=value field after it. So the sink formats the
 * line itself: the format's own text is copied as written, and every string or character
 * argument (%s, %c) is escaped on the way in: backslash and double quote get a backslash,
 * \n \r \t stay readable as such, and every other control byte (and DEL) becomes \xNN. Bytes
 * of 0x80 and above pass unchanged, so UTF-8 stays readable. No caller can forget it, and a
 * value written into err="%s" always reads back as one quoted value. */
#include "quant/core/log.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

/* The line under construction: n may run past cap (the text is cut, never overrun). */
typedef struct line_buf {
    char *p;
    size_t cap, n;
} line_buf;

static void put_raw(line_buf *b, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++, b->n++)
        if (b->n + 1 < b->cap) b->p[b->n] = s[i];
}

size_t qd_log_escape(char *dst, size_t cap, const char *src, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    line_buf b = {dst, cap, 0};
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        char e[4] = {'\\', 0, 0, 0};
        size_t k = 2;
        if (c == '\\' || c == '"') e[1] = (char)c;
        else if (c == '\n') e[1] = 'n';
        else if (c == '\r') e[1] = 'r';
        else if (c == '\t') e[1] = 't';
        else if (c < 0x20 || c == 0x7f) { e[1] = 'x'; e[2] = hex[c >> 4]; e[3] = hex[c & 15]; k = 4; }
        else { put_raw(&b, (const char *)&c, 1); continue; }
        /* An escape is never cut in half: the reader would see a different byte. */
        if (b.n + k + 1 > cap) { b.n += k; continue; }
        put_raw(&b, e, k);
    }
    if (cap) dst[b.n < cap ? b.n : cap - 1] = 0;
    return b.n;
}

static void put_escaped(line_buf *b, const char *s, size_t len)
{
    size_t room = b->n + 1 < b->cap ? b->cap - b->n : 1;
    b->n += qd_log_escape(b->p + (b->n < b->cap ? b->n : b->cap - 1), room, s, len);
}

/* One conversion of the format, "%..." up to and including its conversion character, with
 * the argument it takes. Numbers are formatted by snprintf from the same spec; strings and
 * characters are formatted the same way, then escaped. Returns the length of the spec. */
static size_t put_conversion(line_buf *b, const char *spec, va_list *ap)
{
    char sub[32], tmp[2048];
    size_t i = 1;
    int width = 0, prec = -1, have_width = 0;
    while (spec[i] && strchr("-+ #0'", spec[i])) i++;
    size_t flags_end = i;
    if (spec[i] == '*') { width = va_arg(*ap, int); have_width = 1; i++; }
    else if (spec[i] >= '0' && spec[i] <= '9') {
        while (spec[i] >= '0' && spec[i] <= '9') width = width * 10 + (spec[i++] - '0');
        have_width = 1;
    }
    if (spec[i] == '.') {
        i++;
        if (spec[i] == '*') { prec = va_arg(*ap, int); i++; }
        else { prec = 0; while (spec[i] >= '0' && spec[i] <= '9') prec = prec * 10 + (spec[i++] - '0'); }
    }
    size_t len_start = i;
    while (spec[i] && strchr("hljztLq", spec[i])) i++;
    char conv = spec[i];
    if (!conv) { put_raw(b, spec, i); return i; }   /* a lone '%' at the end: as written */
    size_t spec_len = i + 1;
    /* The spec again with width and precision as numbers (a '*' already took its argument). */
    int k = snprintf(sub, sizeof sub, "%%%.*s", (int)(flags_end - 1), spec + 1);
    if (have_width) k += snprintf(sub + k, sizeof sub - (size_t)k, "%d", width);
    if (prec >= 0) k += snprintf(sub + k, sizeof sub - (size_t)k, ".%d", prec);
    snprintf(sub + k, sizeof sub - (size_t)k, "%.*s%c", (int)(spec_len - len_start - 1), spec + len_start, conv);
    const char *lm = spec + len_start;
    size_t lml = spec_len - len_start - 1;
    int n = 0;
    switch (conv) {
    case '%':
        put_raw(b, "%", 1);
        return spec_len;
    case 's': {
        const char *s = va_arg(*ap, const char *);
        n = snprintf(tmp, sizeof tmp, sub, s ? s : "(null)");
        put_escaped(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
        return spec_len;
    }
    case 'c':
        n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, int));
        put_escaped(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
        return spec_len;
    case 'd': case 'i': case 'u': case 'x': case 'X': case 'o':
        if (lml == 2 && lm[0] == 'l' && lm[1] == 'l') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, long long));
        else if (lml == 1 && (lm[0] == 'q')) n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, long long));
        else if (lml == 1 && lm[0] == 'l') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, long));
        else if (lml == 1 && lm[0] == 'z') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, size_t));
        else if (lml == 1 && lm[0] == 'j') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, intmax_t));
        else if (lml == 1 && lm[0] == 't') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, ptrdiff_t));
        else n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, int));   /* int, and h / hh (promoted) */
        break;
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
        if (lml == 1 && lm[0] == 'L') n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, long double));
        else n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, double));
        break;
    case 'p':
        n = snprintf(tmp, sizeof tmp, sub, va_arg(*ap, void *));
        break;
    default:
        /* Not a conversion this sink knows (the format attribute rejects them at compile
         * time): written as it stands, and no argument is taken. */
        put_raw(b, spec, spec_len);
        return spec_len;
    }
    /* Numbers hold no byte that needs escaping; escaping keeps the rule in one place. */
    put_escaped(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
    return spec_len;
}

size_t qd_log_vformat(char *dst, size_t cap, const char *fmt, va_list ap)
{
    line_buf b = {dst, cap, 0};
    va_list aq;
    va_copy(aq, ap);
    for (const char *f = fmt; *f;) {
        const char *pct = strchr(f, '%');
        size_t lit = pct ? (size_t)(pct - f) : strlen(f);
        /* The format's own text is the caller's: copied as written, except that a control
         * byte in it could still break the line in two. */
        for (size_t i = 0; i < lit; i++) {
            unsigned char c = (unsigned char)f[i];
            if (c < 0x20 || c == 0x7f) put_escaped(&b, f + i, 1);
            else put_raw(&b, f + i, 1);
        }
        if (!pct) break;
        f = pct + put_conversion(&b, pct, &aq);
    }
    va_end(aq);
    if (cap) dst[b.n < cap ? b.n : cap - 1] = 0;
    return b.n;
}

size_t qd_log_format(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t n = qd_log_vformat(dst, cap, fmt, ap);
    va_end(ap);
    return n;
}

void qd_log_emit(int level, const char *event, const char *fmt, ...)
{
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level < 0 ? 0 : level > 4 ? 4 : level]);
    if (n < 0 || (size_t)n >= sizeof line) return;
    /* The event name is escaped too: some are built from a value. */
    size_t k = (size_t)n + qd_log_escape(line + n, sizeof line - (size_t)n, event ? event : "", event ? strlen(event) : 0);
    if (k + 2 < sizeof line) {
        line[k++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        qd_log_vformat(line + k, sizeof line - k, fmt, ap);
        va_end(ap);
    }
    /* One write per line, so lines of the daemon and its workers on one stderr never mix. */
    fprintf(stderr, "%s\n", line);
}
