/* The model directory fuzz harness (issue #33): writes the directory a container describes
 * (model_dir_fuzz_one.h), runs what a job does with it, and checks each outcome against what
 * the container says every file is. The rules of quant/core/confine.h are the oracle:
 *   - a FIFO, a directory, a socket or a device is refused by name, never read (a FIFO that
 *     were opened without O_NONBLOCK would hang the run);
 *   - a file over its kind's limit is refused by name;
 *   - once confined, a link out of the directory is refused by name, and under the component
 *     walk every link is;
 * and on top of them: a model that opens, a tokenizer that loads, a copy that is made and a
 * fingerprint that is taken read only files the rules let through; the aux copy stops at
 * the first file it may not copy and leaves exactly the regular copies before it, byte for
 * byte; every refusal is a negative code with a message naming the file (or the tensor);
 * and the same directory gives the same outcome twice. Sanitizers catch the memory errors
 * and leaks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* memmem */
#endif
#include "fuzz/model_dir_fuzz_one.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/backend/backend.h"
#include "quant/core/confine.h"
#include "quant/core/safetensors.h"
#include "quant/model/config.h"
#include "quant/model/model.h"
#include "quant/model/tokenizer/tokenizer.h"
#include "quant/pipeline/output.h"
#include "quant/pipeline/state.h"

#define MAX_FILES 24
#define NAME_LEN 64
/* The limits a header may set are clamped to 1 MiB, so a hole of 2 MiB puts a `big` file
 * past every one of them while costing nothing to write. */
#define LIMIT_MAX ((uint64_t)1 << 20)
#define BIG_HOLE ((off_t)2 << 20)
#define DEFAULT_JSON_LIMIT ((uint64_t)64 << 10)
#define DEFAULT_TOK_LIMIT ((uint64_t)256 << 10)

typedef enum ftype { F_FILE, F_BIG, F_FIFO, F_DIR, F_SOCK, F_ZERO, F_OUT, F_UP, F_IN, F_GONE, F_TYPES } ftype;
static const char *const type_names[F_TYPES] = {"file", "big", "fifo", "dir", "sock", "zero", "out", "up", "in", "gone"};

/* Why qd_input_open must refuse a file, and what its message then says after "path: ". */
typedef enum why { WHY_OK, WHY_TYPE, WHY_SIZE, WHY_OUTSIDE, WHY_LINK, WHY_MISSING, WHY_OPEN } why;
static const char *const why_lead[] = {"", "refused: ", "refused: ", "refused: it leads outside the allowed roots",
                                       "refused: a symbolic link", "cannot open", "cannot open"};
static const char *const why_also[] = {"", "not a regular file", "over the", "", "", "", ""};

typedef struct entry {
    char name[NAME_LEN + 8];
    ftype type;
    const uint8_t *data;   /* into the input */
    size_t len;
    int made;              /* it exists in the directory (a socket may fail to bind) */
} entry;

typedef struct mdir {
    char base[200], m[208], o[208], x[208];   /* model, output, outside (short: a socket's path fits) */
    int confine, walk;
    uint64_t lim_json, lim_tok;
    entry e[2 * MAX_FILES];   /* an `in` link's target is an entry of its own (".in.<name>") */
    int n;
} mdir;

/* One pass of the job's reads; two passes over one directory must agree. */
typedef struct outcome { int rc; char msg[QD_ERR_MSG_MAX]; } outcome;
typedef struct pass {
    outcome model, tok, copy, fp;
    size_t n_tensors;
    int32_t vocab, bos, eos;
    char hex[65];
} pass;

/* The files qd_output_copy_aux copies, in its order, with the kind it reads them as
 * (quant/pipeline/output.c). The copy stops at the first refusal, so the order matters. */
static const struct { const char *name; qd_input_kind kind; } AUX[] = {
    {"tokenizer.json", QD_INPUT_TOKENIZER}, {"tokenizer_config.json", QD_INPUT_JSON},
    {"special_tokens_map.json", QD_INPUT_JSON}, {"tokenizer.model", QD_INPUT_TOKENIZER},
    {"vocab.json", QD_INPUT_TOKENIZER}, {"merges.txt", QD_INPUT_TOKENIZER},
    {"added_tokens.json", QD_INPUT_JSON}, {"generation_config.json", QD_INPUT_JSON}};
