/* Private to api/: the status page's files (ui/), compiled into the daemon by ui/embed.cmake,
 * which generates the array these name. */
#pragma once

#include <stddef.h>

typedef struct api_ui_asset {
    const char *name;         /* "app.js": the path under /ui/ */
    const char *content_type; /* from the file's extension */
    const unsigned char *data;
    size_t size;
} api_ui_asset_t;

extern const api_ui_asset_t api_ui_assets[];
extern const int api_ui_asset_count;
