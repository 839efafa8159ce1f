/* bench_codec.c - speed and size of each gradient codec on one core.
 *
 * For each codec (none, fp16, q8, topk 0.01, sign) and each slice size,
 * on gradient-like data (normal, sd 1e-3): encode and decode_add rates in
 * GB/s of raw float bytes, the encoded size as a ratio of raw, and that
 * size after the LZ4 stage (raw size when LZ4 does not shrink it, as the
 * sender would then send it without). topk, sign and q8 encode with an
 * error-feedback residual, as workers run them by default; the residual is
 * reset from a copy, untimed, before each call so every call sees the same
 * input. memcpy of the same bytes, timed the same way in the same run, is
 * the baseline: compare ratios to it between machines.
 *
 * Usage: bench_codec [--json] [--seconds S] [--bytes B]...
 *   default sizes 1 MiB and 16 MiB (256Ki and 4Mi floats); S = 0.5.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "bench_util.h"
#include "codec.h"


struct variant {
	const char *label;
	const char *codec;
	float ratio;
	int ef;
};

static const struct variant variants[] = {
	{ "none", "none", 0.0f, 0 },
	{ "fp16", "fp16", 0.0f, 0 },
	{ "q8", "q8", 0.0f, 1 },
	{ "topk-0.01", "topk", 0.01f, 1 },
	{ "sign", "sign", 0.0f, 1 },
};

struct result {
	double enc_gbps, dec_gbps, wire, wire_lz4;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
}

static void bench_codec(const struct variant *v, const float *x, const float *r0, size_t n,
			double secs, struct result *res)
{
	const struct ps_codec_ops *c = ps_codec_find(v->codec);
	struct ps_codec_params p = { .ratio = v->ratio, .seed = 1 };
	size_t cap = c->max_bytes(n, &p), len = 0, packed;
	uint8_t *out = bu_alloc(cap), *z = bu_alloc(ps_lz4_bound(cap));
	float *r = v->ef ? bu_alloc(n * sizeof(float)) : NULL, *acc = bu_alloc(n * sizeof(float));
	double spent = 0, t0;
	uint64_t iters = 0;
	char err[128];

	/* Encode: only the call is timed. */
	do {
		ssize_t got;

		if (r)
			memcpy(r, r0, n * sizeof(float));
		t0 = ps_now_s();
		got = c->encode(x, r, n, &p, iters, out, cap);
		spent += ps_now_s() - t0;
		bu_clobber(out);
		if (got < 0) {
			fprintf(stderr, "bench_codec: %s encode failed: %d\n", v->label, (int)got);
			exit(1);
		}
		len = (size_t)got;
		iters++;
	} while (spent < secs || iters < 3);
	res->enc_gbps = (double)n * sizeof(float) * (double)iters / spent * 1e-9;
	res->wire = (double)len / ((double)n * sizeof(float));
	packed = ps_lz4_pack(out, len, z, ps_lz4_bound(len));
	res->wire_lz4 = (double)(packed ? packed : len) / ((double)n * sizeof(float));
	/* decode_add into one accumulator, as a shard sums pushes. */
	iters = 0;
	t0 = ps_now_s();
	do {
		for (int k = 0; k < 4; k++) {
			if (c->decode_add(out, len, n, 0.25f, acc, err, sizeof(err)) != 0) {
				fprintf(stderr, "bench_codec: %s decode: %s\n", v->label, err);
				exit(1);
			}
			bu_clobber(acc);
		}
		iters += 4;
		spent = ps_now_s() - t0;
	} while (spent < secs);
	res->dec_gbps = (double)n * sizeof(float) * (double)iters / spent * 1e-9;
	free(out);
	free(z);
	free(r);
	free(acc);
}

static void usage(FILE *out)
{
	fprintf(out, "usage: bench_codec [--json] [--seconds S] [--bytes B]...\n"
		"  --json       one JSON object per line\n"
		"  --seconds S  time per measurement (default 0.5)\n"
		"  --bytes B    raw gradient bytes per slice, repeatable "
		"(default 1 MiB and 16 MiB)\n");
}

int main(int argc, char **argv)
{
	size_t sizes[BU_MAX_SIZES];
	int nsizes = 0, json = 0;
	double secs = 0.5;

	int rc = bu_parse_args(argc, argv, usage, &json, &secs, sizes, &nsizes);

	if (rc >= 0)
		return rc;
	if (!json)
		printf("%-10s %6s %10s %10s %8s %8s %10s\n", "codec", "slice", "enc GB/s",
		       "dec+ GB/s", "wire", "wire+lz4", "memcpy");
	for (int s = 0; s < nsizes; s++) {
		size_t n = sizes[s] / sizeof(float), bytes = n * sizeof(float);
		float *x, *r0;
		char label[32];
		double mc;

		if (n == 0) {
			fprintf(stderr, "bench_codec: size %zu too small\n", sizes[s]);
			return 2;
		}
		x = bu_alloc(bytes);
		r0 = bu_alloc(bytes);
		/* Normal (Box-Muller), sd 1e-3 like late-training gradients; the
		 * residual is what earlier steps left, of the same order. */
		for (size_t i = 0; i < n; i++) {
			double u = urand(), w = urand();

			x[i] = (float)(1e-3 * sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * w));
			r0[i] = (float)(5e-4 * (urand() - 0.5));
		}
		bu_size_label(label, sizeof(label), bytes);
		mc = bu_memcpy_rate(bytes, secs);
		for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
			struct result res;

			bench_codec(&variants[v], x, r0, n, secs, &res);
			if (json)
				printf("{\"codec\":\"%s\",\"bytes\":%zu,\"ef\":%d,\"encode_gbps\":%.3f,"
				       "\"decode_add_gbps\":%.3f,\"wire_ratio\":%.5f,"
				       "\"wire_lz4_ratio\":%.5f,\"memcpy_gbps\":%.3f}\n",
				       variants[v].label, bytes, variants[v].ef, res.enc_gbps,
				       res.dec_gbps, res.wire, res.wire_lz4, mc * 1e-9);
			else
				printf("%-10s %6s %10.2f %10.2f %8.4f %8.4f %10.2f\n",
				       variants[v].label, label, res.enc_gbps, res.dec_gbps, res.wire,
				       res.wire_lz4, mc * 1e-9);
			fflush(stdout);
		}
		free(x);
		free(r0);
	}
	return 0;
}
