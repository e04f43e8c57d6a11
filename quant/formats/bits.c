/* Raw bit packing shared by every format.
 *
 * One rule covers 2, 3, 4 and 8 bits: a block of 32 values fills exactly `bits` words,
 * read as one little-endian bit stream in which value i sits at bit bits*i. For 2/4/8
 * bits no value crosses a word; for 3 bits this is exactly the GPTQ layout (v10 and v21
 * straddle words 0/1 and 1/2), so no special case is needed. */
#include "quant/formats/format.h"

int32_t qd_bits_get(int bits, const int32_t *words, int64_t wstride, int64_t idx)
{
    const int64_t blk = idx / 32, i = idx % 32;
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t pos = (int64_t)bits * i, w = pos / 32;
    const int off = (int)(pos % 32);
    const int32_t *base = words + blk * bits * wstride;
    uint32_t v = (uint32_t)base[w * wstride] >> off;
    if (off + bits > 32) v |= (uint32_t)base[(w + 1) * wstride] << (32 - off);
    return (int32_t)(v & mask);
}

void qd_pack_bits(int bits, const int32_t *vals, int64_t count, int64_t vstride,
                  int32_t *words, int64_t wstride)
{
    const uint32_t mask = (1u << bits) - 1u;
    for (int64_t blk = 0; blk < count / 32; blk++) {
        uint32_t acc[8] = {0};                          /* bits <= 8 words per block */
        for (int i = 0; i < 32; i++) {
            uint32_t v = (uint32_t)vals[(blk * 32 + i) * vstride] & mask;
            int pos = bits * i, w = pos / 32, off = pos % 32;
            acc[w] |= v << off;
            if (off + bits > 32) acc[w + 1] |= v >> (32 - off);
        }
        for (int w = 0; w < bits; w++) words[(blk * bits + w) * wstride] = (int32_t)acc[w];
    }
}

void qd_unpack_bits(int bits, const int32_t *words, int64_t count, int64_t wstride,
                    int32_t *vals, int64_t vstride)
{
    for (int64_t i = 0; i < count; i++) vals[i * vstride] = qd_bits_get(bits, words, wstride, i);
}
