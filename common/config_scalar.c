/* config_scalar.c - parsing and formatting the scalar values config options
 * take (integers, sizes with suffixes, floats, host:port), and what each
 * option type accepts, for messages and --help.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "config.h"
#include "config_int.h"
#include "ps_err.h"

/* Decimal integer, optional sign, the whole text, no overflow. */
int cfg_parse_i64(const char *s, int64_t *out)
{
	const char *d = (*s == '-' || *s == '+') ? s + 1 : s;
	char *end;
	long long v;

	if (!isdigit((unsigned char)*d))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

/* Unsigned decimal prefix; *end points past the digits. */
static int parse_u64_prefix(const char *s, uint64_t *out, char **end)
{
	const char *d = *s == '+' ? s + 1 : s;

	if (!isdigit((unsigned char)*d))
		return -1;
	errno = 0;
	*out = strtoull(d, end, 10);
	return errno ? -1 : 0;
}

/* Bytes: an integer with an optional K/KiB/M/MiB/G/GiB suffix (x1024^n). */
int cfg_parse_size(const char *s, uint64_t *out)
{
	static const struct { const char *sfx; uint64_t mul; } sfx[] = {
		{ "", 1 }, { "K", KiB }, { "KiB", KiB }, { "M", MiB }, { "MiB", MiB },
		{ "G", GiB }, { "GiB", GiB },
	};
	uint64_t v;
	char *end;

	if (parse_u64_prefix(s, &v, &end))
		return -1;
	while (*end == ' ')
		end++;
	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		if (strcmp(end, sfx[i].sfx) == 0) {
			if (v > UINT64_MAX / sfx[i].mul)
				return -1;
			*out = v * sfx[i].mul;
			return 0;
		}
	}
	return -1;
}

