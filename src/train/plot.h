// Loss curves from training logs: reads JSON-lines logs (one object per line, as the trainer
// writes them) into (step, value) series and renders line charts into an RGB image with axes,
// tick labels, a legend and a built-in 5x7 bitmap font; PNG output through base/png.h.
// Not here: interactive plots, fonts from files, anything but x = step.
#ifndef TD_TRAIN_PLOT_H
#define TD_TRAIN_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

// ---- logs ----

#define TD_PLOT_MAX_METRICS 8

// One log file's series: for each requested metric, the (step, value) pairs of the lines that
// carry both as finite numbers, sorted by step; when a step appears on several lines (a run
// resumed from an earlier checkpoint appends to its log), the last line's value is kept.
// Owned by the log (td_plot_log_free).
typedef struct td_plot_log {
    char *path;
    int n_metrics;
    char *metric[TD_PLOT_MAX_METRICS];
    double *x[TD_PLOT_MAX_METRICS];  // [n[i]] steps
    double *y[TD_PLOT_MAX_METRICS];  // [n[i]] values
    size_t n[TD_PLOT_MAX_METRICS];
    size_t lines;      // non-empty lines read
    size_t malformed;  // lines that are not a JSON object, or whose "step" is not a number
} td_plot_log;

// Reads path. Each non-empty line must be a JSON object with a numeric "step"; other lines are
// counted in malformed and skipped (a trainer killed mid-write leaves a torn last line). Unknown
// fields are ignored; a metric that is absent, null or not a number on a line adds no point.
// TD_ERR_IO for an unreadable file, TD_ERR_INVALID for more than TD_PLOT_MAX_METRICS metrics.
td_status td_plot_log_read(const char *path, const char *const *metrics, int n_metrics,
                           td_plot_log **out, td_err *err);
void td_plot_log_free(td_plot_log *l);  // NULL is fine

// ---- rendering ----

typedef enum td_plot_style {
    TD_PLOT_LINE = 0,  // a thin (1 px, anti-aliased) line through the points
    TD_PLOT_MARKERS,   // a 2 px line plus a filled circle at every point (sparse metrics)
} td_plot_style;

typedef struct td_plot_series {
    const char *label;     // legend text (ASCII; other bytes draw as '?')
    const double *x, *y;   // [n]; points with a non-finite value (or y <= 0 on a log axis) skipped
    size_t n;
    uint32_t rgb;          // 0xRRGGBB
    td_plot_style style;
} td_plot_series;

typedef struct td_plot_params {
    int width, height;   // pixels (>= 200 x 150)
    const char *title;   // NULL = none
    const char *x_label;  // NULL = "step"
    const char *y_label;  // NULL = none
    bool log_y;
} td_plot_params;

td_plot_params td_plot_default_params(void);  // 900 x 560, no title, "step", linear y

// Where data landed, so callers (and tests) can map data to pixels:
//   px = left + (x - x0) / (x1 - x0) * (right - left)
//   py = bottom - (v - y0) / (y1 - y0) * (bottom - top), v = log10(y) when log_y else y
typedef struct td_plot_layout {
    int left, top, right, bottom;  // the plot area's edge pixels (inclusive)
    double x0, x1, y0, y1;
    bool log_y;
} td_plot_layout;

// The palette colour for series group i (ten distinct colours, then repeating).
uint32_t td_plot_color(int i);

// Renders the series into a malloc'd rgb[height][width][3] (*rgb, caller frees). TD_ERR_INVALID
// for bad sizes or when no series has a plottable point. layout may be NULL.
td_status td_plot_render(const td_plot_params *p, const td_plot_series *s, int n_series,
                         uint8_t **rgb, td_plot_layout *layout, td_err *err);

#endif
