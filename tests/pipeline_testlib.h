/* Helpers shared by test_pipeline.c and test_pipeline_resume.c (tests/pipeline_testlib.c,
 * built into the qtest library): generate a tiny model and a token calibration file, build
 * a job from JSON, run it, and read back files and forward logits. */
#ifndef QUANTD_TEST_PIPELINE_TESTLIB_H
#define QUANTD_TEST_PIPELINE_TESTLIB_H

#include <stdlib.h>
#include <cjson/cJSON.h>

#include "proto/job.h"
#include "quant/backend/backend.h"
#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"
#include "quant/model/model.h"
#include "quant/model/testgen.h"
#include "quant/model/token_file.h"
#include "quant/pipeline/pipeline.h"
#include "test_util.h"

/* The backend the helpers use; the test's main() opens it. */
extern qd_backend *pt_be;

qd_testgen_opts pt_llama_opts(int64_t inter, int n_layers);
int pt_gen_model(const char *dir, const qd_testgen_opts *o);
int pt_write_tokens(const char *path, size_t n, int vocab, uint64_t seed);
qp_job *pt_job(const char *model, const char *out, const char *method, const char *format,
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
/* tests/data/families in the source tree (transformers' tiny checkpoints per family). */
const char *pt_families_dir(void);

#endif
