// Minimal leveled logging to stderr. Level from TANDEM_LOG (error|warn|info|debug), default info.
#ifndef TD_BASE_LOG_H
#define TD_BASE_LOG_H

typedef enum { TD_LOG_ERROR, TD_LOG_WARN, TD_LOG_INFO, TD_LOG_DEBUG } td_log_level;

void td_log(td_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double td_now(void);  // monotonic seconds

#define TD_LOGE(...) td_log(TD_LOG_ERROR, __VA_ARGS__)
#define TD_LOGW(...) td_log(TD_LOG_WARN, __VA_ARGS__)
#define TD_LOGI(...) td_log(TD_LOG_INFO, __VA_ARGS__)
#define TD_LOGD(...) td_log(TD_LOG_DEBUG, __VA_ARGS__)

#endif