/* A finite number, the whole text. */
int cfg_parse_double(const char *s, double *out)
{
	char *end;

	if (!*s || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	*out = strtod(s, &end);
	if (*end || errno == ERANGE || !isfinite(*out))
		return -1;
	return 0;
}

/* Writes a size with the largest exact binary suffix ("64MiB", "1000"). */
const char *cfg_fmt_size(uint64_t v, char *buf, size_t len)
{
	if (v && v % GiB == 0)
		snprintf(buf, len, "%" PRIu64 "GiB", v / GiB);
	else if (v && v % MiB == 0)
		snprintf(buf, len, "%" PRIu64 "MiB", v / MiB);
	else if (v && v % KiB == 0)
		snprintf(buf, len, "%" PRIu64 "KiB", v / KiB);
	else
		snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* Shortest text that parses back to exactly f. */
const char *cfg_fmt_float(float f, char *buf, size_t len)
{
	for (int prec = 6; prec <= 9; prec++) {
		snprintf(buf, len, "%.*g", prec, (double)f);
		if ((float)strtod(buf, NULL) == f)
			break;
	}
	return buf;
}

/* Parses "host:port", "[v6]:port"; on failure *why says what is wrong. */
int ps_endpoint_parse(const char *s, struct ps_endpoint *ep, const char **why)
{
	const char *host = s, *port, *p;
	size_t hlen;
	int64_t v;
	int dotted = 1;
	unsigned char tmp[16];

	if (*s == '[') {
		p = strchr(s, ']');
		if (!p)
			return *why = "missing ']'", -1;
		host = s + 1;
		hlen = p - host;
		if (p[1] != ':')
			return *why = p[1] ? "expected ':' after ']'" : "missing port", -1;
		port = p + 2;
	} else {
		p = strrchr(s, ':');
		if (!p)
			return *why = "missing port", -1;
		if (memchr(s, ':', p - s))
			return *why = "write IPv6 addresses in brackets, e.g. [::1]:7000", -1;
		hlen = p - s;
		port = p + 1;
	}
	if (hlen == 0)
		return *why = "empty host", -1;
	if (hlen >= PS_HOST_MAX)
		return *why = "host too long", -1;
	memcpy(ep->host, host, hlen);
	ep->host[hlen] = 0;
	if (*s == '[') {
		if (inet_pton(AF_INET6, ep->host, tmp) != 1)
			return *why = "not an IPv6 address", -1;
	} else {
		for (size_t i = 0; i < hlen; i++) {
			if (!isalnum((unsigned char)host[i]) && !strchr(".-_", host[i]))
				return *why = "invalid character in host", -1;
			if (!isdigit((unsigned char)host[i]) && host[i] != '.')
				dotted = 0;
		}
		if (dotted && inet_pton(AF_INET, ep->host, tmp) != 1)
			return *why = "not an IPv4 address", -1;
	}
	if (!*port)
		return *why = "missing port", -1;
	for (p = port; *p; p++)
		if (!isdigit((unsigned char)*p))
			return *why = "port is not a number", -1;
	if (p - port > 5 || cfg_parse_i64(port, &v) || v < 1 || v > 65535)
		return *why = "port out of 1..65535", -1;
	ep->port = (int)v;
	return 0;
}

/* "host:port" as written back: IPv6 hosts (they contain ':') in brackets. */
void cfg_fmt_endpoint(const struct ps_endpoint *ep, char *buf, size_t len)
{
	snprintf(buf, len, strchr(ep->host, ':') ? "[%s]:%d" : "%s:%d", ep->host, ep->port);
}

/* What an option accepts, as used in errors and --help. */
const char *cfg_describe(const struct opt *o, char *buf, size_t len)
{
	char a[32], b[32];
	size_t n;

	switch (o->type) {
	case T_INT:
		snprintf(buf, len, "an integer in %.0f..%.0f", o->min, o->max);
		break;
	case T_U64:
		snprintf(buf, len, "an integer in 0..%" PRIu64, UINT64_MAX);
		break;
	case T_SIZE:
		snprintf(buf, len, "a size in %s..%s bytes (suffix K, KiB, M, MiB, G, GiB allowed)",
			 cfg_fmt_size((uint64_t)o->min, a, sizeof(a)), cfg_fmt_size((uint64_t)o->max, b, sizeof(b)));
		break;
	case T_FLOAT:
		snprintf(buf, len, "a number in %c%g, %g%c", o->flags & F_OPEN_MIN ? '(' : '[',
			 o->min, o->max, o->flags & F_OPEN_MAX ? ')' : ']');
		break;
	case T_BOOL:
		snprintf(buf, len, "a boolean (true/false, yes/no, on/off, 1/0)");
		break;
	case T_ENUM:
	case T_ENUMSTR:
		n = snprintf(buf, len, "one of ");
		for (int i = 0; o->names[i] && n < len; i++)
			n += snprintf(buf + n, len - n, "%s%s", i ? ", " : "", o->names[i]);
		break;
	case T_ADDR:
		snprintf(buf, len, "host:port (port 1..65535, IPv6 as [::1]:port) or \"\" for off");
		break;
	case T_SERVERS:
		snprintf(buf, len, "a list of %.0f..%.0f host:port addresses", o->min, o->max);
		break;
	case T_TENSORS:
		snprintf(buf, len, "a list of %.0f..%.0f mappings with name and shape", o->min, o->max);
		break;
	case T_NAME:
		snprintf(buf, len, "a name of 1..%d characters from A-Z a-z 0-9 _ . : / -",
			 PS_NAME_MAX - 1);
		break;
	case T_SHAPE:
		snprintf(buf, len, "a list of 1..%d positive integers", PS_MAX_DIMS);
		break;
	case T_PATH:
		snprintf(buf, len, "a path of at most %zu bytes", o->size - 1);
		break;
	case T_LAYERS:
		snprintf(buf, len, "a list of %.0f..%.0f layers (dense, conv2d, maxpool, relu, "
			 "flatten)", o->min, o->max);
		break;
	case T_DIMS3:
		snprintf(buf, len, "a list of 3 positive integers [channels, height, width]");
		break;
	case T_OVERRIDES:
		snprintf(buf, len, "a list of %.0f..%.0f mappings with name and codec or ratio",
			 o->min, o->max);
		break;
	case T_TABLES:
		snprintf(buf, len, "a list of %.0f..%.0f mappings with name and dim", o->min, o->max);
		break;
	case T_FIELDS:
		snprintf(buf, len, "a list of distinct field numbers 0..%d", PS_CTR_FIELDS - 1);
		break;
	}
	return buf;
}

/* Parses scalar text s for option o into base. Returns 0, or -1 with *why
 * optionally set to a detail for the message. Also applies the defaults. */
int cfg_parse_scalar(const struct opt *o, void *base, const char *s, const char **why)
{
	char *dst = (char *)base + o->off;
	int64_t i;
	uint64_t u;
	double d;
	float f;
	char *end;
	struct ps_endpoint ep;

	switch (o->type) {
	case T_INT:
		if (cfg_parse_i64(s, &i) || i < o->min || i > o->max)
			return -1;
		if (o->size == sizeof(int64_t))
			*(int64_t *)dst = i;
		else
			*(int *)dst = (int)i;
		return 0;
	case T_U64:
		if (parse_u64_prefix(s, &u, &end) || *end)
			return -1;
		*(uint64_t *)dst = u;
		return 0;
	case T_SIZE:
		if (cfg_parse_size(s, &u) || u < (uint64_t)o->min || u > (uint64_t)o->max)
			return -1;
		if (o->size == sizeof(uint32_t))
			*(uint32_t *)dst = (uint32_t)u;
		else
			*(uint64_t *)dst = u;
		return 0;
	case T_FLOAT:
		if (cfg_parse_double(s, &d))
			return -1;
		/* check both the text's value and the float it rounds to, so that
		 * 0.99999999 does not become a momentum of exactly 1 */
		f = (float)d;
		for (int k = 0; k < 2; k++, d = f) {
			if (d < o->min || d > o->max || ((o->flags & F_OPEN_MIN) && d == o->min) ||
			    ((o->flags & F_OPEN_MAX) && d == o->max))
				return -1;
		}
		*(float *)dst = f;
		return 0;
	case T_BOOL:
		if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") ||
		    !strcmp(s, "1"))
			*(int *)dst = 1;
		else if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") ||
			 !strcmp(s, "0"))
			*(int *)dst = 0;
		else
			return -1;
		return 0;
	case T_ENUM:
	case T_ENUMSTR:
		for (int k = 0; o->names[k]; k++) {
			if (strcasecmp(s, o->names[k]) == 0) {
				if (o->type == T_ENUM)
					*(int *)dst = k;
				else
					snprintf(dst, o->size, "%s", o->names[k]);
				return 0;
			}
		}
		return -1;
	case T_ADDR:
		if (!*s) {
			*dst = 0;
			return 0;
		}
		if (ps_endpoint_parse(s, &ep, why))
			return -1;
		cfg_fmt_endpoint(&ep, dst, o->size);
		return 0;
	case T_NAME:
		if (!*s || strlen(s) >= o->size || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklm"
				"nopqrstuvwxyz0123456789_.:/-") != strlen(s))
			return -1;
		snprintf(dst, o->size, "%s", s);
		return 0;
	case T_PATH:
		if (strlen(s) >= o->size)
			return -1;
		for (const char *q = s; *q; q++)
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				return -1;
		snprintf(dst, o->size, "%s", s);
		return 0;
	default:
		return -1;
	}
}