#define N_AUX (sizeof AUX / sizeof AUX[0])

static int fail(const char *what, const char *detail)
{
    fprintf(stderr, "model_dir_fuzz_one: invariant broken: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return -1;
}

/* ---- the container ------------------------------------------------------------------ */

static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > NAME_LEN || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    if (n >= 4 && !memcmp(s, ".in.", 4)) return 0;   /* the names of `in` targets */
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

static entry *find(mdir *md, const char *name)
{
    for (int i = 0; i < md->n; i++)
        if (md->e[i].made && !strcmp(md->e[i].name, name)) return &md->e[i];
    return NULL;
}

/* The next space-separated word of [*p, end). */
static int next_word(const char **p, const char *end, const char **w, size_t *wl)
{
    while (*p < end && **p == ' ') (*p)++;
    *w = *p;
    while (*p < end && **p != ' ') (*p)++;
    *wl = (size_t)(*p - *w);
    return *wl > 0;
}

static void parse_limit(const char *w, size_t wl, const char *key, uint64_t *lim)
{
    size_t kl = strlen(key);
    if (wl <= kl || memcmp(w, key, kl)) return;
    uint64_t v = 0;
    size_t i = kl;
    for (; i < wl && i < kl + 9 && w[i] >= '0' && w[i] <= '9'; i++) v = v * 10 + (uint64_t)(w[i] - '0');
    if (i == kl) return;
    *lim = v < 1 ? 1 : v > LIMIT_MAX ? LIMIT_MAX : v;
}

static void add_entry(mdir *md, const char *line, size_t ll, const uint8_t *data, size_t len)
{
    const char *p = line, *end = line + ll, *w;
    size_t wl;
    if (!next_word(&p, end, &w, &wl) || !name_ok(w, wl) || md->n >= MAX_FILES) return;
    for (int i = 0; i < md->n; i++)   /* the first of two files of one name wins */
        if (strlen(md->e[i].name) == wl && !memcmp(md->e[i].name, w, wl)) return;
    entry *e = &md->e[md->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->name, w, wl);
    e->type = F_FILE;
    if (next_word(&p, end, &w, &wl))
        for (int t = 0; t < F_TYPES; t++)
            if (strlen(type_names[t]) == wl && !memcmp(type_names[t], w, wl)) e->type = (ftype)t;
    e->data = data;
    e->len = len;
}

static void parse(mdir *md, const uint8_t *data, size_t size)
{
    md->lim_json = DEFAULT_JSON_LIMIT;
    md->lim_tok = DEFAULT_TOK_LIMIT;
    size_t pos = 0;
    if (size >= 4 && !memcmp(data, "qdir", 4)) {
        const uint8_t *nl = memchr(data, '\n', size);
        size_t hl = nl ? (size_t)(nl - data) : size;
        const char *p = (const char *)data + 4, *end = (const char *)data + hl, *w;
        size_t wl;
        while (next_word(&p, end, &w, &wl)) {
            if (wl == 7 && !memcmp(w, "confine", 7)) md->confine = 1;
            else if (wl == 4 && !memcmp(w, "walk", 4)) md->walk = 1;
            parse_limit(w, wl, "json=", &md->lim_json);
            parse_limit(w, wl, "tok=", &md->lim_tok);
        }
        pos = nl ? hl + 1 : size;
    }
    /* The first file line: at pos, or after the next newline that precedes one. */
    if (pos + 4 > size || memcmp(data + pos, "--- ", 4)) {
        const uint8_t *h = memmem(data + pos, size - pos, "\n--- ", 5);
        pos = h ? (size_t)(h - data) + 1 : size;
    }
    while (pos < size) {
        const uint8_t *nl = memchr(data + pos, '\n', size - pos);
        size_t line_end = nl ? (size_t)(nl - data) : size;
        size_t body = nl ? line_end + 1 : size, body_end, next;
        if (body + 4 <= size && !memcmp(data + body, "--- ", 4)) {
            body_end = next = body;   /* an empty file followed at once by the next */
        } else {
            const uint8_t *h = memmem(data + body, size - body, "\n--- ", 5);
            body_end = h ? (size_t)(h - data) : size;
            next = h ? body_end + 1 : size;
        }
        add_entry(md, (const char *)data + pos + 4, line_end - pos - 4, data + body, body_end - body);
        pos = next;
    }
    /* An `in` link points at a regular file beside it, which is a file of the directory too. */
    int n = md->n;
    for (int i = 0; i < n; i++)
        if (md->e[i].type == F_IN) {
            entry *t = &md->e[md->n++];
            *t = md->e[i];
            snprintf(t->name, sizeof t->name, ".in.%s", md->e[i].name);
            t->type = F_FILE;
        }
}

/* ---- the directory ------------------------------------------------------------------ */

static int write_file(const char *dir, const char *name, const uint8_t *d, size_t n, off_t hole)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, d + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { close(fd); return -1; }
        off += (size_t)w;
    }
    int rc = hole ? ftruncate(fd, (off_t)n + hole) : 0;
    return close(fd) || rc ? -1 : 0;
}

