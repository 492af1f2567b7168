// Training-log loss curves: JSON-lines parsing (cJSON per line), nice tick placement, and a small
// rasterizer (anti-aliased lines by distance to the segment, discs, a 5x7 bitmap font).
// Not here: PNG encoding (base/png.c), command-line handling (cli/cmd_eval.c).
#include "train/plot.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

// ---------------------------------------------------------------------------------------------
// Logs

void td_plot_log_free(td_plot_log *l) {
    if (!l) return;
    free(l->path);
    for (int i = 0; i < l->n_metrics; i++) {
        free(l->metric[i]);
        free(l->x[i]);
        free(l->y[i]);
    }
    free(l);
}

typedef struct point {
    double x, y;
    size_t ord;  // line order, so the last of equal steps wins
} point;

static int point_cmp(const void *a, const void *b) {
    const point *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? -1 : 1;
    return p->ord < q->ord ? -1 : p->ord > q->ord;
}

// Sorts the points by step and keeps, for a step logged more than once (a run resumed from an
// earlier checkpoint appends to the same log), the value logged last. Returns -1 on no memory.
static int sort_dedupe(double *x, double *y, size_t *n) {
    if (*n < 2) return 0;
    point *p = malloc(*n * sizeof *p);
    if (!p) return -1;
    for (size_t i = 0; i < *n; i++) p[i] = (point){x[i], y[i], i};
    qsort(p, *n, sizeof *p, point_cmp);
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if (i + 1 < *n && p[i + 1].x == p[i].x) continue;  // a later line has this step
        x[k] = p[i].x;
        y[k] = p[i].y;
        k++;
    }
    *n = k;
    free(p);
    return 0;
}

td_status td_plot_log_read(const char *path, const char *const *metrics, int n_metrics,
                           td_plot_log **out, td_err *err) {
    *out = NULL;
    if (n_metrics < 1 || n_metrics > TD_PLOT_MAX_METRICS)
        return td_err_set(err, TD_ERR_INVALID, "plot: between 1 and %d metrics, got %d",
                          TD_PLOT_MAX_METRICS, n_metrics);
    char *text;
    size_t len;
    td_status st = td_read_file(path, 0, &text, &len, err);
    if (st) return st;
    // Size first: a line gives at most one point per metric.
    size_t nlines = 1;
    for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
    td_plot_log *l = calloc(1, sizeof *l);
    if (!l) goto nomem;
    l->n_metrics = n_metrics;
    l->path = strdup(path);
    if (!l->path) goto nomem;
    for (int m = 0; m < n_metrics; m++) {
        l->metric[m] = strdup(metrics[m]);
        l->x[m] = malloc(nlines * sizeof(double));
        l->y[m] = malloc(nlines * sizeof(double));
        if (!l->metric[m] || !l->x[m] || !l->y[m]) goto nomem;
    }
    for (size_t a = 0; a < len;) {
        size_t b = a;
        while (b < len && text[b] != '\n') b++;
        size_t s = a, e = b;
        while (s < e && (text[s] == ' ' || text[s] == '\t' || text[s] == '\r')) s++;
        while (e > s && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\r')) e--;
        a = b + 1;
        if (s == e) continue;
        l->lines++;
        cJSON *o = cJSON_ParseWithLength(text + s, e - s);
        const cJSON *step = o && cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
        if (!step || !cJSON_IsNumber(step) || !isfinite(step->valuedouble)) {
            l->malformed++;
            cJSON_Delete(o);
            continue;
        }
        for (int m = 0; m < n_metrics; m++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, metrics[m]);
            if (!v || !cJSON_IsNumber(v) || !isfinite(v->valuedouble)) continue;
            l->x[m][l->n[m]] = step->valuedouble;
            l->y[m][l->n[m]] = v->valuedouble;
            l->n[m]++;
        }
        cJSON_Delete(o);
    }
    free(text);
    for (int m = 0; m < n_metrics; m++) {
        if (sort_dedupe(l->x[m], l->y[m], &l->n[m])) goto nomem2;
    }
    *out = l;
    return TD_OK;
nomem2:
    td_plot_log_free(l);
    return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
nomem:
    free(text);
    td_plot_log_free(l);
    return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
}

