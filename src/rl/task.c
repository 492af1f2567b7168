// The built-in RL tasks behind task.h: "addition" (problems generated from a hash of (seed, split,
// index), scored in process) and "file" (problems from a JSON-lines file, scored by an external
// command started once per score call). Not here: sampling or anything that needs a model.
#define _GNU_SOURCE  // pipe2
#include "rl/task.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/rng.h"

td_rl_task_params td_rl_task_default_params(void) {
    td_rl_task_params p;
    memset(&p, 0, sizeof p);
    p.name = "addition";
    p.seed = 1;
    p.min_digits = 4;
    p.max_digits = 6;
    p.scorer_timeout_ms = 30000;
    p.eval_every = 10;
    return p;
}

// ---- addition

typedef struct add_ctx {
    uint64_t seed;
    int min_digits, max_digits;
} add_ctx;

// Which split a pair (a, b) belongs to: one bit of a fixed hash of the pair alone (not of the task
// seed), so no train problem of any seed is an eval problem of any seed.
static int add_pair_split(uint64_t a, uint64_t b) {
    return (int)(td_mix64(td_mix64(a ^ 0x5eed0add1710115full) ^ b) >> 63);
}

static uint64_t add_operand(td_rng *r, int digits) {
    uint64_t lo = 1;
    for (int i = 1; i < digits; i++) lo *= 10;
    uint64_t hi = lo * 10 - 1;
    if (digits == 1) lo = 1;  // no zero operand (1-digit operands are 1..9)
    return (uint64_t)td_rng_int(r, (long)lo, (long)hi);
}

static td_status add_problem(void *ctx, td_rl_split split, uint64_t index, td_rl_problem *out, td_err *err) {
    const add_ctx *c = ctx;
    if (split != TD_RL_SPLIT_TRAIN && split != TD_RL_SPLIT_EVAL)
        return td_err_set(err, TD_ERR_INVALID, "addition: unknown split %d", (int)split);
    // Rejection sampling on the pair's split bit: about two draws on average; 200 failures in a
    // row has probability 2^-200, so the cap only guards against a broken hash.
    uint64_t h = td_mix64(td_mix64(td_mix64(c->seed) ^ (uint64_t)split) ^ index);
    for (int attempt = 0; attempt < 200; attempt++) {
        td_rng r;
        td_rng_seed(&r, h + (uint64_t)attempt);
        int la = (int)td_rng_int(&r, c->min_digits, c->max_digits);
        int lb = (int)td_rng_int(&r, c->min_digits, c->max_digits);
        uint64_t a = add_operand(&r, la), b = add_operand(&r, lb);
        if (add_pair_split(a, b) != (int)split) continue;
        snprintf(out->prompt, sizeof out->prompt, "%llu+%llu=", (unsigned long long)a, (unsigned long long)b);
        snprintf(out->answer, sizeof out->answer, "%llu", (unsigned long long)(a + b));
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_INVALID, "addition: no problem of split %d at index %llu", (int)split,
                      (unsigned long long)index);
}

double td_rl_addition_reward(const char *answer, const char *completion, size_t len) {
    if (!completion) return 0;
    size_t al = answer ? strlen(answer) : 0;
    if (answer && len == al && !memcmp(answer, completion, len)) return 1.0;
    if (len < 1 || len > 12) return 0;
    for (size_t i = 0; i < len; i++)
        if (completion[i] < '0' || completion[i] > '9') return 0;
    if (len > 1 && completion[0] == '0') return 0;
    return 0.1;
}

static td_status add_score(void *ctx, const td_rl_problem *const *problems, const char *const *completions,
                           const size_t *lens, int n, double *rewards, td_err *err) {
    for (int i = 0; i < n; i++) rewards[i] = td_rl_addition_reward(problems[i]->answer, completions[i], lens[i]);
    return TD_OK;
}

static void add_free(void *ctx) { free(ctx); }

