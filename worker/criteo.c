/* criteo.c - reading and writing Criteo's click-log format (criteo.h).
 * zlib's gzFile reads gzip and plain files alike. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "criteo.h"
#include "ps_err.h"

#define LINE_MAX_BYTES 4096 /* a Criteo line is under 300 bytes */

struct ps_criteo {
	gzFile gz;
	char path[512];
	uint64_t line;
	char buf[LINE_MAX_BYTES + 2];
};

int ps_criteo_open(struct ps_criteo **out, const char *path, char *err, size_t errlen)
{
	struct ps_criteo *r = calloc(1, sizeof(*r));

	if (!r) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->gz = gzopen(path, "rb");
	if (!r->gz) {
		int rc = errno ? -errno : -ENOMEM;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
		free(r);
		return rc;
	}
	gzbuffer(r->gz, 1 << 17);
	snprintf(r->path, sizeof(r->path), "%s", path);
	*out = r;
	return 0;
}

void ps_criteo_close(struct ps_criteo *r)
{
	if (r) {
		gzclose(r->gz);
		free(r);
	}
}

/* Shows up to 60 bytes of the offending text, control bytes as '?'. */
static const char *shown(const char *s, size_t n, char *buf, size_t len)
{
	size_t k = 0;

	for (size_t i = 0; i < n && k + 4 < len && i < 60; i++)
		buf[k++] = (unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e ? '?' : s[i];
	if (n > 60 && k + 4 < len) {
		memcpy(buf + k, "...", 3);
		k += 3;
	}
	buf[k] = 0;
	return buf;
}

uint64_t ps_criteo_id(int f, uint64_t value, int missing)
{
	uint64_t z = ((uint64_t)(f + 1) << 56) ^ value ^ (missing ? 0xa5a5a5a5a5a5a5a5ull : 0);

	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int ps_criteo_next(struct ps_criteo *r, struct ps_ctr_example *ex, char *err, size_t errlen)
{
	char *line, *p, *end, got[80];
	size_t len;
	int field = 0;

	line = gzgets(r->gz, r->buf, sizeof(r->buf));
	if (!line) {
		int zerr;
		const char *m = gzerror(r->gz, &zerr);
		if (zerr != Z_OK && zerr != Z_BUF_ERROR) {
			snprintf(err, errlen, "%s:%" PRIu64 ": cannot read: %s", r->path, r->line + 1, m);
			return PS_EPROTO;
		}
		return 0;
	}
	r->line++;
	len = strlen(line);
	if (len == sizeof(r->buf) - 1 && line[len - 1] != '\n') {
		/* skip the rest of an overlong line, so the next call reads the next one */
		while (gzgets(r->gz, r->buf, sizeof(r->buf)) && !strchr(r->buf, '\n'))
			;
		snprintf(err, errlen, "%s:%" PRIu64 ": line longer than %d bytes", r->path, r->line,
			 LINE_MAX_BYTES);
		return PS_EPROTO;
	}
	while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = 0;
	memset(ex, 0, sizeof(*ex));
	for (p = line;; field++) {
		char *tab = strchr(p, '\t');
		size_t n = tab ? (size_t)(tab - p) : strlen(p);
		if (field >= 1 + PS_CTR_NUM + PS_CTR_CAT) {
			snprintf(err, errlen, "%s:%" PRIu64 ": more than %d tab-separated fields",
				 r->path, r->line, 1 + PS_CTR_NUM + PS_CTR_CAT);
			return PS_EPROTO;
		}
		if (field == 0) {
			if (n != 1 || (p[0] != '0' && p[0] != '1')) {
				snprintf(err, errlen, "%s:%" PRIu64 ": label: expected 0 or 1, got '%s'",
					 r->path, r->line, shown(p, n, got, sizeof(got)));
				return PS_EPROTO;
			}
			ex->label = p[0] - '0';
		} else if (field <= PS_CTR_NUM) {
			int i = field - 1;
			if (!n) {
				ex->num_missing |= 1 << i;
			} else {
				errno = 0;
				long long v = strtoll(p, &end, 10);
				if (errno || end != p + n) {
					snprintf(err, errlen, "%s:%" PRIu64 ": integer feature %d: expected an "
						 "integer, got '%s'", r->path, r->line, i + 1,
						 shown(p, n, got, sizeof(got)));
					return PS_EPROTO;
				}
				ex->num[i] = v;
			}
		} else {
			int i = field - 1 - PS_CTR_NUM;
			if (!n) {
				ex->cat_missing |= 1u << i;
			} else {
				errno = 0;
				unsigned long long v = strtoull(p, &end, 16);
				if (errno || end != p + n || n > 16 || p[0] == '-' || p[0] == '+') {
					snprintf(err, errlen, "%s:%" PRIu64 ": categorical feature %d: "
						 "expected hexadecimal, got '%s'", r->path, r->line, i + 1,
						 shown(p, n, got, sizeof(got)));
					return PS_EPROTO;
				}
				ex->cat[i] = v;
			}
		}
		if (!tab)
			break;
		p = tab + 1;
	}
	if (field != PS_CTR_NUM + PS_CTR_CAT) {
		snprintf(err, errlen, "%s:%" PRIu64 ": expected %d tab-separated fields (label, %d "
			 "integers, %d categoricals), got %d", r->path, r->line,
			 1 + PS_CTR_NUM + PS_CTR_CAT, PS_CTR_NUM, PS_CTR_CAT, field + 1);
		return PS_EPROTO;
	}
	return 1;
}

size_t ps_criteo_format(const struct ps_ctr_example *ex, char *buf)
{
	char *p = buf;

	*p++ = (char)('0' + (ex->label ? 1 : 0));
	for (int i = 0; i < PS_CTR_NUM; i++) {
		*p++ = '\t';
		if (!(ex->num_missing & (1 << i)))
			p += sprintf(p, "%" PRId64, ex->num[i]);
	}
	for (int i = 0; i < PS_CTR_CAT; i++) {
		*p++ = '\t';
		if (!(ex->cat_missing & (1u << i)))
			p += sprintf(p, "%08" PRIx64, ex->cat[i]);
	}
	*p++ = '\n';
	*p = 0;
	return (size_t)(p - buf);
}
