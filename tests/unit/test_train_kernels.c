// The backward kernels (kernels/backward.h) and RoPE's backward (the forward at negated positions)
// against central differences in double of independent double-precision forwards, on random
// inputs of awkward sizes: d(sum r * op(inputs)) / d input for every input of every op. Also: the
// result does not depend on how the work is split (nth 1 vs 3, bit for bit); the matmul blocking
// gives the plain sums (several blocks of rows and tokens); accumulate flags add; bf16 rounding is
// to nearest even.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backward.h"
#include "kernels/kernels.h"
#include "test_util.h"

static uint64_t rng = 88172645463325252ull;
static double urand(void) {  // xorshift64, uniform in [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static void fill(float *a, int n, double s) {
    for (int i = 0; i < n; i++) a[i] = (float)(s * urand());
}

#define FD_H 1e-6
#define RTOL 1e-4
#define ATOL 1e-5

// A differentiable op in double: loss() reads the inputs in[k][0..n[k]).
typedef struct op {
    double (*loss)(struct op *o);
    double *in[4];
    int n[4];
    int n_in;
    void *ctx;
} op;

// Compares got[n] (f32 kernel gradient of input k) with the central difference of o->loss.
static void check_fd(const char *what, op *o, int k, const float *got) {
    double worst = 0;
    int bad = 0;
    for (int j = 0; j < o->n[k]; j++) {
        double *p = &o->in[k][j], keep = *p;
        *p = keep + FD_H;
        double lp = o->loss(o);
        *p = keep - FD_H;
        double lm = o->loss(o);
        *p = keep;
        double fd = (lp - lm) / (2 * FD_H), d = fabs(fd - got[j]), lim = ATOL + RTOL * fabs(fd);
        if (d > lim) bad++;
        if (d / lim > worst) worst = d / lim;
    }
    CHECK(bad == 0, "%s: %d of %d off (worst %.3g x tolerance)", what, bad, o->n[k], worst);
}

static double *to_d(const float *a, int n) {
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) d[i] = a[i];
    return d;
}

// Runs a kernel as nth slices one after another.
#define RUN(fn, args, nth) \
    for (int i_ = 0; i_ < (nth); i_++) fn((args), i_, (nth))

// ------------------------------------------------------------------ matmul
enum { MN = 5, MO = 7, MI = 13 };
static const double *mm_r;
static double mm_loss(op *o) {
    const double *x = o->in[0], *w = o->in[1], *b = o->in[2];
    double s = 0;
    for (int t = 0; t < MN; t++)
        for (int k = 0; k < MO; k++) {
            double y = b[k];
            for (int i = 0; i < MI; i++) y += x[t * MI + i] * w[k * MI + i];
            s += mm_r[t * MO + k] * y;
        }
    return s;
}

