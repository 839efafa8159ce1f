/* ps_ctrgen.c - writes a synthetic click log in Criteo's format and prints
 * the best AUC a model can reach on it (ctr_gen.h).
 *
 *   ps-ctrgen --out FILE[.gz] [--samples N] [--skip N] [--seed S]
 *             [--zipf-min A] [--zipf-max B] [--scale F] [--drift D]
 *             [--missing P] [--signal W] [--admission N] [--json]
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "ctr_gen.h"
#include "ps_time.h"
#include "version.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: ps-ctrgen --out FILE [options]\n"
		"\n"
		"Writes examples [skip, skip + samples) of a synthetic click log in Criteo's\n"
		"format (label, 13 integers, 26 hexadecimal categoricals, tab-separated;\n"
		"gzip when FILE ends in .gz) and prints the best achievable AUC: that of the\n"
		"hidden model's true click probabilities on these examples.\n"
		"\n"
		"Options:\n"
		"  -o, --out FILE      where to write (required)\n"
		"  -n, --samples N     examples to write (default 100000)\n"
		"      --skip N        start at example N (a test file after a training file\n"
		"                      of N examples: same seed, later in the drift)\n"
		"  -s, --seed S        seed of the hidden model and the draws (default 1)\n"
		"      --zipf-min A    Zipf exponent of the first field (default 0.9)\n"
		"      --zipf-max B    and of the last; fields between are spread evenly (1.2)\n"
		"      --scale F       cardinalities times F (default 1: Criteo Kaggle's,\n"
		"                      9.25 million values, the largest field 2.59 million)\n"
		"      --drift D       each field's values slide by D x its cardinality per\n"
		"                      million examples: old ids retire (default 0)\n"
		"      --missing P     probability of an empty feature (default 0.02)\n"
		"      --signal W      spread of the hidden weights (default 0.8)\n"
		"      --admission N   also count the distinct categorical ids and those seen\n"
		"                      at least N times: the rows a table with admission N\n"
		"                      would create from these examples\n"
		"  -j, --json          the summary as one JSON object\n"
		"  -h, --help          this text\n"
		"      --version       version, wire protocol, rdma and CUDA plug-in of this build\n");
}

/* --admission: how many distinct categorical ids the examples hold, and
 * how many of them are seen at least N times (the rows admission N would
 * create, counting every example). An exact count in an open-addressing
 * table of (id, count), doubled at half load. */
struct idcount {
	uint64_t *id;
	uint32_t *n;
	uint64_t mask, used;
};

static int idcount_add(struct idcount *t, uint64_t id)
{
	uint64_t i;

	if ((t->used + 1) * 2 > t->mask + 1) {
		struct idcount g = { calloc((t->mask + 1) * 2, 8), calloc((t->mask + 1) * 2, 4),
				     (t->mask + 1) * 2 - 1, 0 };
		if (!g.id || !g.n) {
			free(g.id);
			free(g.n);
			return -1;
		}
		for (uint64_t k = 0; k <= t->mask; k++) {
			if (!t->n[k])
				continue;
			for (i = (t->id[k] * 0x9e3779b97f4a7c15ull) >> 20 & g.mask; g.n[i]; i = (i + 1) & g.mask)
				;
			g.id[i] = t->id[k];
			g.n[i] = t->n[k];
		}
		g.used = t->used;
		free(t->id);
		free(t->n);
		*t = g;
	}
	for (i = (id * 0x9e3779b97f4a7c15ull) >> 20 & t->mask; t->n[i] && t->id[i] != id;
	     i = (i + 1) & t->mask)
		;
	if (!t->n[i]) {
		t->id[i] = id;
		t->used++;
	}
	t->n[i]++;
	return 0;
}

