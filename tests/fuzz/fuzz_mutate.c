/* The ctest fuzz driver: seeds, the mutator and the timed loop (see fuzz_mutate.h). */
#include "fuzz/fuzz_mutate.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "quant/core/clock.h"
#include "quant/core/fsutil.h"

void fz_seeds_add(fz_seeds *ss, const void *data, size_t len)
{
    if (ss->n == ss->cap) {
        ss->cap = ss->cap ? ss->cap * 2 : 16;
        ss->s = realloc(ss->s, (size_t)ss->cap * sizeof *ss->s);
        if (!ss->s) abort();   /* a test helper: out of memory ends the test */
    }
    fz_seed *s = &ss->s[ss->n++];
    s->data = malloc(len + 1);
    if (!s->data) abort();
    memcpy(s->data, data, len);
    s->data[len] = 0;
    s->len = len;
}

void fz_seeds_add_str(fz_seeds *ss, const char *s) { fz_seeds_add(ss, s, strlen(s)); }

int fz_seeds_add_file(fz_seeds *ss, const char *path)
{
    char *b = NULL;
    size_t len = 0;
    qd_err err = {0};
    if (qd_fs_read_file(path, &b, &len, &err) != 0) return 0;
    fz_seeds_add(ss, b, len);
    free(b);
    return 1;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int fz_seeds_load_corpus(fz_seeds *ss, const char *target)
{
    const char *src = getenv("QUANTD_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", src ? src : ".", target);
    DIR *d = opendir(dir);
    if (!d) return 0;
    /* Sorted, so the seed order (and with it the run) does not depend on the file system. */
    char *names[512];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 512; )
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    int added = 0;
    for (int i = 0; i < n; i++) {
        char path[2048];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!stat(path, &st) && S_ISREG(st.st_mode)) added += fz_seeds_add_file(ss, path);
        free(names[i]);
    }
    return added;
}

void fz_seeds_free(fz_seeds *ss)
{
    for (int i = 0; i < ss->n; i++) free(ss->s[i].data);
    free(ss->s);
    memset(ss, 0, sizeof *ss);
}

size_t fz_mutate(test_rng *r, uint8_t *buf, size_t len, size_t cap, const char *const *tokens,
                 size_t n_tokens, const fz_seeds *seeds)
{
    size_t pos = len ? (size_t)(test_rng_u64(r) % len) : 0;
    switch (test_rng_u64(r) % 10) {
    case 0:   /* flip a bit */
        if (len) buf[pos] ^= (uint8_t)(1u << (test_rng_u64(r) % 8));
        break;
    case 1: { /* replace a byte with a syntax-significant one */
        static const char alpha[] = "{}[]:,\"\\0123456789-.eE =#/?&%+\t\n\r\x00\xff";
        if (len) buf[pos] = (uint8_t)alpha[test_rng_u64(r) % (sizeof alpha - 1)];
        break;
    }
    case 2:
    case 3: { /* insert a token */
        if (!n_tokens) break;
        const char *t = tokens[test_rng_u64(r) % n_tokens];
        size_t tl = strlen(t);
        if (len + tl > cap) break;
        memmove(buf + pos + tl, buf + pos, len - pos);
        memcpy(buf + pos, t, tl);
        len += tl;
        break;
    }
    case 4: { /* overwrite a quoted string or a number with a token */
        if (!n_tokens || !len) break;
        size_t a = pos, b;
        if (buf[a] == '"') {
            for (b = a + 1; b < len && buf[b] != '"'; b++) {}
            if (b < len) b++;
        } else {
            for (b = a; b < len && ((buf[b] >= '0' && buf[b] <= '9') || buf[b] == '-' || buf[b] == '.' ||
                                    buf[b] == 'e' || buf[b] == 'E' || buf[b] == '+'); b++) {}
            if (b == a) break;
        }
        const char *t = tokens[test_rng_u64(r) % n_tokens];
        size_t tl = strlen(t);
        if (len - (b - a) + tl > cap) break;
        memmove(buf + a + tl, buf + b, len - b);
        memcpy(buf + a, t, tl);
        len = len - (b - a) + tl;
        break;
    }
    case 5: { /* delete a range */
        size_t k = 1 + (size_t)(test_rng_u64(r) % 8);
        if (pos + k > len) k = len - pos;
        memmove(buf + pos, buf + pos + k, len - pos - k);
        len -= k;
        break;
    }
    case 6: { /* duplicate a range somewhere else */
        if (!len) break;
        size_t from = (size_t)(test_rng_u64(r) % len), k = 1 + (size_t)(test_rng_u64(r) % 64);
        if (from + k > len) k = len - from;
        if (len + k > cap) break;
        uint8_t tmp[64];
        memcpy(tmp, buf + from, k);
        memmove(buf + pos + k, buf + pos, len - pos);
        memcpy(buf + pos, tmp, k);
        len += k;
        break;
    }
    case 7: { /* change a digit: ranges are where the validation lives */
        for (size_t i = 0; i < len; i++) {
            size_t j = (pos + i) % len;
            if (buf[j] >= '0' && buf[j] <= '9') { buf[j] = (uint8_t)('0' + test_rng_u64(r) % 10); break; }
        }
        break;
    }
    case 8:   /* truncate (rarely: most mutants should stay whole) */
        if (test_rng_u64(r) % 4 == 0) len = pos;
        break;
    default: { /* splice in part of another seed */
        const fz_seed *o = &seeds->s[test_rng_u64(r) % (uint64_t)seeds->n];
        if (!o->len) break;
        size_t from = (size_t)(test_rng_u64(r) % o->len), k = 1 + (size_t)(test_rng_u64(r) % 96);
        if (from + k > o->len) k = o->len - from;
        if (pos + k > cap) break;
        memcpy(buf + pos, o->data + from, k);
        if (pos + k > len) len = pos + k;
        break;
    }
    }
    return len;
}