static void test_matmul(void) {
    float x[MN * MI], w[MO * MI], b[MO], dy[MN * MO], dx[MN * MI], dw[MO * MI], db[MO],
        pre[MN * MI];
    fill(x, MN * MI, 1), fill(w, MO * MI, 1), fill(b, MO, 1), fill(dy, MN * MO, 1),
        fill(pre, MN * MI, 1);
    double *r = to_d(dy, MN * MO);
    mm_r = r;
    op o = {.loss = mm_loss,
            .in = {to_d(x, MN * MI), to_d(w, MO * MI), to_d(b, MO)},
            .n = {MN * MI, MO * MI, MO}};
    memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
    td_mm_bwd_args a = {.w = w,
                        .x = x,
                        .dy = dy,
                        .dx = dx,
                        .dw = dw,
                        .db = db,
                        .n_tok = MN,
                        .n_out = MO,
                        .n_in = MI};
    RUN(td_ref_mm_bwd_x, &a, 1);
    RUN(td_ref_mm_bwd_w, &a, 1);
    check_fd("matmul dx", &o, 0, dx);
    check_fd("matmul dw", &o, 1, dw);
    check_fd("matmul db", &o, 2, db);
    // split invariance and accumulation
    float dx3[MN * MI], dw3[MO * MI], db3[MO];
    memcpy(dx3, pre, sizeof pre), memset(dw3, 0, sizeof dw3), memset(db3, 0, sizeof db3);
    td_mm_bwd_args a3 = a;
    a3.dx = dx3, a3.dw = dw3, a3.db = db3, a3.accumulate = 1;
    RUN(td_ref_mm_bwd_x, &a3, 3);
    RUN(td_ref_mm_bwd_w, &a3, 3);
    int same = !memcmp(dw, dw3, sizeof dw) && !memcmp(db, db3, sizeof db), acc = 1;
    for (int i = 0; i < MN * MI; i++)
        acc &= fabsf(dx3[i] - (pre[i] + dx[i])) <= 1e-6f * (1 + fabsf(dx3[i]));
    CHECK(same, "matmul backward depends on the split");
    CHECK(acc, "matmul dx accumulate does not add");
    // Blocking: n_in large enough for several blocks of rows/tokens gives the unblocked sums.
    {
        enum { BN = 3, BO = 5, BI = 9000 };  // 16384 / 9000: one row per block
        float *bx = malloc(sizeof(float) * BN * BI), *bw = malloc(sizeof(float) * BO * BI),
              bdy[BN * BO];
        float *bdx = malloc(sizeof(float) * BN * BI), *bdw = calloc(BO * BI, sizeof(float));
        fill(bx, BN * BI, 1), fill(bw, BO * BI, 1), fill(bdy, BN * BO, 1);
        td_mm_bwd_args ba = {.w = bw,
                             .x = bx,
                             .dy = bdy,
                             .dx = bdx,
                             .dw = bdw,
                             .n_tok = BN,
                             .n_out = BO,
                             .n_in = BI};
        RUN(td_ref_mm_bwd_x, &ba, 2);
        RUN(td_ref_mm_bwd_w, &ba, 2);
        int ok = 1;
        for (int t = 0; t < BN; t++)
            for (int i = 0; i < BI; i += 97) {
                double s = 0, m = 0;
                for (int k = 0; k < BO; k++)
                    s += (double)bdy[t * BO + k] * bw[(size_t)k * BI + i],
                        m += fabs((double)bdy[t * BO + k] * bw[(size_t)k * BI + i]);
                ok &= fabs(s - bdx[(size_t)t * BI + i]) <= 1e-6 * m;
            }
        for (int k = 0; k < BO; k++)
            for (int i = 0; i < BI; i += 89) {
                double s = 0, m = 0;
                for (int t = 0; t < BN; t++)
                    s += (double)bdy[t * BO + k] * bx[(size_t)t * BI + i],
                        m += fabs((double)bdy[t * BO + k] * bx[(size_t)t * BI + i]);
                ok &= fabs(s - bdw[(size_t)k * BI + i]) <= 1e-6 * m;
            }
        CHECK(ok, "blocked matmul backward differs from the plain sums");
        free(bx), free(bw), free(bdx), free(bdw);
    }
    // bf16 rounding: nearest even, in place or not, specials unchanged.
    CHECK(td_round_bf16(1.0f + 1.0f / 512) == 1.0f &&
              td_round_bf16(1.0f + 3.0f / 512) == 1.0f + 1.0f / 128 &&
              td_round_bf16(1.0f + 1.5f / 256) == 1.0f + 1.0f / 128 &&
              td_round_bf16(-3.0f) == -3.0f && isinf(td_round_bf16(INFINITY)) &&
              isnan(td_round_bf16(NAN)),
          "bf16 rounding is not nearest-even");
    float rx[37], ry[37];
    fill(rx, 37, 100);
    td_round_bf16_args ra = {.x = rx, .y = ry, .n = 37};
    RUN(td_ref_round_bf16, &ra, 3);
    int rok = 1;
    for (int i = 0; i < 37; i++) {
        uint32_t u;
        memcpy(&u, &ry[i], 4);
        rok &= (u & 0xffff) == 0 && fabsf(ry[i] - rx[i]) <= fabsf(rx[i]) / 256;
    }
    CHECK(rok, "round_bf16 kernel");
    free(r), free(o.in[0]), free(o.in[1]), free(o.in[2]);
}