static const td_rl_task_vt ADD_VT = {
    .name = "addition",
    .problem = add_problem,
    .score = add_score,
    .free = add_free,
};

// ---- file

typedef struct file_ctx {
    td_rl_problem *items[2];  // [n[split]] problems of each split, in file order
    size_t n[2];
    char *path;     // for messages
    char *scorer;   // sh -c command
    char *stop;
    int timeout_ms;
} file_ctx;

static void file_free(void *ctx) {
    file_ctx *c = ctx;
    if (!c) return;
    free(c->items[0]), free(c->items[1]);
    free(c->path), free(c->scorer), free(c->stop);
    free(c);
}

static td_status file_problem(void *ctx, td_rl_split split, uint64_t index, td_rl_problem *out, td_err *err) {
    const file_ctx *c = ctx;
    if (split != TD_RL_SPLIT_TRAIN && split != TD_RL_SPLIT_EVAL)
        return td_err_set(err, TD_ERR_INVALID, "%s: unknown split %d", c->path, (int)split);
    size_t n = c->n[split];
    if (!n)
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: the %s split is empty", c->path,
                          split == TD_RL_SPLIT_EVAL ? "eval" : "train");
    if (split == TD_RL_SPLIT_EVAL && index >= n)
        return td_err_set(err, TD_ERR_LIMIT, "%s: only %zu eval problems (asked for index %llu)", c->path, n,
                          (unsigned long long)index);
    *out = c->items[split][index % n];  // the train split repeats (epochs)
    return TD_OK;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

// Builds the scorer's input: one JSON object per completion and line.
static char *scorer_input(const td_rl_problem *const *problems, const char *const *completions,
                          const size_t *lens, int n, size_t *len, td_err *err) {
    size_t cap = 4096, used = 0;
    char *buf = malloc(cap);
    if (!buf) goto nomem;
    for (int i = 0; i < n; i++) {
        char *comp = malloc(lens[i] + 1);
        if (!comp) goto nomem;
        memcpy(comp, completions[i], lens[i]);
        comp[lens[i]] = 0;  // an embedded NUL ends the text (cJSON strings are C strings)
        cJSON *o = cJSON_CreateObject();
        if (o) {
            cJSON_AddStringToObject(o, "prompt", problems[i]->prompt);
            cJSON_AddStringToObject(o, "answer", problems[i]->answer);
            cJSON_AddStringToObject(o, "completion", comp);
        }
        free(comp);
        char *s = o ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        if (!s) goto nomem;
        size_t sl = strlen(s);
        if (used + sl + 1 > cap) {
            while (used + sl + 1 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(s);
                goto nomem;
            }
            buf = nb;
        }
        memcpy(buf + used, s, sl);
        buf[used + sl] = '\n';
        used += sl + 1;
        free(s);
    }
    *len = used;
    return buf;
nomem:
    free(buf);
    td_err_set(err, TD_ERR_NOMEM, "scorer: out of memory building its input");
    return NULL;
}

// Parses the scorer's output: exactly n lines, each one finite number in [0, 1].
static td_status scorer_parse(const file_ctx *c, char *out, size_t len, int n, double *rewards, td_err *err) {
    size_t i = 0;
    int line = 0;
    while (i < len) {
        char *nl = memchr(out + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - out) : len;
        out[e] = 0;
        line++;
        if (line > n)
            return td_err_set(err, TD_ERR_FORMAT, "scorer `%s`: more than %d lines of output (line %d: \"%.40s\")",
                              c->scorer, n, line, out + i);
        char *s = out + i, *end;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        errno = 0;
        double v = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\r') end++;
        if (end == s || *end || errno == ERANGE || !isfinite(v) || v < 0 || v > 1)
            return td_err_set(err, TD_ERR_FORMAT,
                              "scorer `%s`: output line %d is \"%.40s\", not a number in [0, 1]", c->scorer, line,
                              out + i);
        rewards[line - 1] = v;
        i = e + 1;
    }
    if (line != n)
        return td_err_set(err, TD_ERR_FORMAT, "scorer `%s`: %d lines of output for %d completions", c->scorer, line,
                          n);
    return TD_OK;
}

