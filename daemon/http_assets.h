/* The dashboard's static files (daemon/dashboard/), compiled into the daemon: the build
 * turns each file into a byte array (cmake/embed_assets.cmake writes http_assets.c into the
 * build tree), so the daemon serves the page with nothing to install or fetch. */
#ifndef QUANTD_DAEMON_HTTP_ASSETS_H
#define QUANTD_DAEMON_HTTP_ASSETS_H

#include <stddef.h>

typedef struct qh_asset {
    const char *path;             /* "/", "/app.js", ... */
    const char *ctype;
    const unsigned char *data;    /* static, not NUL-terminated */
    size_t len;
} qh_asset;

/* The file served at path ("/" is index.html), or NULL. */
const qh_asset *qh_asset_find(const char *path);

#endif