// ---------------------------------------------------------------------------------------------
// 5x7 font: 7 rows of 5 bits (bit 4 = leftmost column). Characters not listed draw as '?'.

typedef struct glyph {
    char c;
    uint8_t row[7];
} glyph;

static const glyph FONT[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}},
    {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}},
    {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
    {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}},
    {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}},
    {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}},
    {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}},
    {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}},
    {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}},
    {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}},
    {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}},
    {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'#', {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A}},
    {'*', {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}},
    {'\'', {0x0C, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00}},
    {'"', {0x0A, 0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00}},
    {'!', {0x04, 0x04, 0x04, 0x04, 0x00, 0x00, 0x04}},
    {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}},
    {'@', {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E}},
    {'&', {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}},
};

// Letters with descenders: 7 rows drawn 2 rows lower (rows 2..8 of the cell), the x-height part
// aligned with the other lowercase letters.
static const glyph FONT_DESC[] = {
    {'g', {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'p', {0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10}},
    {'q', {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x01}},
    {'y', {0x11, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
};

// The rows of c and how many rows down they start (0, or 2 for descenders).
static const uint8_t *glyph_rows(char c, int *shift) {
    *shift = 0;
    for (size_t i = 0; i < sizeof FONT_DESC / sizeof FONT_DESC[0]; i++)
        if (FONT_DESC[i].c == c) {
            *shift = 2;
            return FONT_DESC[i].row;
        }
    static const uint8_t *table[128];
    static int ready;  // filled once; the table is a pure function of FONT, so a race is benign
    if (!ready) {
        for (size_t i = 0; i < sizeof FONT / sizeof FONT[0]; i++) table[(int)FONT[i].c] = FONT[i].row;
        ready = 1;
    }
    unsigned char u = (unsigned char)c;
    return u < 128 && table[u] ? table[u] : table['?'];
}

#define GLYPH_ADV 6  // font units per character (5 columns + 1 space)

// ---------------------------------------------------------------------------------------------
// Canvas

typedef struct canvas {
    int w, h;
    uint8_t *rgb;  // [h][w][3]
    float *cov;    // [h][w] coverage of the series being drawn (max over its primitives)
    int cx0, cy0, cx1, cy1;  // clip rectangle for cov, inclusive
    int dx0, dy0, dx1, dy1;  // dirty box of cov
} canvas;

static void blend(canvas *c, int x, int y, uint32_t rgb, float a) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h || a <= 0) return;
    if (a > 1) a = 1;
    uint8_t *p = c->rgb + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    const int col[3] = {(int)(rgb >> 16) & 255, (int)(rgb >> 8) & 255, (int)rgb & 255};
    for (int k = 0; k < 3; k++) p[k] = (uint8_t)lrintf((float)p[k] + ((float)col[k] - (float)p[k]) * a);
}

static void fill_rect(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) blend(c, x, y, rgb, 1);
}

static void cov_put(canvas *c, int x, int y, float a) {
    if (x < c->cx0 || y < c->cy0 || x > c->cx1 || y > c->cy1 || a <= 0) return;
    float *p = c->cov + (size_t)y * (size_t)c->w + (size_t)x;
    if (a > *p) *p = a > 1 ? 1 : a;
    if (x < c->dx0) c->dx0 = x;
    if (y < c->dy0) c->dy0 = y;
    if (x > c->dx1) c->dx1 = x;
    if (y > c->dy1) c->dy1 = y;
}