static int make_entry(mdir *md, entry *e)
{
    char path[PATH_MAX], target[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", md->m, e->name);
    switch (e->type) {
    case F_FILE: return write_file(md->m, e->name, e->data, e->len, 0);
    case F_BIG: return write_file(md->m, e->name, e->data, e->len, BIG_HOLE);
    case F_FIFO: return mkfifo(path, 0644);
    case F_DIR: return mkdir(path, 0755);
    case F_SOCK: {
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        if (strlen(path) >= sizeof a.sun_path) return 1;
        memcpy(a.sun_path, path, strlen(path) + 1);
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) return 1;
        int rc = bind(s, (struct sockaddr *)&a, sizeof a);
        close(s);
        return rc ? 1 : 0;   /* a socket the sandbox will not make is left out, not an error */
    }
    case F_ZERO: return symlink("/dev/zero", path);
    case F_OUT:
    case F_UP:
        if (write_file(md->x, e->name, e->data, e->len, 0)) return -1;
        if (e->type == F_OUT) snprintf(target, sizeof target, "%s/%s", md->x, e->name);
        else snprintf(target, sizeof target, "../x/%s", e->name);
        return symlink(target, path);
    case F_IN:
        snprintf(target, sizeof target, ".in.%s", e->name);
        return symlink(target, path);
    case F_GONE: return symlink("no-such-file", path);
    default: return -1;
    }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Empties the output directory between the passes. */
static void clear_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        rm_tree(p);
    }
    closedir(d);
}

/* /dev/shm first: qd_input_copy_at fsyncs every copy and its directory, which on a disk
 * costs milliseconds an input and on tmpfs nothing. */
static int make_base(mdir *md)
{
    struct stat st;
    const char *tmp = getenv("TMPDIR");
    const char *root = !stat("/dev/shm", &st) && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK) ? "/dev/shm"
                       : tmp && *tmp                                                            ? tmp
                                                                                                : "/tmp";
    char tmpl[PATH_MAX];
    snprintf(tmpl, sizeof tmpl, "%s/qd-mdfz.XXXXXX", root);
    if (!mkdtemp(tmpl)) return -1;
    /* Canonical, so the paths in messages are the paths given (the roots are canonical). */
    char canon[PATH_MAX];
    if (!realpath(tmpl, canon) || strlen(canon) >= sizeof md->base) { rmdir(tmpl); return -1; }
    memcpy(md->base, canon, strlen(canon) + 1);
    snprintf(md->m, sizeof md->m, "%s/m", md->base);
    snprintf(md->o, sizeof md->o, "%s/o", md->base);
    snprintf(md->x, sizeof md->x, "%s/x", md->base);
    if (mkdir(md->m, 0755) || mkdir(md->o, 0755) || mkdir(md->x, 0755)) { rm_tree(md->base); return -1; }
    return 0;
}

