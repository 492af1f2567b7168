// Tests the training-log reader, the plot renderer, the PNG writer (src/train/plot.h,
// src/base/png.h) and `tandem plot`. PNGs are decoded by an independent decoder
// (tests/reference/png_check.py: its own chunk/CRC/zlib/filter parsing, cross-checked with Pillow
// when installed), which also checks that each curve's colour lies on every data point's pixel.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/png.h"
#include "test_util.h"
#include "train/plot.h"

static char work[1024];

// Exit status of a shell command (stdout/stderr go to ours, or where cmd redirects them).
static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Run b starts 0.2 lower and falls faster, so the two runs never cross (overlapping curves would
// hide each other's colour from the pixel checks).
static double curve(double step, double k) { return (k < 200 ? 1.8 : 2) + 4 * exp(-step / k); }

// A log as the trainer writes it, plus noise the reader must tolerate: unknown fields, a line
// without step, null and string values, a blank line, garbage, a torn last line.
static void write_log(const char *path, double k) {
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"event\":\"start\",\"config\":{\"lr\":0.0003}}\n");  // no step: malformed
    for (int s = 0; s <= 1000; s += 10) {
        fprintf(f, "{\"step\":%d,\"loss\":%.6f,\"lr\":0.0003,\"grad_norm\":1.5,\"tokens_per_s\":1e5,"
                   "\"elapsed_s\":%d,\"extra\":[1,{\"a\":2}]",
                s, curve(s, k), s);
        if (s % 100 == 0) fprintf(f, ",\"val_loss\":%.6f", curve(s, k) + 0.1);
        if (s == 50) fprintf(f, ",\"val_loss\":null");
        if (s == 60) fprintf(f, ",\"val_loss\":\"n/a\"");
        fprintf(f, "}\n");
        if (s == 500) fprintf(f, "\n   \nnot json at all\n[1,2,3]\n");
    }
    fprintf(f, "{\"step\":1010,\"loss\":1.9");  // torn: the trainer was killed mid-line
    fclose(f);
}

// A run resumed from step 50 appends steps 50..150 to its log: the plot shows steps 0..150 once
// each, with the resumed run's values from 50 on.
static void test_resume(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/resumed.jsonl", work);
    FILE *f = fopen(path, "w");
    for (int s = 0; s <= 100; s += 10) fprintf(f, "{\"step\":%d,\"loss\":%d}\n", s, 1000 + s);
    for (int s = 50; s <= 150; s += 10) fprintf(f, "{\"step\":%d,\"loss\":%d}\n", s, 2000 + s);
    fclose(f);
    const char *metrics[1] = {"loss"};
    td_plot_log *l = NULL;
    td_err err = {0};
    CHECK(td_plot_log_read(path, metrics, 1, &l, &err) == TD_OK, "%s", err.msg);
    if (!l) return;
    CHECK(l->n[0] == 16, "resumed log: %zu points", l->n[0]);
    for (size_t i = 0; i < l->n[0] && i < 16; i++) {
        double want = (double)(i * 10) + (i < 5 ? 1000 : 2000);
        CHECK(l->x[0][i] == (double)(i * 10) && l->y[0][i] == want, "point %zu: (%g, %g)", i,
              l->x[0][i], l->y[0][i]);
    }
    td_plot_log_free(l);
}

static void test_log_read(const char *path) {
    const char *metrics[2] = {"loss", "val_loss"};
    td_plot_log *l = NULL;
    td_err err = {0};
    CHECK(td_plot_log_read(path, metrics, 2, &l, &err) == TD_OK, "%s", err.msg);
    if (!l) return;
    CHECK(l->n[0] == 101, "loss points %zu", l->n[0]);
    CHECK(l->n[1] == 11, "val_loss points %zu", l->n[1]);
    CHECK(l->malformed == 4, "malformed %zu (start event, garbage, array, torn line)", l->malformed);
    CHECK(l->lines == 101 + 4, "lines %zu", l->lines);
    CHECK(l->x[0][3] == 30 && fabs(l->y[0][3] - curve(30, 300)) < 1e-6, "loss[3] = (%g, %g)",
          l->x[0][3], l->y[0][3]);
    CHECK(l->x[1][10] == 1000, "last val step %g", l->x[1][10]);
    td_plot_log_free(l);
    CHECK(td_plot_log_read("/nonexistent/log.jsonl", metrics, 2, &l, &err) == TD_ERR_IO && !l,
          "missing log: %s", err.msg);
    CHECK(td_plot_log_read(path, metrics, 0, &l, &err) == TD_ERR_INVALID, "0 metrics accepted");
}

