/* The process's peak resident memory, for comparing a job's estimate with what it took.
 *
 * The peak is the kernel's high-water mark of the process's resident set (VmHWM in
 * /proc/self/status, what getrusage's ru_maxrss reports for the living process). A worker
 * runs job after job, so qd_rss_peak_reset lowers the mark to the current resident set when
 * a job opens (Linux >= 4.0, /proc/self/clear_refs "5"); the peak read afterwards is then
 * the job's, plus whatever the process already held. ru_maxrss is only the fallback when
 * /proc cannot be read: it also keeps the peaks of threads that have exited, which no reset
 * lowers. Process-wide by nature: meaningful while one job runs in the process. The resident
 * set includes the file-backed pages of mapped files (an mmapped model's weights once read),
 * which are page cache the kernel can drop, as well as anonymous memory. */
#ifndef QUANT_CORE_RSS_H
#define QUANT_CORE_RSS_H

#include <stdint.h>

/* Hands back to the system what the allocator holds freed (glibc's malloc_trim: the free
 * top of the heap and the pages of its free chunks); nothing elsewhere. */
void qd_rss_release(void);
/* Lowers the high-water mark to the current resident set; 0, or -1 when the kernel does
 * not allow it (the peak then stays the process's since it started). */
int qd_rss_peak_reset(void);
/* The high-water mark in bytes; 0 when neither /proc nor getrusage answers. */
uint64_t qd_rss_peak_bytes(void);

#endif