/* ---- the oracle --------------------------------------------------------------------- */

static uint64_t limit_of(const mdir *md, qd_input_kind k)
{
    return k == QD_INPUT_JSON ? md->lim_json : k == QD_INPUT_TOKENIZER ? md->lim_tok : 0;
}

/* Why opening e as kind k must fail, from what the container made it (WHY_OK: it may be read). */
static why bad(const mdir *md, const entry *e, qd_input_kind k)
{
    uint64_t lim = limit_of(md, k);
    int over = lim && (uint64_t)e->len > lim;
    /* The walk opens the last component with O_NOFOLLOW: any link there is refused. */
    int link_refused = md->confine && md->walk;
    switch (e->type) {
    case F_FILE: return over ? WHY_SIZE : WHY_OK;
    case F_BIG: return lim ? WHY_SIZE : WHY_OK;
    case F_FIFO:
    case F_DIR: return WHY_TYPE;
    case F_SOCK: return WHY_TYPE;   /* open(2) of a socket is ENXIO, refused as not a regular file */
    case F_ZERO: return link_refused ? WHY_LINK : md->confine ? WHY_OUTSIDE : WHY_TYPE;
    case F_OUT:
    case F_UP: return link_refused ? WHY_LINK : md->confine ? WHY_OUTSIDE : over ? WHY_SIZE : WHY_OK;
    case F_IN: return link_refused ? WHY_LINK : over ? WHY_SIZE : WHY_OK;
    case F_GONE: return link_refused ? WHY_LINK : WHY_MISSING;
    default: return WHY_OPEN;
    }
}

/* What stat(2) says: present through any link that leads somewhere (the loaders' probe for
 * pytorch_model.bin, which quantd never reads). */
static int exists(const entry *e) { return e && e->type != F_GONE; }
/* What qd_input_exists says: present in any form, a dangling link included, so that the
 * loaders refuse it by name instead of skipping it (confine.h). */
static int present(const entry *e) { return e != NULL; }

static void count_why(model_dir_fuzz_stats *st, why w)
{
    if (!st) return;
    if (w == WHY_TYPE) st->refused_type++;
    else if (w == WHY_SIZE) st->refused_size++;
    else if (w == WHY_OUTSIDE) st->refused_outside++;
    else if (w == WHY_LINK) st->refused_link++;
    else if (w == WHY_MISSING) st->refused_missing++;
}

/* op must have failed on name for reason w, saying so after "<dir>/<name>: ". */
static int expect_refusal(const mdir *md, const char *op, const outcome *o, const char *name, why w,
                          model_dir_fuzz_stats *st)
{
    char want[PATH_MAX + 8], detail[PATH_MAX + 2 * QD_ERR_MSG_MAX];
    snprintf(want, sizeof want, "%s/%s: ", md->m, name);
    const char *p = strstr(o->msg, want);
    if (o->rc < 0 && p && !strncmp(p + strlen(want), why_lead[w], strlen(why_lead[w])) && strstr(p, why_also[w])) {
        count_why(st, w);
        return 0;
    }
    snprintf(detail, sizeof detail, "%s: rc %d, message \"%s\"; expected a refusal of %s (\"%s... %s\")", op, o->rc,
             o->msg, name, why_lead[w], why_also[w]);
    return fail("a file the rules refuse was not refused as such", detail);
}

/* Every refusal: a negative code, a message naming the model or output directory, and each
 * "<dir>/<name>: refused" in it about a file the rules do refuse. */