// Renders two logs, writes the PNG, and has png_check.py verify every point's colour; then shows
// the checker fails on a flipped byte and on a wrong expectation.
static void test_render(const char *log_a, const char *log_b, bool log_y) {
    const char *metrics[2] = {"loss", "val_loss"};
    td_plot_log *l[2] = {NULL, NULL};
    td_err err = {0};
    CHECK(td_plot_log_read(log_a, metrics, 2, &l[0], &err) == TD_OK, "%s", err.msg);
    CHECK(td_plot_log_read(log_b, metrics, 2, &l[1], &err) == TD_OK, "%s", err.msg);
    if (!l[0] || !l[1]) return;
    td_plot_series s[4];
    const char *labels[4] = {"a loss", "a val_loss", "b loss", "b val_loss"};
    for (int i = 0; i < 4; i++)
        s[i] = (td_plot_series){.label = labels[i], .x = l[i / 2]->x[i % 2], .y = l[i / 2]->y[i % 2],
                                .n = l[i / 2]->n[i % 2], .rgb = td_plot_color(i / 2),
                                .style = i % 2 ? TD_PLOT_MARKERS : TD_PLOT_LINE};
    td_plot_params p = td_plot_default_params();
    p.title = "Synthetic run: loss";
    p.y_label = "loss";
    p.log_y = log_y;
    uint8_t *rgb = NULL;
    td_plot_layout L;
    CHECK(td_plot_render(&p, s, 4, &rgb, &L, &err) == TD_OK, "%s", err.msg);
    if (!rgb) goto out;
    CHECK(L.left > 20 && L.right < p.width - 1 && L.top > 20 && L.bottom < p.height - 20 &&
              L.x0 <= 0 && L.x1 >= 1000,
          "layout %d %d %d %d x %g..%g", L.left, L.top, L.right, L.bottom, L.x0, L.x1);
    char png[1200], expect[1200], cmd[4000];
    snprintf(png, sizeof png, "%s/plot%s.png", work, log_y ? "-log" : "");
    snprintf(expect, sizeof expect, "%s/plot%s.expect", work, log_y ? "-log" : "");
    CHECK(td_png_write(png, rgb, p.width, p.height, &err) == TD_OK, "%s", err.msg);
    // Expectations: every point of every series (markers for val_loss), and the colour absent at
    // the vertically mirrored position when that is far from the curve and outside the legend.
    FILE *f = fopen(expect, "w");
    int n_absent = 0;
    for (int i = 0; i < 4; i++)
        for (size_t k = 0; k < s[i].n; k++) {
            double v = log_y ? log10(s[i].y[k]) : s[i].y[k];
            double px = L.left + (s[i].x[k] - L.x0) / (L.x1 - L.x0) * (L.right - L.left);
            double py = L.bottom - (v - L.y0) / (L.y1 - L.y0) * (L.bottom - L.top);
            fprintf(f, "%.2f %.2f %06x %s\n", px, py, s[i].rgb, i % 2 ? "marker" : "line");
            double my = L.top + L.bottom - py;
            bool in_legend = px > L.right - 320 && my < L.top + 130;
            if (fabs(my - py) > 40 && !in_legend && k % 5 == 0) {
                fprintf(f, "%.2f %.2f %06x absent\n", px, my, s[i].rgb);
                n_absent++;
            }
        }
    fclose(f);
    CHECK(n_absent > 20, "only %d absence checks", n_absent);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/png_check.py '%s' %d %d '%s'", png,
             p.width, p.height, expect);
    CHECK(sh(cmd) == 0, "%s", cmd);

    // The checker can fail: a wrong colour for the points, and one flipped byte in the file.
    char wrong[1200];
    snprintf(wrong, sizeof wrong, "%s/wrong.expect", work);
    f = fopen(wrong, "w");
    fprintf(f, "%.2f %.2f %06x marker\n", (double)(L.left + L.right) / 2, (double)L.top + 3,
            td_plot_color(2));
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/png_check.py '%s' %d %d '%s' >/dev/null",
             png, p.width, p.height, wrong);
    CHECK(sh(cmd) == 1, "checker accepted a colour that is not there");
    char *buf;
    size_t len;
    if (td_read_file(png, 0, &buf, &len, &err) == TD_OK) {
        char bad[1200];
        snprintf(bad, sizeof bad, "%s/flipped.png", work);
        buf[len / 2] ^= 1;
        f = fopen(bad, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        free(buf);
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 tests/reference/png_check.py '%s' %d %d >/dev/null 2>&1", bad,
                 p.width, p.height);
        CHECK(sh(cmd) != 0, "checker accepted a flipped byte");
    }
    free(rgb);
out:
    td_plot_log_free(l[0]);
    td_plot_log_free(l[1]);
}

