/* JSON files (see jsonfile.h). */
#include "quant/core/jsonfile.h"

#include <stdlib.h>
#include <cjson/cJSON.h>

#include "quant/core/fsutil.h"

int qd_json_read_object(const char *path, cJSON **out, qd_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = qd_fs_read_file(path, &buf, &len, err);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        size_t off = e && e >= buf && e <= buf + len ? (size_t)(e - buf) : 0;
        free(buf);
        return qd_err_set(err, QD_EFORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return 0;
}
