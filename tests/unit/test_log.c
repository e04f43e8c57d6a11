/* quant/core/log.c: the sink escapes what its arguments hold (issue #33, item 11).
 *   - a %s value with a newline, a quote, a backslash or another control byte is escaped
 *     (\n, \", \\, \x01), so one event is one line and err="%s" stays one quoted value;
 *   - the format's own text is kept as written (quotes included);
 *   - every other conversion formats exactly as printf does (widths, precision, length
 *     modifiers, '*' arguments, %%), so no existing caller changes;
 *   - the line is cut at the buffer, never in the middle of an escape;
 *   - qd_log_emit writes one line on stderr for an argument holding "\nlevel=error fake=1". */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/core/log.h"
#include "test_util.h"

static const char *fmt1(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *fmt1(const char *fmt, ...)
{
    static char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    qd_log_vformat(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

static void test_escapes_strings(void)
{
    CHECK_STR(fmt1("path=%s", "/m\nlevel=error fake=1"), "path=/m\\nlevel=error fake=1");
    CHECK_STR(fmt1("err=\"%s\" next=1", "a\" forged=\"1"), "err=\"a\\\" forged=\\\"1\" next=1");
    CHECK_STR(fmt1("v=%s", "back\\slash"), "v=back\\\\slash");
    CHECK_STR(fmt1("v=%s", "\x01\x7f\r\t"), "v=\\x01\\x7f\\r\\t");
    CHECK_STR(fmt1("v=%s", "caf\xc3\xa9"), "v=caf\xc3\xa9");   /* UTF-8 passes */
    CHECK_STR(fmt1("c=%c", '\n'), "c=\\n");
    CHECK_STR(fmt1("v=%.*s|", 3, "a\nbcdef"), "v=a\\nb|");   /* precision cuts the value, then escaped */
    CHECK_STR(fmt1("v=%-4s|%4s|", "ab", "c"), "v=ab  |   c|");
    const char *volatile none = NULL;   /* volatile: the compiler would warn about a literal NULL */
    CHECK_STR(fmt1("v=%s", none), "v=(null)");
}

static void test_numbers_as_printf(void)
{
    char want[256];
    long long ll = -1234567890123LL;
    size_t z = 42;
    int64_t i64 = 9000000000LL;
    uint64_t u64 = 18000000000000000000ULL;
    snprintf(want, sizeof want, "a=%d b=%5d c=%-3d| d=%lld e=%zu f=%" PRId64 " g=%" PRIu64 " h=%x i=%08.3f j=%g k=%.2e l=%% m=%*d n=%.*f o=%hhu",
             -7, 42, 1, ll, z, i64, u64, 255u, 3.14159, 1e-9, 12345.678, 6, 7, 2, 2.5, (unsigned char)200);
    CHECK_STR(fmt1("a=%d b=%5d c=%-3d| d=%lld e=%zu f=%" PRId64 " g=%" PRIu64 " h=%x i=%08.3f j=%g k=%.2e l=%% m=%*d n=%.*f o=%hhu",
                   -7, 42, 1, ll, z, i64, u64, 255u, 3.14159, 1e-9, 12345.678, 6, 7, 2, 2.5, (unsigned char)200),
              want);
    int x = 0;
    snprintf(want, sizeof want, "p=%p", (void *)&x);
    CHECK_STR(fmt1("p=%p", (void *)&x), want);
    /* The format's own quotes are the caller's structure and stay. */
    CHECK_STR(fmt1("k=\"%d\"", 5), "k=\"5\"");
}

static void test_cut(void)
{
    char small[8];
    /* "v=" + "\n" escaped = 4 bytes, then "\x01" needs 4 more: cut before it, not inside. */
    size_t n = qd_log_format(small, sizeof small, "v=%s", "\n\x01");
    CHECK_INT(n, 8);
    CHECK_STR(small, "v=\\n");
    char esc[5];
    CHECK_INT(qd_log_escape(esc, sizeof esc, "ab\"c", 4), 5);
    CHECK_STR(esc, "ab\\\"");
    CHECK_INT(qd_log_escape(esc, sizeof esc, "abcdefgh", 8), 8);
    CHECK_STR(esc, "abcd");
}

/* qd_log_emit on stderr: one line for the event. */
static void test_emit_one_line(void)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/stderr.txt", test_tmpdir());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    CHECK(f != NULL);
    if (!f || saved < 0) return;
    dup2(fileno(f), 2);
    qd_log_emit(QD_LOG_WARN, "job_rejected", "id=%s err=\"job.model: %s\"", "j\r1", "/a\nlevel=error fake=1");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += buf[i] == '\n';
    CHECK_INT(lines, 1);
    CHECK_CONTAINS(buf, " WARN job_rejected id=j\\r1 err=\"job.model: /a\\nlevel=error fake=1\"\n");
}

int main(void)
{
    TEST_RUN(test_escapes_strings);
    TEST_RUN(test_numbers_as_printf);
    TEST_RUN(test_cut);
    TEST_RUN(test_emit_one_line);
    return test_finish();
}