static int check_message(const mdir *md, const char *op, const outcome *o)
{
    char detail[2 * QD_ERR_MSG_MAX];
    snprintf(detail, sizeof detail, "%s: rc %d, message \"%s\"", op, o->rc, o->msg);
    if (o->rc > 0) return fail("a positive return code", detail);
    if (o->rc == 0) return 0;
    if (!o->msg[0]) return fail("a refusal without a message", detail);
    /* A file, or a tensor (a non-finite weight is refused by its name: error.h). */
    if (!strstr(o->msg, md->m) && !strstr(o->msg, md->o) && strncmp(o->msg, "tensor '", 8))
        return fail("a refusal that names no file", detail);
    size_t ml = strlen(md->m);
    for (const char *p = strstr(o->msg, md->m); p; p = strstr(p + 1, md->m)) {
        if (p[ml] != '/') continue;
        const char *n = p + ml + 1;
        size_t nl = strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");
        const char *c = n + nl;
        if (nl == 0 || nl > NAME_LEN + 4 || strncmp(c, ": refused", 9)) continue;
        char name[NAME_LEN + 8];
        memcpy(name, n, nl);
        name[nl] = 0;
        const entry *e = find((mdir *)md, name);
        if (!e) return fail("a refusal of a file the directory does not hold", detail);
        int any = 0;
        for (int k = 0; k < QD_INPUT_KINDS; k++) {
            why w = bad(md, e, (qd_input_kind)k);
            if (w != WHY_OK && !strncmp(c + 2, why_lead[w], strlen(why_lead[w])) && strstr(c, why_also[w])) any = 1;
        }
        if (!any) return fail("a refusal of a file the rules let through, or for another reason", detail);
    }
    return 0;
}

static void take(outcome *o, int rc, const qd_err *err)
{
    o->rc = rc;
    snprintf(o->msg, sizeof o->msg, "%s", rc ? err->msg : "");
}

static int check_model(mdir *md, const qd_model *mod, outcome *o, model_dir_fuzz_stats *st)
{
    int bad_ = check_message(md, "qd_model_open", o);
    if (bad_) return bad_;
    entry *single = find(md, "model.safetensors"), *index = find(md, "model.safetensors.index.json");
    entry *cfg = find(md, "config.json");
    if (!present(single) && !present(index) &&
        (exists(find(md, "pytorch_model.bin")) || exists(find(md, "pytorch_model.bin.index.json"))))
        return o->rc == QD_EUNSUPPORTED ? 0 : fail("pytorch_model.bin alone was not refused as unsupported", o->msg);
    if (!cfg) return expect_refusal(md, "qd_model_open", o, "config.json", WHY_MISSING, st);
    why w = bad(md, cfg, QD_INPUT_JSON);
    if (w) return expect_refusal(md, "qd_model_open", o, "config.json", w, st);
    /* The config's own verdict decides whether the open gets to the weights. */
    char *text = malloc(cfg->len + 1);
    if (!text) return 0;
    memcpy(text, cfg->data, cfg->len);
    text[cfg->len] = 0;
    qd_model_config c;
    qd_err perr = {0};
    int prc = qd_model_config_parse(text, "config.json", &c, &perr);
    free(text);
    if (prc) {
        char want[PATH_MAX];
        snprintf(want, sizeof want, "%s/config.json", md->m);
        if (!o->rc || !strstr(o->msg, want)) return fail("a config.json the parser refuses was not refused by name", o->msg);
        return 0;
    }
    if (present(single)) {
        if ((w = bad(md, single, QD_INPUT_WEIGHTS))) return expect_refusal(md, "qd_model_open", o, "model.safetensors", w, st);
    } else if (present(index)) {
        if ((w = bad(md, index, QD_INPUT_JSON)))
            return expect_refusal(md, "qd_model_open", o, "model.safetensors.index.json", w, st);
    } else if (o->rc != QD_ENOTFOUND) {
        return fail("a directory without weights was not refused as missing them", o->msg);
    }
    if (o->rc) return 0;
    /* Opened: every shard it holds is a file the rules let through. */
    const st_model *sm = qd_model_tensors(mod);
    if (!sm || st_model_count(sm) == 0) return fail("a model opened without tensors", NULL);
    for (size_t i = 0; i < st_model_count(sm); i++) {
        const char *shard = st_model_shard_of(sm, st_model_tensor(sm, i)->name);
        entry *e = shard ? find(md, shard) : NULL;
        if (!e) return fail("a tensor from a shard the directory does not hold", shard);
        if (bad(md, e, QD_INPUT_WEIGHTS)) return fail("a model opened from a shard the rules refuse", shard);
    }
    return 0;
}