static void test_edges(void) {
    td_err err = {0};
    uint8_t *out = NULL, px[3 * 4] = {0};
    size_t len = 0;
    CHECK(td_png_encode(px, 0, 4, &out, &len, &err) == TD_ERR_INVALID && !out, "0 width accepted");
    CHECK(td_png_encode(px, 2, 2, &out, &len, &err) == TD_OK && len > 50, "%s", err.msg);
    free(out);
    CHECK(td_png_write("/nonexistent/dir/x.png", px, 2, 2, &err) == TD_ERR_IO, "bad path: %s", err.msg);

    td_plot_params p = td_plot_default_params();
    uint8_t *rgb = NULL;
    double x[3] = {0, 1, 2}, y[3] = {-1, 0, NAN};
    td_plot_series s = {.label = "s", .x = x, .y = y, .n = 3, .rgb = 0xff0000};
    // Nothing plottable on a log axis (values <= 0 or NaN).
    p.log_y = true;
    CHECK(td_plot_render(&p, &s, 1, &rgb, NULL, &err) == TD_ERR_INVALID && !rgb, "log of <= 0");
    p.log_y = false;
    CHECK(td_plot_render(&p, &s, 0, &rgb, NULL, &err) == TD_ERR_INVALID, "no series accepted");
    p.width = 50;
    CHECK(td_plot_render(&p, &s, 1, &rgb, NULL, &err) == TD_ERR_INVALID, "tiny image accepted");
    // A single point and a constant series render (degenerate ranges widened).
    p.width = 300;
    p.height = 200;
    s.n = 1;
    s.y = x;
    td_plot_layout L;
    CHECK(td_plot_render(&p, &s, 1, &rgb, &L, &err) == TD_OK && rgb && L.x1 > L.x0 && L.y1 > L.y0,
          "single point: %s", err.msg);
    free(rgb);
}

static void test_cli(const char *log_a, const char *log_b) {
    const char *bin = td_test_bin();
    if (!bin) return;
    char cmd[6000], out[1200], errf[1200];
    snprintf(out, sizeof out, "%s/cli.png", work);
    snprintf(errf, sizeof errf, "%s/cli.err", work);
    unlink(out);
    snprintf(cmd, sizeof cmd,
             "'%s' plot '%s' '%s' -o '%s' --title 'CLI plot' --width 640 --height 400 2>'%s'", bin,
             log_a, log_b, out, errf);
    CHECK(sh(cmd) == 0, "%s", cmd);
    char *e = NULL;
    size_t len;
    td_err err;
    if (td_read_file(errf, 0, &e, &len, &err) == TD_OK) {
        CHECK(strstr(e, "skipped 4 malformed lines") != NULL, "warning missing: %s", e);
        free(e);
    }
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/png_check.py '%s' 640 400", out);
    CHECK(sh(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "'%s' plot '%s' -o '%s' --log-y --metric loss 2>/dev/null", bin, log_a, out);
    CHECK(sh(cmd) == 0, "--log-y --metric loss");
    struct {
        const char *args;
        int want;
    } bad[] = {
        {"'%s'", 2},                                            // no -o
        {"-o /tmp/x.png", 2},                                   // no log
        {"'%s' -o %s/x.png --width 10", 2},                     // too small
        {"'%s' -o %s/x.png --bogus", 2},                        // unknown option
        {"/nonexistent.jsonl -o %s/x.png", 1},                  // missing log
        {"'%s' -o %s/x.png --metric nothing_here", 1},          // no values
        {"'%s' -o /nonexistent/dir/x.png", 1},                  // unwritable
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[3000];
        if (strstr(bad[i].args, "'%s'") && strstr(bad[i].args, "%s/"))
            snprintf(args, sizeof args, bad[i].args, log_a, work);
        else if (strstr(bad[i].args, "'%s'"))
            snprintf(args, sizeof args, bad[i].args, log_a);
        else if (strstr(bad[i].args, "%s"))
            snprintf(args, sizeof args, bad[i].args, work);
        else
            snprintf(args, sizeof args, "%s", bad[i].args);
        snprintf(cmd, sizeof cmd, "'%s' plot %s >/dev/null 2>&1", bin, args);
        int rc = sh(cmd);
        CHECK(rc == bad[i].want, "%s: exit %d, want %d", cmd, rc, bad[i].want);
    }
}

int main(void) {
    td_path_join(work, sizeof work, td_test_data_dir(), "plot-test");
    mkdir(td_test_data_dir(), 0755);
    mkdir(work, 0755);
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/run_a.jsonl", work);
    snprintf(b, sizeof b, "%s/run_b.jsonl", work);
    write_log(a, 300);
    write_log(b, 120);
    test_log_read(a);
    test_resume();
    test_render(a, b, false);
    test_render(a, b, true);
    test_edges();
    test_cli(a, b);
    TEST_DONE();
}
