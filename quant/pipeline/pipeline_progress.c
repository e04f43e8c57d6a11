/* What a running pipeline tells the outside while it works: progress lines (stage, block,
 * fraction of the job, ETA) through the caller's hook, the last block's cost record, and
 * the sampling of the resources it uses (the process's peak resident set and the bytes
 * under the output directory) into the checkpoint state. The block loop and the finish
 * call these; neither calls back into the life cycle (pipeline.c). */
#include "quant/pipeline/pipeline_internal.h"

#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "quant/core/fsutil.h"
#include "quant/core/rss.h"

int qd_pipeline_report_progress(qd_pipeline *p, const char *stage, int block, const char *layer,
                                double within_block, double layer_error)
{
    if (!p->hooks.progress) return 0;
    qd_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.job_id = p->job->id;
    pr.stage = stage;
    pr.block = block;
    pr.n_blocks = p->n_blocks;
    pr.layer = layer;
    if (within_block < 0) within_block = 0;
    if (within_block > 1) within_block = 1;
    /* The blocks are nearly all of the work; writing and eval take the last 2%. */
    pr.fraction = p->n_blocks && block >= 0 ? 0.98 * (block + within_block) / p->n_blocks : 0;
    if (!strcmp(stage, "write") || !strcmp(stage, "eval")) pr.fraction = 0.98;
    /* target_bpw's plan passes over every block before block 0: the job has not begun its
     * blocks (block counts the plan's). */
    if (!strcmp(stage, "bpw_plan")) pr.fraction = 0;
    if (!strcmp(stage, "done")) pr.fraction = 1.0;
    pr.eta_s = -1;
    if (p->blocks_this_run > 0) {
        double per = p->block_seconds_sum / p->blocks_this_run;
        pr.eta_s = per * (p->n_blocks - (block < 0 ? 0 : block) - within_block);
        if (pr.eta_s < 0) pr.eta_s = 0;
    }
    pr.layer_error = layer_error;
    return p->hooks.progress(p->hooks.ud, &pr);
}

char *qd_pipeline_last_block_cost(const qd_pipeline *p)
{
    if (!p || p->blocks_this_run == 0) return NULL;
    cJSON *o = qd_block_cost_to_json(&p->cost);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

uint64_t qd_pipeline_out_bytes(const qd_pipeline *p)
{
    return p->out_fd >= 0 ? qd_fs_tree_bytes_fd(p->out_fd) : qd_fs_tree_bytes(p->out_dir);
}

void qd_pipeline_sample_peaks(qd_pipeline *p)
{
    uint64_t rss = qd_rss_peak_bytes(), disk = qd_pipeline_out_bytes(p);
    if (rss > p->st.peak_rss_bytes) p->st.peak_rss_bytes = rss;
    if (disk > p->st.peak_disk_bytes) p->st.peak_disk_bytes = disk;
}