// ------------------------------------------------------------------ RMSNorm
enum { RR = 6, RNN = 11 };
static const double *rn_r;
static double rn_loss(op *o) {
    const double *x = o->in[0], *w = o->in[1];
    double s = 0;
    for (int r = 0; r < RR; r++) {
        double ss = 0;
        for (int i = 0; i < RNN; i++) ss += x[r * RNN + i] * x[r * RNN + i];
        double rs = 1 / sqrt(ss / RNN + 1e-5);
        for (int i = 0; i < RNN; i++) s += rn_r[r * RNN + i] * x[r * RNN + i] * rs * w[i];
    }
    return s;
}

static void test_rmsnorm(void) {
    float x[RR * RNN], w[RNN], dy[RR * RNN], dx[RR * RNN], dw[RNN], rstd[RR];
    fill(x, RR * RNN, 2), fill(w, RNN, 1), fill(dy, RR * RNN, 1);
    double *r = to_d(dy, RR * RNN);
    rn_r = r;
    op o = {.loss = rn_loss, .in = {to_d(x, RR * RNN), to_d(w, RNN)}, .n = {RR * RNN, RNN}};
    memset(dw, 0, sizeof dw);
    td_rmsnorm_bwd_args a = {.x = x,
                             .w = w,
                             .dy = dy,
                             .dx = dx,
                             .dw = dw,
                             .rstd = rstd,
                             .n_rows = RR,
                             .n = RNN,
                             .eps = 1e-5f};
    RUN(td_ref_rmsnorm_bwd_x, &a, 1);
    RUN(td_ref_rmsnorm_bwd_w, &a, 1);
    check_fd("rmsnorm dx", &o, 0, dx);
    check_fd("rmsnorm dw", &o, 1, dw);
    float dx3[RR * RNN], dw3[RNN];
    memset(dw3, 0, sizeof dw3);
    td_rmsnorm_bwd_args a3 = a;
    a3.dx = dx3, a3.dw = dw3;
    RUN(td_ref_rmsnorm_bwd_x, &a3, 3);
    RUN(td_ref_rmsnorm_bwd_w, &a3, 4);
    CHECK(!memcmp(dx, dx3, sizeof dx) && !memcmp(dw, dw3, sizeof dw),
          "rmsnorm backward depends on the split");
    free(r), free(o.in[0]), free(o.in[1]);
}

// ------------------------------------------------------------------ attention
enum { AS = 2, AT = 5, AH = 4, AKV = 2, AD = 6 };
#define AQN (AS * AT * AH * AD)
#define AKN (AS * AT * AKV * AD)
static const double *at_r;
static void att_fwd(const double *q, const double *k, const double *v, double *out) {
    const double scale = 1 / sqrt((double)AD);
    for (int b = 0; b < AS; b++)
        for (int t = 0; t < AT; t++)
            for (int h = 0; h < AH; h++) {
                const double *qq = q + ((b * AT + t) * AH + h) * AD;
                const int kh = h / (AH / AKV);
                double s[AT], m = -1e300, l = 0;
                for (int j = 0; j <= t; j++) {
                    s[j] = 0;
                    for (int i = 0; i < AD; i++)
                        s[j] += qq[i] * k[((b * AT + j) * AKV + kh) * AD + i];
                    s[j] *= scale;
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= t; j++) l += exp(s[j] - m);
                double *oo = out + ((b * AT + t) * AH + h) * AD;
                for (int i = 0; i < AD; i++) {
                    oo[i] = 0;
                    for (int j = 0; j <= t; j++)
                        oo[i] += exp(s[j] - m) / l * v[((b * AT + j) * AKV + kh) * AD + i];
                }
            }
}
static double att_loss(op *o) {
    static double out[AQN];
    att_fwd(o->in[0], o->in[1], o->in[2], out);
    double s = 0;
    for (int i = 0; i < AQN; i++) s += at_r[i] * out[i];
    return s;
}

