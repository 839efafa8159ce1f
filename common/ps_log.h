/* ps_log.h - one line per event on stderr: time, level, role/id, message.
 *
 * Every process calls ps_log_init() once with its role ("server", "worker",
 * "bench", ...) and id (shard or rank, -1 for none). Thread-safe: each line is
 * written by a single write(2).
 */
#ifndef PS_LOG_H
#define PS_LOG_H

#include <stddef.h>

enum ps_log_level { PS_LOG_DEBUG, PS_LOG_INFO, PS_LOG_WARN, PS_LOG_ERROR, PS_LOG_OFF };

void ps_log_init(const char *role, int id);
void ps_log_set_level(enum ps_log_level lvl);
enum ps_log_level ps_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns -EINVAL otherwise. */
int ps_log_parse_level(const char *s, enum ps_log_level *out);
void ps_log(enum ps_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Copies the len bytes of text (peer-supplied: a refusal's words, say)
 * into out (cap bytes, NUL-terminated, truncated to fit) with every byte
 * that is not printable ASCII, and the backslash, written as \xHH, so a
 * peer cannot put terminal escape sequences or extra lines into a log.
 * NULL text is "". Returns out. */
char *ps_log_escape(char *out, size_t cap, const char *text, size_t len);

#define ps_debug(...) ps_log(PS_LOG_DEBUG, __VA_ARGS__)
#define ps_info(...)  ps_log(PS_LOG_INFO, __VA_ARGS__)
#define ps_warn(...)  ps_log(PS_LOG_WARN, __VA_ARGS__)
#define ps_error(...) ps_log(PS_LOG_ERROR, __VA_ARGS__)

#endif