static int check_tokenizer(mdir *md, const outcome *o, model_dir_fuzz_stats *st)
{
    int bad_ = check_message(md, "qd_tokenizer_load", o);
    if (bad_) return bad_;
    entry *tj = find(md, "tokenizer.json"), *tc = find(md, "tokenizer_config.json");
    entry *vj = find(md, "vocab.json"), *mt = find(md, "merges.txt"), *sp = find(md, "tokenizer.model");
    why w;
    /* tokenizer_config.json is read beside whichever tokenizer loads (present in any form,
     * a dangling link included: qd_input_exists). */
    int tc_bad = present(tc) && bad(md, tc, QD_INPUT_JSON);
    if (present(tj)) {
        if ((w = bad(md, tj, QD_INPUT_TOKENIZER))) return expect_refusal(md, "qd_tokenizer_load", o, "tokenizer.json", w, st);
    } else if (present(vj) && present(mt)) {
        /* The GPT-2 layout reads tokenizer_config.json first, then special_tokens_map.json. */
        entry *sm = find(md, "special_tokens_map.json");
        if (tc_bad) return expect_refusal(md, "qd_tokenizer_load", o, "tokenizer_config.json", bad(md, tc, QD_INPUT_JSON), st);
        if (!o->rc && ((present(sm) && bad(md, sm, QD_INPUT_JSON)) || bad(md, vj, QD_INPUT_TOKENIZER) ||
                       bad(md, mt, QD_INPUT_TOKENIZER)))
            return fail("a tokenizer loaded from vocab.json + merges.txt with a file the rules refuse", NULL);
    } else if (present(sp)) {
        if (!o->rc && bad(md, sp, QD_INPUT_TOKENIZER)) return fail("a tokenizer loaded from a tokenizer.model the rules refuse", NULL);
    } else {
        return o->rc == QD_ENOTFOUND ? 0 : fail("a directory without a tokenizer was not refused as missing one", o->msg);
    }
    if (!o->rc && tc_bad) return fail("a tokenizer loaded with a tokenizer_config.json the rules refuse", NULL);
    return 0;
}

/* The aux copy: stops at the first file present (lstat: a dangling link counts) that may not
 * be copied, naming it; before it, each file is copied whole as a regular file. */
static int check_copy(mdir *md, const outcome *o, model_dir_fuzz_stats *st)
{
    int bad_ = check_message(md, "qd_output_copy_aux", o);
    if (bad_) return bad_;
    const entry *copied[N_AUX];
    size_t n_copied = 0;
    for (size_t i = 0; i < N_AUX; i++) {
        entry *e = find(md, AUX[i].name);
        if (!e) continue;
        why w = bad(md, e, AUX[i].kind);
        if (w) {
            if ((bad_ = expect_refusal(md, "qd_output_copy_aux", o, AUX[i].name, w, st))) return bad_;
            break;
        }
        copied[n_copied++] = e;
    }
    DIR *d = opendir(md->o);
    if (!d) return fail("the output directory is gone", md->o);
    size_t seen = 0;
    for (struct dirent *de; (de = readdir(d)) && !bad_;) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        const entry *e = NULL;
        for (size_t i = 0; i < n_copied; i++)
            if (!strcmp(copied[i]->name, de->d_name)) e = copied[i];
        if (!e) { bad_ = fail("the output holds a file that should not have been copied", de->d_name); break; }
        seen++;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", md->o, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != e->len) {
            bad_ = fail("a copy that is not a regular file of the source's size", de->d_name);
            break;
        }
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        uint8_t *b = malloc(e->len + 1);
        ssize_t r = fd >= 0 && b ? read(fd, b, e->len + 1) : -1;
        if (r != (ssize_t)e->len || (e->len && memcmp(b, e->data, e->len)))
            bad_ = fail("a copy that differs from its source", de->d_name);
        free(b);
        if (fd >= 0) close(fd);
    }
    closedir(d);
    if (!bad_ && seen != n_copied) bad_ = fail("a file that should have been copied is missing from the output", NULL);
    if (!bad_ && st) {
        if (o->rc) st->copy_refused++;
        else if (n_copied) st->copied++;
    }
    return bad_;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

