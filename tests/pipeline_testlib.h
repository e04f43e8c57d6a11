/* Helpers shared by the pipeline tests (tests/pipeline_testlib.c, built into the qtest
 * library): the set-up their main() functions share (pt_setup: the CPU backend, the temp
 * directory, the calibration ids, generated models), a job from JSON, running it, reading
 * back files and forward logits, and damaging a model's tensor. */
#ifndef QUANTD_TEST_PIPELINE_TESTLIB_H
#define QUANTD_TEST_PIPELINE_TESTLIB_H

#include <stdlib.h>
#include <cjson/cJSON.h>

#include "quant/backend/backend.h"
#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"
#include "quant/formats/format.h"
#include "quant/job/job.h"
#include "quant/model/model.h"
#include "quant/model/testgen.h"
#include "quant/model/token_file.h"
#include "quant/pipeline/pipeline.h"
#include "test_util.h"

/* The backend the helpers use; pt_setup opens it. */
extern qd_backend *pt_be;

/* The set-up every pipeline test's main() starts with: opens pt_be (the CPU backend with
 * `threads` threads), creates the test's temp directory (its path in *tmp; test_finish
 * removes it) and, when n_tokens > 0, writes n_tokens random ids below vocab (seed) to
 * <tmp>/calib.json (its path in *tokens). tmp and tokens may be NULL. Returns 0, or 1 with
 * what failed on stderr: main() returns that. */
int pt_setup(int threads, size_t n_tokens, int vocab, uint64_t seed, const char **tmp, const char **tokens);
/* Generates the model o (pt_gen_model) in <tmp>/name and puts its path in dir (cap bytes).
 * Returns 0, or 1 with the reason on stderr. */
int pt_setup_model(const char *name, const qd_testgen_opts *o, char *dir, size_t cap);
/* The end of main(): closes pt_be and returns test_finish(). */
int pt_teardown(void);

qd_testgen_opts pt_llama_opts(int64_t inter, int n_layers);
int pt_gen_model(const char *dir, const qd_testgen_opts *o);
int pt_write_tokens(const char *path, size_t n, int vocab, uint64_t seed);
/* The calibration pt_job asks for (default 8 sequences of 32 tokens), and more of its fields
 * (default "": e.g. ",\"shards\":2"). */
extern int pt_calib_samples, pt_calib_seq_len;
extern const char *pt_calib_extra;
qp_job *pt_job(const char *model, const char *out, const char *method, const char *format,
                      const char *calib, const char *extra);
/* Parses the job (pt_job) and runs it to the end on pt_be (qd_pipeline_run), a check each.
 * Returns the job (the caller frees it) once it finished, else NULL with the failure
 * reported under what (the caller's name for the case). */
qp_job *pt_run_job(const char *what, const char *model, const char *out, const char *method, const char *format,
                   const char *calib, const char *extra);
char *pt_read(const char *path, size_t *len);
cJSON *pt_read_json(const char *path);
int pt_same_file(const char *a, const char *b);
float *pt_logits(const char *dir, int64_t *n_out);
double pt_rel_err(const float *a, const float *b, int64_t n);
/* ||logits(dir) - logits(ref_dir)|| / ||logits(ref_dir)|| on pt_logits' ids; -1 when either
 * model cannot be opened or run (the reason is printed). */
double pt_logits_rel(const char *ref_dir, const char *dir);
/* Runs every block of an opened pipeline, finishes and closes it (p is gone afterwards);
 * returns the last block's forward passes, or -1 (a failure is CHECKed). */
int pt_run_all(qd_pipeline *p);
/* A random packed layer [n, k] of format f: random codes, F16-exact scales and zeros of 1 or
 * more (gptq v1 cannot store 0), g_idx copied from g_idx or else an act-order one (a random
 * permutation of the columns, grouped by gs), and with bias_scale > 0 a bias of that
 * scale. Failures are reported. */
void pt_rand_packed(test_rng *r, const qd_format *f, int64_t n, int64_t k, int bits, int64_t gs, float bias_scale,
                    const int32_t *g_idx, qd_packed *out);
/* Overwrites an element a few in of tensor name in dir/model.safetensors with bits32 (an
 * F32 tensor) or bits16 (F16 or BF16), in place. 0, or -1 (an absent tensor is named on
 * stderr). */
int pt_patch_tensor(const char *dir, const char *name, uint32_t bits32, uint16_t bits16);
/* The same with a NaN (0x7FC0 is one in F16 and in BF16). */
int pt_patch_nan(const char *dir, const char *name);
/* tests/data/families in the source tree (transformers' tiny checkpoints per family). */
const char *pt_families_dir(void);

#endif
