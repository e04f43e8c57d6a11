/* Harness for the job spec parser (quant/job/job.h), shared by the libFuzzer target
 * fuzz_job and the bounded ctest run test_job_fuzz. */
#ifndef QUANTD_TESTS_JOB_FUZZ_ONE_H
#define QUANTD_TESTS_JOB_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Parses data as a job spec and checks the invariants of the outcome. Returns 0, or -1 when
 * an invariant is broken (the reason is printed). *accepted (may be NULL) is set to 1 when
 * the spec was accepted. */
int job_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