/* The files whose names end in ".safetensors", sorted by name into sh (may be NULL); returns
 * how many. */
static size_t shard_names(const mdir *md, const entry **sh)
{
    size_t n = 0;
    for (int i = 0; i < md->n; i++) {
        size_t l = strlen(md->e[i].name);
        if (md->e[i].made && l >= 12 && !strcmp(md->e[i].name + l - 12, ".safetensors")) {
            if (sh) sh[n] = &md->e[i];
            n++;
        }
    }
    if (sh && n) qsort(sh, n, sizeof *sh, cmp_name);
    return n;
}

/* The fingerprint: config.json, then every *.safetensors name in sorted order, as weights. */
static int check_fingerprint(mdir *md, const outcome *o, const char *hex, model_dir_fuzz_stats *st)
{
    int bad_ = check_message(md, "qd_fingerprint_model_dir", o);
    if (bad_) return bad_;
    entry *cfg = find(md, "config.json");
    if (!cfg) return expect_refusal(md, "qd_fingerprint_model_dir", o, "config.json", WHY_MISSING, st);
    why w = bad(md, cfg, QD_INPUT_JSON);
    if (w) return expect_refusal(md, "qd_fingerprint_model_dir", o, "config.json", w, st);
    const entry *sh[2 * MAX_FILES];
    size_t n = shard_names(md, sh);
    for (size_t i = 0; i < n; i++)
        if ((w = bad(md, sh[i], QD_INPUT_WEIGHTS)))
            return expect_refusal(md, "qd_fingerprint_model_dir", o, sh[i]->name, w, st);
    if (o->rc) return fail("a fingerprint of readable files failed", o->msg);
    if (strlen(hex) != 64 || strspn(hex, "0123456789abcdef") != 64) return fail("a fingerprint that is not 64 hex digits", hex);
    if (st) st->fingerprinted++;
    return 0;
}

static int tokenizer_step(mdir *md, pass *p, model_dir_fuzz_stats *st)
{
    qd_tokenizer *t = NULL;
    qd_err err = {0};
    take(&p->tok, qd_tokenizer_load(md->m, &t, &err), &err);
    if (p->tok.rc && t) {
        qd_tokenizer_free(t);
        return fail("a refused tokenizer still produced a handle", NULL);
    }
    if (t) {
        p->vocab = qd_tokenizer_vocab_size(t);
        p->bos = qd_tokenizer_bos_id(t);
        p->eos = qd_tokenizer_eos_id(t);
        qd_tokenizer_free(t);
    }
    return check_tokenizer(md, &p->tok, st);
}

static int run_pass(mdir *md, qd_backend *be, pass *p, model_dir_fuzz_stats *st)
{
    memset(p, 0, sizeof *p);
    qd_err err = {0};
    qd_model *mod = NULL;
    take(&p->model, qd_model_open(md->m, be, &mod, &err), &err);
    if (p->model.rc && mod) return fail("a refused model still produced a handle", NULL);
    int bad_ = check_model(md, mod, &p->model, st);
    if (mod) p->n_tensors = st_model_count(qd_model_tensors(mod));
    qd_model_close(mod);
    if (bad_) return bad_;

    if ((bad_ = tokenizer_step(md, p, st))) return bad_;

    memset(&err, 0, sizeof err);
    take(&p->copy, qd_output_copy_aux(md->m, md->o, &err), &err);
    if ((bad_ = check_copy(md, &p->copy, st))) return bad_;

    memset(&err, 0, sizeof err);
    take(&p->fp, qd_fingerprint_model_dir(md->m, p->hex, &err), &err);
    if (p->fp.rc) p->hex[0] = 0;
    p->hex[64] = 0;
    return check_fingerprint(md, &p->fp, p->hex, st);
}

static int same_outcome(const outcome *a, const outcome *b) { return a->rc == b->rc && !strcmp(a->msg, b->msg); }