// Anti-aliased segment of width wd: coverage = clamp(wd/2 + 0.5 - distance, 0, 1) per pixel
// centre. Pixel (x, y) has its centre at (x, y) in these coordinates.
static void cov_segment(canvas *c, double ax, double ay, double bx, double by, double wd) {
    double r = wd / 2 + 0.5;
    int x0 = (int)floor(fmin(ax, bx) - r), x1 = (int)ceil(fmax(ax, bx) + r);
    int y0 = (int)floor(fmin(ay, by) - r), y1 = (int)ceil(fmax(ay, by) + r);
    if (x0 < c->cx0) x0 = c->cx0;
    if (y0 < c->cy0) y0 = c->cy0;
    if (x1 > c->cx1) x1 = c->cx1;
    if (y1 > c->cy1) y1 = c->cy1;
    double dx = bx - ax, dy = by - ay, l2 = dx * dx + dy * dy;
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) {
            double t = l2 > 0 ? ((x - ax) * dx + (y - ay) * dy) / l2 : 0;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            double ex = ax + t * dx - x, ey = ay + t * dy - y;
            cov_put(c, x, y, (float)(r - sqrt(ex * ex + ey * ey)));
        }
}

static void cov_disc(canvas *c, double cx, double cy, double rad) {
    cov_segment(c, cx, cy, cx, cy, 2 * rad);
}

// Paints the accumulated coverage in one colour and clears it.
static void cov_flush(canvas *c, uint32_t rgb) {
    for (int y = c->dy0; y <= c->dy1; y++)
        for (int x = c->dx0; x <= c->dx1; x++) {
            float *p = c->cov + (size_t)y * (size_t)c->w + (size_t)x;
            if (*p > 0) blend(c, x, y, rgb, *p);
            *p = 0;
        }
    c->dx0 = c->dy0 = 1 << 30;
    c->dx1 = c->dy1 = -1;
}

static int text_width(const char *s, int scale) {
    int n = (int)strlen(s);
    return n ? (n * GLYPH_ADV - 1) * scale : 0;
}

// Draws s with its top-left corner at (x, y); vertical = rotated 90 degrees counter-clockwise
// (reads bottom to top), (x, y) then being the top-left of the rotated box.
static void draw_text(canvas *c, int x, int y, const char *s, int scale, uint32_t rgb, int vertical) {
    int len = (int)strlen(s), tw = text_width(s, scale);
    for (int i = 0; i < len; i++) {
        int shift;
        const uint8_t *g = glyph_rows(s[i], &shift);
        for (int r = 0; r < 7; r++)
            for (int col = 0; col < 5; col++) {
                if (!(g[r] >> (4 - col) & 1)) continue;
                int u = (i * GLYPH_ADV + col) * scale, v = (r + shift) * scale;  // unrotated offsets
                for (int a = 0; a < scale; a++)
                    for (int b = 0; b < scale; b++) {
                        if (vertical)
                            blend(c, x + v + b, y + tw - 1 - (u + a), rgb, 1);
                        else
                            blend(c, x + u + a, y + v + b, rgb, 1);
                    }
            }
    }
}

// ---------------------------------------------------------------------------------------------
// Axes

#define MAX_TICKS 32

static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

