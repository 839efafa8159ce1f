/* model_file.c - trained weights on disk (model_file.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "model_file.h"
#include "ps_err.h"

#define MODEL_MAGIC "PSMODEL1"

struct wr {
	FILE *f;
	uLong crc;
};

static void put(struct wr *o, const void *p, size_t n)
{
	fwrite(p, 1, n, o->f);
	for (size_t done = 0; done < n;) {
		size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
		o->crc = crc32(o->crc, (const Bytef *)p + done, (uInt)chunk);
		done += chunk;
	}
}

int ps_model_save(const char *path, const struct ps_config *cfg, float *const *w, char *err,
		  size_t errlen)
{
	char tmp[4200];
	struct wr o = { .crc = crc32(0L, Z_NULL, 0) };
	uint32_t nt = (uint32_t)cfg->ntensors, crc;
	int rc = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	o.f = fopen(tmp, "wb");
	if (!o.f) {
		snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		return -errno;
	}
	put(&o, MODEL_MAGIC, 8);
	put(&o, &nt, sizeof(nt));
	for (int t = 0; t < cfg->ntensors; t++) {
		uint32_t len = (uint32_t)strlen(cfg->tensors[t].name);
		uint64_t count = (uint64_t)cfg->tensors[t].count;

		put(&o, &len, sizeof(len));
		put(&o, cfg->tensors[t].name, len);
		put(&o, &count, sizeof(count));
		put(&o, w[t], (size_t)count * sizeof(float));
	}
	crc = (uint32_t)o.crc;
	fwrite(&crc, 1, sizeof(crc), o.f);
	if (fflush(o.f) || ferror(o.f) || fsync(fileno(o.f)))
		rc = -(errno ? errno : EIO);
	if (fclose(o.f) && !rc)
		rc = -(errno ? errno : EIO);
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc) {
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(-rc));
		unlink(tmp);
	}
	return rc;
}

int ps_model_load(const char *path, const struct ps_config *cfg, float **w, char *err,
		  size_t errlen)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b = NULL;
	long len;
	size_t pos = 12;
	uint32_t nt, crc;
	int rc = PS_EPROTO;

	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		fclose(f);
		return -EIO;
	}
	b = malloc(len > 0 ? (size_t)len : 1);
	if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) {
		snprintf(err, errlen, "%s: cannot read", path);
		rc = b ? -EIO : -ENOMEM;
		goto out;
	}
	if (len < 16 || memcmp(b, MODEL_MAGIC, 8)) {
		snprintf(err, errlen, "%s: not a model saved by ps-worker --save-model", path);
		goto out;
	}
	memcpy(&crc, b + len - 4, 4);
	if ((uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(len - 4)) != crc) {
		snprintf(err, errlen, "%s: checksum mismatch: the file is damaged or truncated", path);
		goto out;
	}
	memcpy(&nt, b + 8, 4);
	if ((int)nt != cfg->ntensors) {
		snprintf(err, errlen, "%s: holds %u tensors, the config's model has %d", path, nt,
			 cfg->ntensors);
		goto out;
	}
	/* Check every tensor's name and size, then copy. */
	for (int pass = 0; pass < 2; pass++) {
		pos = 12;
		for (int t = 0; t < cfg->ntensors; t++) {
			uint32_t nl;
			uint64_t count;

			if ((size_t)len - 4 - pos < 4)
				goto short_file;
			memcpy(&nl, b + pos, 4);
			pos += 4;
			if ((size_t)len - 4 - pos < (size_t)nl + 8)
				goto short_file;
			if (nl != strlen(cfg->tensors[t].name) ||
			    memcmp(b + pos, cfg->tensors[t].name, nl)) {
				snprintf(err, errlen, "%s: tensor %d is '%.*s', the config's is '%s'",
					 path, t, (int)(nl < 64 ? nl : 64), (const char *)b + pos,
					 cfg->tensors[t].name);
				goto out;
			}
			pos += nl;
			memcpy(&count, b + pos, 8);
			pos += 8;
			if (count != (uint64_t)cfg->tensors[t].count) {
				snprintf(err, errlen, "%s: tensor '%s' has %llu values, the config's "
					 "has %lld", path, cfg->tensors[t].name,
					 (unsigned long long)count, (long long)cfg->tensors[t].count);
				goto out;
			}
			if (((size_t)len - 4 - pos) / sizeof(float) < count)
				goto short_file;
			if (pass == 1)
				memcpy(w[t], b + pos, (size_t)count * sizeof(float));
			pos += (size_t)count * sizeof(float);
		}
		if (pos != (size_t)len - 4) {
			snprintf(err, errlen, "%s: %zu bytes after the last tensor", path,
				 (size_t)len - 4 - pos);
			goto out;
		}
	}
	rc = 0;
	goto out;
short_file:
	snprintf(err, errlen, "%s: ends inside a tensor", path);
out:
	free(b);
	fclose(f);
	return rc;
}
