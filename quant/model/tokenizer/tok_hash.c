/* Open-addressing hash maps for the tokenizer: vocabulary strings -> ids, and id pairs ->
 * (merge rank, merged id). Linear probing, power-of-two capacity, load factor <= 1/2; no
 * deletion is needed because both maps are built once and then only read. */
#include "quant/model/tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

static uint32_t hash_bytes(const char *s, size_t n)
{
    /* FNV-1a: short keys, good enough spread, no dependencies. */
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 16777619u; }
    return h;
}

/* 0 when expect is too large for a 32-bit table (the doubling used to wrap to 0 and loop
 * for ever; found by fuzzing). */
static uint32_t cap_for(size_t expect)
{
    uint32_t cap = 16;
    while (cap < expect * 2 + 2) {
        if (cap >= (1u << 31)) return 0;
        cap <<= 1;
    }
    return cap;
}

int tok_strmap_init(tok_strmap *m, size_t expect)
{
    m->n = 0;
    m->slots = NULL;
    if (!(m->cap = cap_for(expect))) return QD_ENOMEM;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : QD_ENOMEM;
}

static void strmap_insert(tok_strmap_slot *slots, uint32_t cap, const tok_strmap_slot *e)
{
    uint32_t i = e->hash & (cap - 1);
    while (slots[i].s) i = (i + 1) & (cap - 1);
    slots[i] = *e;
}

int tok_strmap_put(tok_strmap *m, const char *s, size_t len, int32_t val)
{
    uint32_t h = hash_bytes(s, len);
    for (uint32_t i = h & (m->cap - 1); m->slots[i].s; i = (i + 1) & (m->cap - 1)) {
        tok_strmap_slot *e = &m->slots[i];
        if (e->hash == h && e->len == len && !memcmp(e->s, s, len)) { e->val = val; return 0; }
    }
    if ((size_t)(m->n + 1) * 2 > m->cap) {
        uint32_t ncap = m->cap * 2;
        tok_strmap_slot *ns = calloc(ncap, sizeof *ns);
        if (!ns) return QD_ENOMEM;
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->slots[i].s) strmap_insert(ns, ncap, &m->slots[i]);
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    tok_strmap_slot e = {s, (uint32_t)len, h, val};
    strmap_insert(m->slots, m->cap, &e);
    m->n++;
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len)
{
    if (!m->slots) return -1;
    uint32_t h = hash_bytes(s, len);
    for (uint32_t i = h & (m->cap - 1); m->slots[i].s; i = (i + 1) & (m->cap - 1)) {
        const tok_strmap_slot *e = &m->slots[i];
        if (e->hash == h && e->len == len && !memcmp(e->s, s, len)) return e->val;
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m)
{
    if (!m) return;
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* ---- pair map ------------------------------------------------------------------------ */

#define PAIR_EMPTY UINT64_MAX   /* ids are >= 0, so no real key has all bits set */

static uint32_t hash_u64(uint64_t k)
{
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

int tok_pairmap_init(tok_pairmap *m, size_t expect)
{
    m->n = 0;
    m->slots = NULL;
    if (!(m->cap = cap_for(expect))) return QD_ENOMEM;
    m->slots = malloc((size_t)m->cap * sizeof *m->slots);
    if (!m->slots) return QD_ENOMEM;
    for (uint32_t i = 0; i < m->cap; i++) m->slots[i].key = PAIR_EMPTY;
    return 0;
}

static tok_pairmap_slot *pair_find(tok_pairmap_slot *slots, uint32_t cap, uint64_t key)
{
    uint32_t i = hash_u64(key) & (cap - 1);
    while (slots[i].key != PAIR_EMPTY && slots[i].key != key) i = (i + 1) & (cap - 1);
    return &slots[i];
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = pair_key(a, b);
    tok_pairmap_slot *e = pair_find(m->slots, m->cap, key);
    if (e->key == key) return 0;
    if ((size_t)(m->n + 1) * 2 > m->cap) {
        uint32_t ncap = m->cap * 2;
        tok_pairmap_slot *ns = malloc((size_t)ncap * sizeof *ns);
        if (!ns) return QD_ENOMEM;
        for (uint32_t i = 0; i < ncap; i++) ns[i].key = PAIR_EMPTY;
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->slots[i].key != PAIR_EMPTY) *pair_find(ns, ncap, m->slots[i].key) = m->slots[i];
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
        e = pair_find(m->slots, m->cap, key);
    }
    e->key = key;
    e->rank = rank;
    e->id = id;
    m->n++;
    return 0;
}

int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id)
{
    if (!m->slots) return 0;
    const tok_pairmap_slot *e = pair_find(m->slots, m->cap, pair_key(a, b));
    if (e->key == PAIR_EMPTY) return 0;
    *rank = e->rank;
    *id = e->id;
    return 1;
}

void tok_pairmap_free(tok_pairmap *m)
{
    if (!m) return;
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}