long fz_iters(long dflt)
{
    const char *e = getenv("QUANTD_FUZZ_ITERS");
    long n = e ? atol(e) : 0;
    return n > 0 ? n : dflt;
}

void fz_print_input(const char *what, const uint8_t *data, size_t len)
{
    fprintf(stderr, "%s (%zu bytes): \"", what, len);
    for (size_t i = 0; i < len && i < 2048; i++) {
        unsigned char c = data[i];
        if (c == '"' || c == '\\') fprintf(stderr, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"%s\n", len > 2048 ? "..." : "");
}

fz_stats fz_run(const char *name, const fz_seeds *seeds, fz_one_fn fn, long iters, uint64_t rng_seed,
                const char *const *tokens, size_t n_tokens, size_t cap, int max_mut)
{
    fz_stats st;
    memset(&st, 0, sizeof st);
    test_rng r;
    test_rng_seed(&r, rng_seed);
    uint8_t *buf = malloc(cap + 1);
    if (!buf) abort();
    iters = fz_iters(iters);
    double t0 = qd_clock_now_s();
    for (long it = 0; it < iters; it++) {
        const fz_seed *s = &seeds->s[test_rng_u64(&r) % (uint64_t)seeds->n];
        size_t len = s->len < cap ? s->len : cap;
        memcpy(buf, s->data, len);
        int nmut = 1 + (int)(test_rng_u64(&r) % (uint64_t)max_mut);
        for (int m = 0; m < nmut; m++) len = fz_mutate(&r, buf, len, cap, tokens, n_tokens, seeds);
        int acc = 0;
        if (fn(buf, len, &acc) != 0 && st.broken++ < 3) {
            fprintf(stderr, "fuzz %s: iteration %ld broke an invariant\n", name, it);
            fz_print_input("input", buf, len);
        }
        if (acc) st.accepted++;
        else st.refused++;
    }
    st.iters = iters;
    st.seconds = qd_clock_now_s() - t0;
    st.per_second = st.seconds > 0 ? (double)iters / st.seconds : 0;
    printf("fuzz %s: %ld inputs, %ld accepted, %ld refused, %ld broken, %.1f s, %.0f inputs/s\n", name, iters,
           st.accepted, st.refused, st.broken, st.seconds, st.per_second);
    fflush(stdout);
    free(buf);
    return st;
}