static void test_attention(void) {
    static float q[AQN], k[AKN], v[AKN], out[AQN], dout[AQN], dq[AQN], dk[AKN], dv[AKN];
    static float scratch[3 * AT];
    fill(q, AQN, 1.5), fill(k, AKN, 1.5), fill(v, AKN, 1), fill(dout, AQN, 1);
    op o = {
        .loss = att_loss, .in = {to_d(q, AQN), to_d(k, AKN), to_d(v, AKN)}, .n = {AQN, AKN, AKN}};
    double outd[AQN];
    att_fwd(o.in[0], o.in[1], o.in[2], outd);
    for (int i = 0; i < AQN; i++) out[i] = (float)outd[i];
    double *r = to_d(dout, AQN);
    at_r = r;
    td_attention_bwd_args a = {.q = q,
                               .k = k,
                               .v = v,
                               .out = out,
                               .dout = dout,
                               .scratch = scratch,
                               .dq = dq,
                               .dk = dk,
                               .dv = dv,
                               .n_seq = AS,
                               .seq_len = AT,
                               .n_heads = AH,
                               .n_kv_heads = AKV,
                               .head_dim = AD,
                               .scale = 1.0f / sqrtf((float)AD)};
    RUN(td_ref_attention_bwd, &a, 1);
    check_fd("attention dq", &o, 0, dq);
    check_fd("attention dk", &o, 1, dk);
    check_fd("attention dv", &o, 2, dv);
    static float dq3[AQN], dk3[AKN], dv3[AKN];
    td_attention_bwd_args a3 = a;
    a3.dq = dq3, a3.dk = dk3, a3.dv = dv3;
    RUN(td_ref_attention_bwd, &a3, 3);
    CHECK(!memcmp(dq, dq3, sizeof dq) && !memcmp(dk, dk3, sizeof dk) && !memcmp(dv, dv3, sizeof dv),
          "attention backward depends on the split");
    free(r), free(o.in[0]), free(o.in[1]), free(o.in[2]);
}

// ------------------------------------------------------------------ RoPE (backward = forward at
// -pos)
enum { PT = 4, PH = 3, PD = 10 };
#define PN (PT * PH * PD)
static const double *rp_r;
static double rp_inv[PD / 2];
static int rp_neox;
static double rope_loss(op *o) {
    const double *x = o->in[0];
    double s = 0;
    for (int t = 0; t < PT; t++)
        for (int h = 0; h < PH; h++)
            for (int i = 0; i < PD / 2; i++) {
                const double ang = (t + 3) * rp_inv[i], c = cos(ang), sn = sin(ang);
                const int i0 = rp_neox ? i : 2 * i, i1 = rp_neox ? i + PD / 2 : 2 * i + 1;
                const double x0 = x[(t * PH + h) * PD + i0], x1 = x[(t * PH + h) * PD + i1];
                s += rp_r[(t * PH + h) * PD + i0] * (x0 * c - x1 * sn) +
                     rp_r[(t * PH + h) * PD + i1] * (x1 * c + x0 * sn);
            }
    return s;
}

static void test_rope(void) {
    for (rp_neox = 0; rp_neox <= 1; rp_neox++) {
        float x[PN], dy[PN];
        int32_t neg[PT];
        fill(x, PN, 1), fill(dy, PN, 1);
        for (int i = 0; i < PD / 2; i++) rp_inv[i] = pow(10000.0, -2.0 * i / PD);
        for (int t = 0; t < PT; t++) neg[t] = -(t + 3);
        double *r = to_d(dy, PN);
        rp_r = r;
        op o = {.loss = rope_loss, .in = {to_d(x, PN)}, .n = {PN}};
        td_rope_args a = {.x = dy,
                          .pos = neg,
                          .inv_freq = rp_inv,
                          .n_tok = PT,
                          .n_heads = PH,
                          .head_dim = PD,
                          .neox = rp_neox};
        td_kernels_ref.rope(&a, 0, 1);  // dx = R(-pos) dy = R(pos)^T dy
        check_fd(rp_neox ? "rope backward (neox)" : "rope backward (adjacent pairs)", &o, 0, dy);
        free(r), free(o.in[0]);
    }
}

// ------------------------------------------------------------------ SwiGLU, embedding,
// cross-entropy
enum { SN = 37 };
static const double *sw_r;
static double sw_loss(op *o) {
    double s = 0;
    for (int i = 0; i < SN; i++) {
        const double g = o->in[0][i];
        s += sw_r[i] * g / (1 + exp(-g)) * o->in[1][i];
    }
    return s;
}