static void kill_wait(pid_t pid) {
    kill(-pid, SIGKILL);  // its process group: sh and whatever it started
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

// One scoring call: sh -c scorer with the input on stdin (a socket, written with MSG_NOSIGNAL so a
// scorer that exits early cannot raise SIGPIPE here), stdout read through a pipe, both polled
// against one deadline; then the exit status is awaited within the same deadline.
static td_status file_score(void *ctx, const td_rl_problem *const *problems, const char *const *completions,
                            const size_t *lens, int n, double *rewards, td_err *err) {
    file_ctx *c = ctx;
    if (n <= 0) return TD_OK;
    if (!c->scorer || !*c->scorer) return td_err_set(err, TD_ERR_INVALID, "%s: no scorer command", c->path);
    size_t in_len = 0;
    char *in = scorer_input(problems, completions, lens, n, &in_len, err);
    if (!in) return TD_ERR_NOMEM;
    size_t out_cap = 4096, out_len = 0, out_max = (size_t)n * 64 + 4096;  // bytes; a hard cap on output
    char *out = malloc(out_cap + 1);
    int sv[2] = {-1, -1}, po[2] = {-1, -1};
    td_status st = TD_OK;
    if (!out) {
        free(in);
        return td_err_set(err, TD_ERR_NOMEM, "scorer: out of memory");
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) || pipe2(po, O_CLOEXEC)) {
        st = td_err_set(err, TD_ERR_IO, "scorer: socketpair/pipe: %s", strerror(errno));
        goto out;
    }
    double deadline = mono_ms() + c->timeout_ms;
    pid_t pid = fork();
    if (pid < 0) {
        st = td_err_set(err, TD_ERR_IO, "scorer: fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {  // child: async-signal-safe calls only
        setpgid(0, 0);
        dup2(sv[1], 0);
        dup2(po[1], 1);
        signal(SIGPIPE, SIG_DFL);
        execl("/bin/sh", "sh", "-c", c->scorer, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);  // also here, so the group exists whichever runs first
    close(sv[1]), sv[1] = -1;
    close(po[1]), po[1] = -1;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
    size_t in_off = 0;
    bool out_eof = false, in_broken = false;
    while (!out_eof) {
        double left = deadline - mono_ms();
        if (left <= 0) {
            kill_wait(pid);
            st = td_err_set(err, TD_ERR_TIMEOUT, "scorer `%s`: no complete answer within %d ms (%zu bytes read)",
                            c->scorer, c->timeout_ms, out_len);
            goto out;
        }
        struct pollfd pf[2] = {{.fd = po[0], .events = POLLIN}, {.fd = sv[0], .events = POLLOUT}};
        int npf = sv[0] >= 0 ? 2 : 1;
        int r = poll(pf, (nfds_t)npf, (int)left + 1);
        if (r < 0 && errno != EINTR) {
            kill_wait(pid);
            st = td_err_set(err, TD_ERR_IO, "scorer: poll: %s", strerror(errno));
            goto out;
        }
        if (r <= 0) continue;
        if (npf == 2 && (pf[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(sv[0], in + in_off, in_len - in_off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) in_off += (size_t)w;
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                in_broken = true;  // the scorer stopped reading (EPIPE): stop writing
            if (in_broken || in_off == in_len) {
                close(sv[0]);  // EOF on its stdin (or no more writing)
                sv[0] = -1;
            }
        }
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (out_len == out_cap) {
                if (out_cap >= out_max) {
                    kill_wait(pid);
                    st = td_err_set(err, TD_ERR_LIMIT, "scorer `%s`: more than %zu bytes of output for %d completions",
                                    c->scorer, out_max, n);
                    goto out;
                }
                out_cap *= 2;
                char *nb = realloc(out, out_cap + 1);
                if (!nb) {
                    kill_wait(pid);
                    st = td_err_set(err, TD_ERR_NOMEM, "scorer: out of memory");
                    goto out;
                }
                out = nb;
            }
            ssize_t rd = read(po[0], out + out_len, out_cap - out_len);
            if (rd > 0) out_len += (size_t)rd;
            else if (rd == 0) out_eof = true;
            else if (errno != EAGAIN && errno != EINTR) out_eof = true;
        }
    }
    // Its stdout is closed: it has exited or is about to. Wait for the status within the deadline.
    int wst = 0;
    for (;;) {
        pid_t w = waitpid(pid, &wst, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            st = td_err_set(err, TD_ERR_IO, "scorer: waitpid: %s", strerror(errno));
            goto out;
        }
        if (mono_ms() > deadline) {
            kill_wait(pid);
            st = td_err_set(err, TD_ERR_TIMEOUT, "scorer `%s`: closed its output but did not exit within %d ms",
                            c->scorer, c->timeout_ms);
            goto out;
        }
        usleep(1000);
    }
    if (WIFSIGNALED(wst)) {
        st = td_err_set(err, TD_ERR_IO, "scorer `%s`: killed by signal %d", c->scorer, WTERMSIG(wst));
        goto out;
    }
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        st = td_err_set(err, TD_ERR_IO, "scorer `%s`: exited with status %d after %zu bytes of output", c->scorer,
                        WIFEXITED(wst) ? WEXITSTATUS(wst) : -1, out_len);
        goto out;
    }
    if (in_broken) {
        st = td_err_set(err, TD_ERR_IO, "scorer `%s`: stopped reading its input after %zu of %zu bytes", c->scorer,
                        in_off, in_len);
        goto out;
    }
    out[out_len] = 0;
    st = scorer_parse(c, out, out_len, n, rewards, err);
out:
    if (sv[0] >= 0) close(sv[0]);
    if (sv[1] >= 0) close(sv[1]);
    if (po[0] >= 0) close(po[0]);
    if (po[1] >= 0) close(po[1]);
    free(in);
    free(out);
    return st;
}

static const td_rl_task_vt FILE_VT = {
    .name = "file",
    .problem = file_problem,
    .score = file_score,
    .free = file_free,
};

// Reads the prompts file: non-blank lines are records; record r (1-based) goes to eval when
// r % eval_every == 0.
static td_status file_load(file_ctx *c, int eval_every, td_err *err) {
    char *text = NULL;
    size_t len = 0;
    td_status st = td_read_file(c->path, 0, &text, &len, err);
    if (st) return st;
    size_t cap[2] = {0, 0};
    size_t i = 0, rec = 0;
    int line = 0;
    while (i < len && !st) {
        char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        line++;
        text[e] = 0;
        const char *s = text + i;
        i = e + 1;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (!*s) continue;
        cJSON *o = cJSON_Parse(s);
        const cJSON *pr = o ? cJSON_GetObjectItemCaseSensitive(o, "prompt") : NULL;
        const cJSON *an = o ? cJSON_GetObjectItemCaseSensitive(o, "answer") : NULL;
        if (!o || !cJSON_IsObject(o)) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s:%d: not a JSON object", c->path, line);
        } else if (!cJSON_IsString(pr) || !cJSON_IsString(an)) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s:%d: needs string fields \"prompt\" and \"answer\"", c->path,
                            line);
        } else if (!*pr->valuestring) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s:%d: empty prompt", c->path, line);
        } else if (strlen(pr->valuestring) >= TD_RL_PROMPT_CAP || strlen(an->valuestring) >= TD_RL_ANSWER_CAP) {
            st = td_err_set(err, TD_ERR_LIMIT, "%s:%d: prompt over %d bytes or answer over %d bytes", c->path, line,
                            TD_RL_PROMPT_CAP - 1, TD_RL_ANSWER_CAP - 1);
        } else {
            rec++;
            int sp = rec % (size_t)eval_every == 0 ? TD_RL_SPLIT_EVAL : TD_RL_SPLIT_TRAIN;
            if (c->n[sp] == cap[sp]) {
                size_t nc = cap[sp] ? cap[sp] * 2 : 64;
                td_rl_problem *ni = realloc(c->items[sp], nc * sizeof *ni);
                if (!ni) st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", c->path);
                else c->items[sp] = ni, cap[sp] = nc;
            }
            if (!st) {
                td_rl_problem *p = &c->items[sp][c->n[sp]++];
                memset(p, 0, sizeof *p);
                strcpy(p->prompt, pr->valuestring);
                strcpy(p->answer, an->valuestring);
            }
        }
        cJSON_Delete(o);
    }
    free(text);
    if (!st && rec == 0) st = td_err_set(err, TD_ERR_FORMAT, "%s: no problems", c->path);
    return st;
}

