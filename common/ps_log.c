/* ps_log.c - timestamped one-line logs on stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include "ps_err.h"
#include "ps_log.h"

static char g_role[32] = "ps";
static int g_id = -1;
static enum ps_log_level g_level = PS_LOG_INFO;

static const char *const level_names[] = { "debug", "info", "warn", "error", "off" };

void ps_log_init(const char *role, int id)
{
	snprintf(g_role, sizeof(g_role), "%s", role ? role : "ps");
	g_id = id;
}

void ps_log_set_level(enum ps_log_level lvl) { g_level = lvl; }
enum ps_log_level ps_log_get_level(void) { return g_level; }

int ps_log_parse_level(const char *s, enum ps_log_level *out)
{
	for (int i = 0; i <= PS_LOG_OFF; i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum ps_log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

void ps_log(enum ps_log_level lvl, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	size_t n;
	va_list ap;

	if (lvl < g_level || lvl >= PS_LOG_OFF)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	if (g_id >= 0)
		n += snprintf(line + n, sizeof(line) - n, ".%03ldZ %-5s %s[%d] ",
			      ts.tv_nsec / 1000000, level_names[lvl], g_role, g_id);
	else
		n += snprintf(line + n, sizeof(line) - n, ".%03ldZ %-5s %s ",
			      ts.tv_nsec / 1000000, level_names[lvl], g_role);
	va_start(ap, fmt);
	if (n < sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (n >= sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, n);
}

char *ps_log_escape(char *out, size_t cap, const char *text, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;

	if (!cap)
		return out;
	for (size_t i = 0; text && i < len; i++) {
		unsigned char ch = (unsigned char)text[i];
		if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
			if (n + 1 >= cap)
				break;
			out[n++] = (char)ch;
		} else {
			if (n + 4 >= cap)
				break;
			out[n++] = '\\';
			out[n++] = 'x';
			out[n++] = hex[ch >> 4];
			out[n++] = hex[ch & 15];
		}
	}
	out[n] = 0;
	return out;
}