static void test_swiglu(void) {
    float g[SN], u[SN], dh[SN], dg[SN], du[SN];
    fill(g, SN, 4), fill(u, SN, 2), fill(dh, SN, 1);
    double *r = to_d(dh, SN);
    sw_r = r;
    op o = {.loss = sw_loss, .in = {to_d(g, SN), to_d(u, SN)}, .n = {SN, SN}};
    td_swiglu_bwd_args a = {.gate = g, .up = u, .dh = dh, .dgate = dg, .dup = du, .n = SN};
    RUN(td_ref_swiglu_bwd, &a, 3);
    check_fd("swiglu dgate", &o, 0, dg);
    check_fd("swiglu dup", &o, 1, du);
    free(r), free(o.in[0]), free(o.in[1]);
}

enum { EV = 9, ED = 7, EN = 12 };
static void test_embed(void) {
    const int32_t tok[EN] = {3, 1, 3, 8, 0, 3, 5, 1, 8, 2, 2, 3};
    float dy[EN * ED], dt[EV * ED], dt3[EV * ED];
    fill(dy, EN * ED, 1);
    fill(dt, EV * ED, 1);
    memcpy(dt3, dt, sizeof dt);
    double want[EV * ED];
    for (int i = 0; i < EV * ED; i++) want[i] = dt[i];
    for (int t = 0; t < EN; t++)
        for (int i = 0; i < ED; i++) want[tok[t] * ED + i] += dy[t * ED + i];
    td_embed_bwd_args a = {.tokens = tok, .dy = dy, .dtable = dt, .n_tok = EN, .dim = ED};
    RUN(td_ref_embed_bwd, &a, 1);
    a.dtable = dt3;
    RUN(td_ref_embed_bwd, &a, 3);
    double e = 0;
    for (int i = 0; i < EV * ED; i++) e = fmax(e, fabs(dt[i] - want[i]));
    CHECK(e < 1e-6, "embedding backward err %g", e);
    CHECK(!memcmp(dt, dt3, sizeof dt), "embedding backward depends on the split");
}

enum { XN = 5, XV = 11 };
static const int32_t x_tgt[XN] = {3, -1, 10, 0, 3};
static double xent_loss(op *o) {
    double s = 0;
    for (int t = 0; t < XN; t++) {
        if (x_tgt[t] < 0) continue;
        const double *z = o->in[0] + t * XV;
        double m = z[0], l = 0;
        for (int i = 1; i < XV; i++) m = fmax(m, z[i]);
        for (int i = 0; i < XV; i++) l += exp(z[i] - m);
        s += m + log(l) - z[x_tgt[t]];
    }
    return s * 0.25;
}

static void test_xent(void) {
    float z[XN * XV], loss[XN], z3[XN * XV], loss3[XN];
    fill(z, XN * XV, 5);
    memcpy(z3, z, sizeof z);
    op o = {.loss = xent_loss, .in = {to_d(z, XN * XV)}, .n = {XN * XV}};
    double want = xent_loss(&o) / 0.25, got = 0;
    td_xent_args a = {.logits = z,
                      .targets = x_tgt,
                      .loss = loss,
                      .n_tok = XN,
                      .vocab = XV,
                      .dscale = 0.25f,
                      .want_grad = 1};
    RUN(td_ref_xent, &a, 1);
    for (int t = 0; t < XN; t++) got += loss[t];
    CHECK_NEAR(got, want, 1e-5, "cross-entropy loss");
    CHECK(loss[1] == 0.0f, "ignored target has a loss");
    check_fd("cross-entropy dlogits", &o, 0, z);
    a.logits = z3, a.loss = loss3;
    RUN(td_ref_xent, &a, 2);
    CHECK(!memcmp(z, z3, sizeof z), "cross-entropy depends on the split");
    free(o.in[0]);
}

int main(void) {
    test_matmul();
    test_rmsnorm();
    test_attention();
    test_rope();
    test_swiglu();
    test_embed();
    test_xent();
    TEST_DONE();
}