// ---- creation

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

td_status td_rl_task_create(const td_rl_task_params *p, td_rl_task *out, td_err *err) {
    if (!out) return td_err_set(err, TD_ERR_INVALID, "task: no output");
    memset(out, 0, sizeof *out);
    td_rl_task_params d = td_rl_task_default_params();
    if (!p) p = &d;
    const char *name = p->name ? p->name : "addition";
    if (!strcmp(name, "addition")) {
        int lo = p->min_digits ? p->min_digits : 4, hi = p->max_digits ? p->max_digits : 6;
        if (lo < 1 || hi > TD_RL_ADDITION_MAX_DIGITS || lo > hi)
            return td_err_set(err, TD_ERR_INVALID,
                              "addition: operand digits must satisfy 1 <= min (%d) <= max (%d) <= %d", lo, hi,
                              TD_RL_ADDITION_MAX_DIGITS);
        add_ctx *c = malloc(sizeof *c);
        if (!c) return td_err_set(err, TD_ERR_NOMEM, "addition: out of memory");
        c->seed = p->seed;
        c->min_digits = lo;
        c->max_digits = hi;
        out->vt = &ADD_VT;
        out->ctx = c;
        out->stop = "\n";
        return TD_OK;
    }
    if (!strcmp(name, "file")) {
        if (!p->prompts || !*p->prompts) return td_err_set(err, TD_ERR_INVALID, "file task: no prompts file");
        if (!p->scorer || !*p->scorer) return td_err_set(err, TD_ERR_INVALID, "file task: no scorer command");
        int every = p->eval_every > 0 ? p->eval_every : 10;
        if (p->scorer_timeout_ms < 0)
            return td_err_set(err, TD_ERR_INVALID, "file task: scorer timeout %d ms", p->scorer_timeout_ms);
        file_ctx *c = calloc(1, sizeof *c);
        if (!c) return td_err_set(err, TD_ERR_NOMEM, "file task: out of memory");
        c->path = dup_str(p->prompts);
        c->scorer = dup_str(p->scorer);
        c->stop = dup_str(p->stop && *p->stop ? p->stop : "\n");
        c->timeout_ms = p->scorer_timeout_ms > 0 ? p->scorer_timeout_ms : 30000;
        if (!c->path || !c->scorer || !c->stop) {
            file_free(c);
            return td_err_set(err, TD_ERR_NOMEM, "file task: out of memory");
        }
        td_status st = file_load(c, every, err);
        if (st) {
            file_free(c);
            return st;
        }
        out->vt = &FILE_VT;
        out->ctx = c;
        out->stop = c->stop;
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_INVALID, "unknown task \"%s\" (addition or file)", name);
}

void td_rl_task_free(td_rl_task *t) {
    if (!t) return;
    if (t->vt && t->vt->free) t->vt->free(t->ctx);
    memset(t, 0, sizeof *t);
}
