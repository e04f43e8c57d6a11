/* The process's peak resident memory (see rss.h). */
#include "quant/core/rss.h"

#include <fcntl.h>
#include <stdio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/resource.h>
#include <unistd.h>

void qd_rss_release(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

int qd_rss_peak_reset(void)
{
    /* What earlier jobs freed may still sit in malloc's arenas, resident; handed back first,
     * it is not counted as this job's. */
    qd_rss_release();
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    /* "5" resets only the high-water mark; the other values clear page reference bits. */
    int rc = write(fd, "5", 1) == 1 ? 0 : -1;
    close(fd);
    return rc;
}

uint64_t qd_rss_peak_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        int found = 0;
        while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "VmHWM: %llu kB", &kb) == 1;
        fclose(f);
        if (found) return (uint64_t)kb * 1024;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0 || ru.ru_maxrss < 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024;   /* KiB on Linux */
}
