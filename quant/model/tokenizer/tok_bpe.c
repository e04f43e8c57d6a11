/* The BPE merge engine. Symbols form a doubly linked list over the input array; every
 * adjacent pair that has a merge goes into a binary min-heap keyed by (rank, left position).
 * Popping the best pair either merges it (the left symbol takes the merged id, the right one
 * is unlinked, and the two new neighbour pairs are pushed) or finds it stale and drops it:
 * entries are never removed eagerly, they are checked on pop (lazy invalidation). This is
 * the same order HF tokenizers and sentencepiece use — lowest rank first, leftmost on ties —
 * and costs O(n log n), which matters because SentencePiece-style tokenizers have no
 * pre-tokenizer and see a whole 1 MB document as one word. */
#include "quant/model/tokenizer/tok_internal.h"

#include <stdlib.h>

static int heap_less(const uint32_t *h, size_t i, size_t j)
{
    const uint32_t *a = h + 3 * i, *b = h + 3 * j;
    return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]);
}

static void heap_swap(uint32_t *h, size_t i, size_t j)
{
    for (int k = 0; k < 3; k++) { uint32_t t = h[3 * i + k]; h[3 * i + k] = h[3 * j + k]; h[3 * j + k] = t; }
}

static int heap_push(tok_bpe_work *w, uint32_t rank, uint32_t left, uint32_t right)
{
    if (w->n_heap == w->cap_heap) {
        size_t nc = w->cap_heap ? w->cap_heap * 2 : 64;
        uint32_t *nh = realloc(w->heap, nc * 3 * sizeof *nh);
        if (!nh) return QD_ENOMEM;
        w->heap = nh;
        w->cap_heap = nc;
    }
    uint32_t *h = w->heap;
    size_t i = w->n_heap++;
    h[3 * i] = rank; h[3 * i + 1] = left; h[3 * i + 2] = right;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(h, i, p)) break;
        heap_swap(h, i, p);
        i = p;
    }
    return 0;
}

static void heap_pop(tok_bpe_work *w, uint32_t out[3])
{
    uint32_t *h = w->heap;
    out[0] = h[0]; out[1] = h[1]; out[2] = h[2];
    size_t n = --w->n_heap;
    if (n == 0) return;
    h[0] = h[3 * n]; h[1] = h[3 * n + 1]; h[2] = h[3 * n + 2];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(h, l, m)) m = l;
        if (r < n && heap_less(h, r, m)) m = r;
        if (m == i) break;
        heap_swap(h, i, m);
        i = m;
    }
}

static int push_pair(const tok_pairmap *merges, tok_bpe_work *w, const int32_t *ids, int32_t l, int32_t r)
{
    int32_t rank, id;
    if (l < 0 || r < 0) return 0;
    if (!tok_pairmap_get(merges, ids[l], ids[r], &rank, &id)) return 0;
    return heap_push(w, (uint32_t)rank, (uint32_t)l, (uint32_t)r);
}

int tok_bpe_merge(const tok_pairmap *merges, tok_bpe_work *w, int32_t *ids, size_t n, size_t *n_out)
{
    *n_out = n;
    if (n < 2 || merges->n == 0) return 0;
    if (n > INT32_MAX) return QD_EINVAL;
    if (w->cap_sym < n) {
        int32_t *p = realloc(w->prev, n * sizeof *p);
        if (!p) return QD_ENOMEM;
        w->prev = p;
        int32_t *q = realloc(w->next, n * sizeof *q);
        if (!q) return QD_ENOMEM;
        w->next = q;
        w->cap_sym = n;
    }
    int32_t *prev = w->prev, *next = w->next;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        int rc = push_pair(merges, w, ids, (int32_t)i, (int32_t)i + 1);
        if (rc) return rc;
    }
    while (w->n_heap > 0) {
        uint32_t top[3];
        heap_pop(w, top);
        int32_t l = (int32_t)top[1], r = (int32_t)top[2];
        /* A dead left symbol has prev == -2; a pair whose right side moved on is stale. */
        if (prev[l] == -2 || next[l] != r) continue;
        int32_t rank, id;
        if (!tok_pairmap_get(merges, ids[l], ids[r], &rank, &id) || (uint32_t)rank != top[0]) continue;
        ids[l] = id;
        int32_t rn = next[r];
        next[l] = rn;
        if (rn >= 0) prev[rn] = l;
        prev[r] = -2;
        next[r] = -2;
        int rc = push_pair(merges, w, ids, prev[l], l);
        if (!rc) rc = push_pair(merges, w, ids, l, rn);
        if (rc) return rc;
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) ids[k++] = ids[i];
    *n_out = k;
    return 0;
}

void tok_bpe_work_free(tok_bpe_work *w)
{
    if (!w) return;
    free(w->prev);
    free(w->next);
    free(w->heap);
    w->prev = w->next = NULL;
    w->heap = NULL;
    w->cap_sym = w->cap_heap = w->n_heap = 0;
}