// Linear ticks inside [lo, hi]; returns the count and the step.
static int lin_ticks(double lo, double hi, int target, double *t, double *step_out) {
    double step = nice_step(hi - lo, target);
    int n = 0;
    for (double v = ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && n < MAX_TICKS; v += step)
        t[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    *step_out = step;
    return n;
}

static void fmt_tick(char *buf, size_t cap, double v, double step) {
    if (fabs(v) >= 1e6 || (v != 0 && fabs(v) < 1e-4)) {
        snprintf(buf, cap, "%.3g", v);
        return;
    }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (dec > 6) dec = 6;
    snprintf(buf, cap, "%.*f", dec, v);
}

// y ticks: values (in data units) and labels. On a log axis: decades (with 2 and 5 when few) or,
// under one decade, linear nice values placed logarithmically.
static int y_ticks(double v0, double v1, bool log_y, double *t, char lab[][24]) {
    int n = 0;
    double step;
    if (!log_y) {
        n = lin_ticks(v0, v1, 6, t, &step);
        for (int i = 0; i < n; i++) fmt_tick(lab[i], 24, t[i], step);
        return n;
    }
    double decades = v1 - v0;
    if (decades >= 1) {
        static const double mult[3] = {1, 2, 5};
        int nm = decades > 3 ? 1 : 3;
        for (int k = (int)floor(v0); k <= (int)ceil(v1) && n < MAX_TICKS; k++)
            for (int m = 0; m < nm && n < MAX_TICKS; m++) {
                double val = mult[m] * pow(10, k), lv = log10(val);
                if (lv < v0 - 1e-9 || lv > v1 + 1e-9) continue;
                t[n] = val;
                snprintf(lab[n], 24, "%g", val);
                n++;
            }
        if (n >= 2) return n;
        n = 0;
    }
    double lin[MAX_TICKS];
    int nl = lin_ticks(pow(10, v0), pow(10, v1), 6, lin, &step);
    for (int i = 0; i < nl; i++) {
        if (lin[i] <= 0) continue;
        t[n] = lin[i];
        fmt_tick(lab[n], 24, lin[i], step);
        n++;
    }
    return n;
}

// ---------------------------------------------------------------------------------------------
// Rendering

td_plot_params td_plot_default_params(void) {
    return (td_plot_params){.width = 900, .height = 560, .title = NULL, .x_label = NULL,
                            .y_label = NULL, .log_y = false};
}

uint32_t td_plot_color(int i) {
    // Matplotlib's "tab10": distinct hues that stay readable on white.
    static const uint32_t pal[10] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                     0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
    return pal[(i % 10 + 10) % 10];
}

static bool usable(double x, double y, bool log_y) {
    return isfinite(x) && isfinite(y) && (!log_y || y > 0);
}

#define TEXT_RGB 0x222222
#define GRID_RGB 0xe6e6e6
#define AXIS_RGB 0x444444
#define FS 2  // font scale for tick labels, axis labels and the legend

td_status td_plot_render(const td_plot_params *p, const td_plot_series *s, int n_series,
                         uint8_t **rgb_out, td_plot_layout *layout, td_err *err) {
    *rgb_out = NULL;
    if (p->width < 200 || p->height < 150 || p->width > 16384 || p->height > 16384)
        return td_err_set(err, TD_ERR_INVALID, "plot: size %dx%d outside 200x150..16384x16384",
                          p->width, p->height);
    // Data ranges.
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < n_series; i++)
        for (size_t k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (!usable(x, y, p->log_y)) continue;
            double v = p->log_y ? log10(y) : y;
            xmin = fmin(xmin, x);
            xmax = fmax(xmax, x);
            ymin = fmin(ymin, v);
            ymax = fmax(ymax, v);
        }
    if (!(xmin <= xmax))
        return td_err_set(err, TD_ERR_INVALID, "plot: no plottable points%s",
                          p->log_y ? " (a log axis needs values > 0)" : "");
    if (xmax - xmin <= 0) {
        xmin -= 1;
        xmax += 1;
    }
    if (ymax - ymin <= 0) {
        double d = p->log_y ? 0.1 : fmax(fabs(ymin) * 0.1, 1e-3);
        ymin -= d;
        ymax += d;
    }
    double xstep, xt[MAX_TICKS];
    // x: extend to the nearest ticks outside the data, so the axis ends on labelled values.
    double xs = nice_step(xmax - xmin, 8);
    double x0 = floor(xmin / xs + 1e-9) * xs, x1 = ceil(xmax / xs - 1e-9) * xs;
    int nxt = lin_ticks(x0, x1, 8, xt, &xstep);
    double pad = (ymax - ymin) * 0.05, y0 = ymin - pad, y1 = ymax + pad;
    double yt[MAX_TICKS];
    char ylab[MAX_TICKS][24];
    int nyt = y_ticks(y0, y1, p->log_y, yt, ylab);

    // Margins from the labels.
    int ylab_w = 0;
    for (int i = 0; i < nyt; i++) {
        int w = text_width(ylab[i], FS);
        ylab_w = w > ylab_w ? w : ylab_w;
    }
    const int ch = 7 * FS;  // text height, px
    int left = 12 + (p->y_label ? ch + 12 : 0) + ylab_w + 8;
    int top = p->title ? 16 + 7 * 3 + 12 : 16;
    // Room on the right for half of the last x label, centred on the axis end.
    char xlast[32];
    fmt_tick(xlast, sizeof xlast, nxt ? xt[nxt - 1] : 0, xstep);
    int rmargin = text_width(xlast, FS) / 2 + 8;
    int right = p->width - 1 - (rmargin > 24 ? rmargin : 24);
    int bottom = p->height - 1 - (8 + ch + 10 + ch + 12);
    if (right - left < 50 || bottom - top < 50)
        return td_err_set(err, TD_ERR_INVALID, "plot: %dx%d is too small for the labels", p->width,
                          p->height);
    // 2% margins left and right so that points at the ends do not sit on the frame.
    double xm = (x1 - x0) * 0.02;
    td_plot_layout L = {.left = left, .top = top, .right = right, .bottom = bottom, .x0 = x0 - xm,
                        .x1 = x1 + xm, .y0 = y0, .y1 = y1, .log_y = p->log_y};
#define PX(x) (L.left + ((x) - L.x0) / (L.x1 - L.x0) * (L.right - L.left))
#define PY(v) (L.bottom - ((v) - L.y0) / (L.y1 - L.y0) * (L.bottom - L.top))

    canvas c = {.w = p->width, .h = p->height};
    size_t npx = (size_t)c.w * (size_t)c.h;
    c.rgb = malloc(npx * 3);
    c.cov = calloc(npx, sizeof(float));
    if (!c.rgb || !c.cov) {
        free(c.rgb);
        free(c.cov);
        return td_err_set(err, TD_ERR_NOMEM, "plot: out of memory for %dx%d", c.w, c.h);
    }
    memset(c.rgb, 255, npx * 3);
    c.dx0 = c.dy0 = 1 << 30;
    c.dx1 = c.dy1 = -1;

    // Grid, ticks and tick labels.
    char buf[32];
    for (int i = 0; i < nxt; i++) {
        int x = (int)lrint(PX(xt[i]));
        for (int y = top; y <= bottom; y++) blend(&c, x, y, GRID_RGB, 1);
        for (int y = bottom + 1; y <= bottom + 5; y++) blend(&c, x, y, AXIS_RGB, 1);
        fmt_tick(buf, sizeof buf, xt[i], xstep);
        draw_text(&c, x - text_width(buf, FS) / 2, bottom + 9, buf, FS, TEXT_RGB, 0);
    }
    for (int i = 0; i < nyt; i++) {
        int y = (int)lrint(PY(p->log_y ? log10(yt[i]) : yt[i]));
        for (int x = left; x <= right; x++) blend(&c, x, y, GRID_RGB, 1);
        for (int x = left - 5; x < left; x++) blend(&c, x, y, AXIS_RGB, 1);
        draw_text(&c, left - 8 - text_width(ylab[i], FS), y - ch / 2, ylab[i], FS, TEXT_RGB, 0);
    }
    // Frame.
    for (int x = left; x <= right; x++) {
        blend(&c, x, top, AXIS_RGB, 1);
        blend(&c, x, bottom, AXIS_RGB, 1);
    }
    for (int y = top; y <= bottom; y++) {
        blend(&c, left, y, AXIS_RGB, 1);
        blend(&c, right, y, AXIS_RGB, 1);
    }
    // Labels and title.
    const char *xl = p->x_label ? p->x_label : "step";
    draw_text(&c, (left + right) / 2 - text_width(xl, FS) / 2, p->height - 1 - 12 - ch, xl, FS,
              TEXT_RGB, 0);
    if (p->y_label) {
        char yl[160];
        snprintf(yl, sizeof yl, "%s%s", p->y_label, p->log_y ? " (log scale)" : "");
        draw_text(&c, 12, (top + bottom) / 2 - text_width(yl, FS) / 2, yl, FS, TEXT_RGB, 1);
    }
    if (p->title) draw_text(&c, (left + right) / 2 - text_width(p->title, 3) / 2, 16, p->title, 3,
                            TEXT_RGB, 0);

    // Series, clipped to the inside of the frame.
    c.cx0 = left + 1;
    c.cy0 = top + 1;
    c.cx1 = right - 1;
    c.cy1 = bottom - 1;
    for (int i = 0; i < n_series; i++) {
        double wd = s[i].style == TD_PLOT_MARKERS ? 2.0 : 1.0;
        double px = 0, py = 0;
        int have = 0;
        for (size_t k = 0; k < s[i].n; k++) {
            if (!usable(s[i].x[k], s[i].y[k], p->log_y)) continue;
            double qx = PX(s[i].x[k]), qy = PY(p->log_y ? log10(s[i].y[k]) : s[i].y[k]);
            if (have) cov_segment(&c, px, py, qx, qy, wd);
            if (s[i].style == TD_PLOT_MARKERS) cov_disc(&c, qx, qy, 3.5);
            px = qx;
            py = qy;
            have = 1;
        }
        if (have && s[i].n == 1) cov_disc(&c, px, py, 1.5);
        cov_flush(&c, s[i].rgb);
    }

    // Legend: top-right inside the plot, one row per series.
    if (n_series > 0) {
        int lw = 0;
        for (int i = 0; i < n_series; i++) {
            int w = text_width(s[i].label ? s[i].label : "", FS);
            lw = w > lw ? w : lw;
        }
        int row = ch + 8, sample = 28;
        int bw = 10 + sample + 8 + lw + 10, bh = 8 + n_series * row;
        int bx = right - 10 - bw, by = top + 10;
        if (bx < left + 2) bx = left + 2;
        fill_rect(&c, bx, by, bx + bw, by + bh, 0xffffff);
        for (int x = bx; x <= bx + bw; x++) {
            blend(&c, x, by, 0xbbbbbb, 1);
            blend(&c, x, by + bh, 0xbbbbbb, 1);
        }
        for (int y = by; y <= by + bh; y++) {
            blend(&c, bx, y, 0xbbbbbb, 1);
            blend(&c, bx + bw, y, 0xbbbbbb, 1);
        }
        c.cx0 = 0;
        c.cy0 = 0;
        c.cx1 = c.w - 1;
        c.cy1 = c.h - 1;
        for (int i = 0; i < n_series; i++) {
            double ly = by + 4 + i * row + row / 2.0 - 0.5;
            double lx0 = bx + 10, lx1 = bx + 10 + sample;
            bool mk = s[i].style == TD_PLOT_MARKERS;
            cov_segment(&c, lx0, ly, lx1, ly, mk ? 2.0 : 1.0);
            if (mk) cov_disc(&c, (lx0 + lx1) / 2, ly, 3.5);
            cov_flush(&c, s[i].rgb);
            if (s[i].label)
                draw_text(&c, (int)lx1 + 8, by + 4 + i * row + (row - ch) / 2, s[i].label, FS,
                          TEXT_RGB, 0);
        }
    }
#undef PX
#undef PY
    free(c.cov);
    if (layout) *layout = L;
    *rgb_out = c.rgb;
    return TD_OK;
}