int model_dir_fuzz_run(const uint8_t *data, size_t size, int *accepted, model_dir_fuzz_stats *st)
{
    if (accepted) *accepted = 0;
    if (qd_confine_active()) return fail("the process is confined already: the harness needs to set its own root", NULL);
    mdir *md = calloc(1, sizeof *md);
    if (!md) return 0;
    parse(md, data, size);
    if (make_base(md)) { free(md); return fail("cannot make a temporary directory", NULL); }
    int bad_ = 0;
    for (int i = 0; i < md->n && !bad_; i++) {
        int rc = make_entry(md, &md->e[i]);
        if (rc < 0) bad_ = fail("cannot build the directory", md->e[i].name);
        md->e[i].made = rc == 0;
    }
    uint64_t saved[QD_INPUT_KINDS], lim[QD_INPUT_KINDS] = {md->lim_json, md->lim_tok, 0, 0};
    for (int k = 0; k < QD_INPUT_KINDS; k++) saved[k] = qd_confine_limit((qd_input_kind)k);
    lim[QD_INPUT_TEXT] = saved[QD_INPUT_TEXT];
    qd_confine_set_limits(lim);
    qd_backend *be = NULL;
    qd_err err = {0};
    if (!bad_ && qd_backend_cpu_open(1, NULL, &be, &err)) bad_ = fail("cannot open the CPU backend", err.msg);
    if (!bad_ && md->confine) {
        const char *roots[1] = {md->m};
        if (qd_confine_set(roots, 1, &err)) bad_ = fail("cannot confine to the model directory", err.msg);
        else if (md->walk) qd_confine_force_walk_for_tests(1);
    }
    pass a, b;
    if (!bad_) bad_ = run_pass(md, be, &a, st);
    if (!bad_) {
        clear_dir(md->o);
        bad_ = run_pass(md, be, &b, NULL);   /* counted once */
    }
    if (!bad_ && (!same_outcome(&a.model, &b.model) || !same_outcome(&a.tok, &b.tok) ||
                  !same_outcome(&a.copy, &b.copy) || !same_outcome(&a.fp, &b.fp) || a.n_tensors != b.n_tensors ||
                  a.vocab != b.vocab || a.bos != b.bos || a.eos != b.eos || strcmp(a.hex, b.hex)))
        bad_ = fail("the same directory gave two outcomes", NULL);
    if (!bad_ && accepted) *accepted = a.model.rc == 0;
    if (!bad_ && st) {
        st->inputs++;
        st->confined += md->confine;
        st->walked += md->confine && md->walk;
        st->model_opened += a.model.rc == 0;
        st->tok_loaded += a.tok.rc == 0;
    }
    qd_confine_reset_for_tests();
    qd_confine_set_limits(saved);
    qd_backend_close(be);
    rm_tree(md->base);
    free(md);
    return bad_ ? -1 : 0;
}

int model_dir_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    return model_dir_fuzz_run(data, size, accepted, NULL);
}

int model_dir_fuzz_pack(const char *header, const model_dir_fuzz_file *files, size_t n, uint8_t **out, size_t *len)
{
    size_t cap = (header ? strlen(header) + 1 : 0) + 1;
    for (size_t i = 0; i < n; i++) cap += strlen(files[i].name) + (files[i].kind ? strlen(files[i].kind) : 0) + 8 + files[i].len;
    uint8_t *b = malloc(cap);
    if (!b) return -1;
    size_t k = 0;
    if (header) k += (size_t)sprintf((char *)b, "%s\n", header);
    for (size_t i = 0; i < n; i++) {
        const char *d = files[i].data;
        if ((files[i].len >= 4 && !memcmp(d, "--- ", 4)) || (files[i].len && memmem(d, files[i].len, "\n--- ", 5))) {
            free(b);
            return -1;
        }
        k += (size_t)sprintf((char *)b + k, "--- %s%s%s\n", files[i].name, files[i].kind ? " " : "",
                             files[i].kind ? files[i].kind : "");
        memcpy(b + k, files[i].data, files[i].len);
        k += files[i].len;
        if (i + 1 < n) b[k++] = '\n';
    }
    *out = b;
    *len = k;
    return 0;
}
