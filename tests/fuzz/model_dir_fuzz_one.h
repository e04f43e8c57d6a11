/* Harness for everything a job points at in a model directory (issue #33): config.json, the
 * tokenizer files, the generation and special-token files, the shard index and the shards,
 * each of which may also be a FIFO, a directory, a socket, a link to /dev/zero, a link out
 * of the directory, a link inside it, a dangling link or a sparse file over the size limit.
 * Shared by the libFuzzer target fuzz_model_dir and the bounded ctest run
 * test_model_dir_fuzz.
 *
 * The input is a text container, so a byte mutator keeps most of it whole:
 *
 *     qdir [confine] [walk] [json=N] [tok=N]
 *     --- config.json
 *     {...the file's bytes...}
 *     --- tokenizer_config.json fifo
 *     --- model-00001-of-00002.safetensors
 *     <binary shard>
 *
 * The first line (optional) sets the run: `confine` confines the process to the model
 * directory (qd_confine_set), `walk` forces the component walk used without openat2, json=
 * and tok= set the JSON and tokenizer size limits in bytes (64 KiB and 256 KiB otherwise).
 * Each "--- name [kind]" line at the start of a line begins a file; its bytes run to the
 * next such line (the newline before it is not part of the file). Kinds: file (the default),
 * big (the bytes, then a hole past every limit), fifo, dir, sock, zero (a link to /dev/zero),
 * out and up (an absolute and a "../" link to a file outside the directory holding the
 * bytes), in (a link to a file inside it holding the bytes), gone (a dangling link). */
#ifndef QUANTD_TESTS_MODEL_DIR_FUZZ_ONE_H
#define QUANTD_TESTS_MODEL_DIR_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* What the runs reached, summed over calls (for the ctest's coverage checks). */
typedef struct model_dir_fuzz_stats {
    long inputs, confined, walked;
    long model_opened, tok_loaded, copied, copy_refused, fingerprinted;
    long refused_type, refused_size, refused_outside, refused_link, refused_missing;
} model_dir_fuzz_stats;

/* Writes the directory the input describes into a fresh temporary directory (under /dev/shm
 * when it is there), runs what a job does with it twice (qd_model_open, qd_tokenizer_load,
 * qd_output_copy_aux into an output directory, qd_fingerprint_model_dir), checks every
 * outcome against what the container says the files are, and removes it all. Returns 0, or
 * -1 when an invariant is broken (the reason is printed). *accepted (may be NULL) is 1 when
 * the model opened. st (may be NULL) is added to. */
int model_dir_fuzz_run(const uint8_t *data, size_t size, int *accepted, model_dir_fuzz_stats *st);
/* model_dir_fuzz_run without the stats: the fz_one_fn and libFuzzer shape. */
int model_dir_fuzz_one(const uint8_t *data, size_t size, int *accepted);

/* One file for model_dir_fuzz_pack. */
typedef struct model_dir_fuzz_file {
    const char *name;
    const char *kind;      /* NULL or "file": a regular file */
    const void *data;
    size_t len;
} model_dir_fuzz_file;

/* Builds a container: the header line ("qdir" and flags, NULL for none) and the files.
 * *out is malloc'd and owned by the caller. Returns 0, or -1 when a file's bytes hold a
 * "\n--- " that would split it. */
int model_dir_fuzz_pack(const char *header, const model_dir_fuzz_file *files, size_t n, uint8_t **out,
                        size_t *len);

#endif