static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (*end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "ps-ctrgen: %s: expected a number in [%g, %g], got '%s'\n", flag, lo,
			hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "out", required_argument, NULL, 'o' }, { "samples", required_argument, NULL, 'n' },
		{ "skip", required_argument, NULL, 'k' }, { "seed", required_argument, NULL, 's' },
		{ "zipf-min", required_argument, NULL, 'a' }, { "zipf-max", required_argument, NULL, 'b' },
		{ "scale", required_argument, NULL, 'f' }, { "drift", required_argument, NULL, 'd' },
		{ "missing", required_argument, NULL, 'm' }, { "signal", required_argument, NULL, 'w' },
		{ "admission", required_argument, NULL, 'A' },
		{ "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct ps_ctr_gen_cfg gc;
	struct ps_ctr_gen g;
	struct ps_ctr_example ex;
	struct ps_auc auc;
	const char *out = NULL;
	double n = 100000, skip = 0, seed = 1, t0, admit = 0;
	struct idcount ic = { calloc(1024, 8), calloc(1024, 4), 1023, 0 };
	uint64_t clicks = 0, bytes = 0;
	int opt, json = 0, gz;
	char line[1024], mode[8];
	gzFile f;

	/* --out to a pipe or FIFO whose reader went away: "write failed" and
	 * exit 1, not a silent death by SIGPIPE */
	signal(SIGPIPE, SIG_IGN);
	ps_ctr_gen_default(&gc);
	while ((opt = getopt_long(argc, argv, "o:n:s:jh", lo, NULL)) != -1) {
		int bad = 0;
		switch (opt) {
		case 'o': out = optarg; break;
		case 'n': bad = num("--samples", optarg, 1, 1e12, &n); break;
		case 'k': bad = num("--skip", optarg, 0, 1e15, &skip); break;
		case 's': bad = num("--seed", optarg, 0, 1e18, &seed); break;
		case 'a': bad = num("--zipf-min", optarg, 0.01, 5, &gc.zipf_min); break;
		case 'b': bad = num("--zipf-max", optarg, 0.01, 5, &gc.zipf_max); break;
		case 'f': bad = num("--scale", optarg, 1e-9, 100, &gc.scale); break;
		case 'd': bad = num("--drift", optarg, 0, 1e6, &gc.drift); break;
		case 'm': bad = num("--missing", optarg, 0, 0.99, &gc.missing); break;
		case 'w': bad = num("--signal", optarg, 0, 10, &gc.signal); break;
		case 'A': bad = num("--admission", optarg, 2, 255, &admit); break;
		case 'j': json = 1; break;
		case 'V': ps__version_print(stdout, "ps-ctrgen"); goto out_help;
		case 'h': usage(stdout); goto out_help;
		default: fprintf(stderr, "Try 'ps-ctrgen --help'.\n"); return 2;
		}
		if (bad)
			return 2;
	}
	if (!out) {
		fprintf(stderr, "ps-ctrgen: --out FILE is required\nTry 'ps-ctrgen --help'.\n");
		return 2;
	}
	gc.seed = (uint64_t)seed;
	if (ps_ctr_gen_init(&g, &gc)) {
		fprintf(stderr, "ps-ctrgen: --zipf-min must not exceed --zipf-max\n");
		return 2;
	}
	gz = strlen(out) > 3 && !strcmp(out + strlen(out) - 3, ".gz");
	snprintf(mode, sizeof(mode), gz ? "wb6" : "wbT");
	f = gzopen(out, mode);
	if (!f || ps_auc_init(&auc)) {
		fprintf(stderr, "ps-ctrgen: %s: cannot write\n", out);
		return 1;
	}
	t0 = ps_now_s();
	for (uint64_t i = (uint64_t)skip; i < (uint64_t)skip + (uint64_t)n; i++) {
		double p;
		size_t len;
		ps_ctr_gen_example(&g, i, &ex, &p);
		len = ps_criteo_format(&ex, line);
		if (gzwrite(f, line, (unsigned)len) != (int)len) {
			fprintf(stderr, "ps-ctrgen: %s: write failed\n", out);
			gzclose(f);
			return 1;
		}
		bytes += len;
		clicks += (uint64_t)ex.label;
		for (int k = 0; admit > 0 && k < PS_CTR_CAT; k++)
			if (idcount_add(&ic, ps_criteo_id(k, ex.cat[k], (ex.cat_missing >> k) & 1))) {
				fprintf(stderr, "ps-ctrgen: --admission: out of memory\n");
				gzclose(f);
				return 1;
			}
		ps_auc_add(&auc, p, ex.label);
	}
	if (gzclose(f) != Z_OK) {
		fprintf(stderr, "ps-ctrgen: %s: write failed\n", out);
		return 1;
	}
	double best = ps_auc_value(&auc), secs = ps_now_s() - t0;
	uint64_t values = 0;
	for (int k = 0; k < PS_CTR_CAT; k++)
		values += g.card[k];
	if (json)
		printf("{\"out\":\"%s\",\"examples\":%.0f,\"skip\":%.0f,\"click_rate\":%.5f,"
		       "\"best_auc\":%.5f,\"values\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"seconds\":%.2f}\n",
		       out, n, skip, (double)clicks / n, best, values, bytes, secs);
	else
		printf("ps-ctrgen: %s: %.0f examples from %.0f, click rate %.4f, best achievable "
		       "AUC %.4f (the hidden model's), %" PRIu64 " categorical values in all, %.1f s\n",
		       out, n, skip, (double)clicks / n, best, values, secs);
	if (admit > 0) {
		uint64_t kept = 0;
		for (uint64_t k = 0; k <= ic.mask; k++)
			kept += ic.n[k] >= (uint32_t)admit;
		printf(json ? "{\"admission\":%.0f,\"distinct_ids\":%" PRIu64 ",\"admitted_ids\":%"
		       PRIu64 ",\"ratio\":%.3f}\n"
			    : "ps-ctrgen: admission %.0f: %" PRIu64 " distinct categorical ids, %" PRIu64
			      " seen at least that often (%.2fx fewer rows)\n",
		       admit, ic.used, kept, kept ? (double)ic.used / (double)kept : 0.0);
	}
	free(ic.id);
	free(ic.n);
	ps_auc_free(&auc);
	return 0;

out_help: /* --help, --version: nothing else was allocated yet */
	free(ic.id);
	free(ic.n);
	return 0;
}
