/* ctr_gen.c - the synthetic click log (ctr_gen.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ctr_gen.h"
#include "ps_err.h"

/* Criteo Kaggle's shape: 9,249,296 values, the largest field 2,590,000. */
const uint64_t ps_ctr_kaggle_card[PS_CTR_CAT] = {
	1460, 583, 2590000, 1400000, 305, 24, 12517, 633, 3, 93145, 5683, 2300000, 3194,
	27, 14992, 1390000, 10, 5652, 2173, 4, 1000000, 18, 15, 286181, 105, 142572,
};

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double unit(uint64_t r)
{
	return ((double)(r >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(uint64_t r)
{
	return sqrt(-2.0 * log(unit(r))) * cos(6.283185307179586 * unit(mix64(r)));
}

void ps_ctr_gen_default(struct ps_ctr_gen_cfg *cfg)
{
	*cfg = (struct ps_ctr_gen_cfg){ .seed = 1, .zipf_min = 0.9, .zipf_max = 1.2, .scale = 1.0,
					.drift = 0.0, .missing = 0.02, .signal = 0.8 };
}

static double zh(double s, double x)
{
	return s == 1.0 ? log(x) : (pow(x, 1.0 - s) - 1.0) / (1.0 - s);
}

static double zhinv(double s, double x)
{
	return s == 1.0 ? exp(x) : pow(1.0 + x * (1.0 - s), 1.0 / (1.0 - s));
}

int ps_ctr_gen_init(struct ps_ctr_gen *g, const struct ps_ctr_gen_cfg *cfg)
{
	if (!(cfg->zipf_min > 0 && cfg->zipf_max >= cfg->zipf_min && cfg->zipf_max <= 5) ||
	    !(cfg->scale > 0 && cfg->scale <= 100) || !(cfg->drift >= 0 && cfg->drift <= 1e6) ||
	    !(cfg->missing >= 0 && cfg->missing < 1) || !(cfg->signal >= 0 && cfg->signal <= 10))
		return PS_ECONFIG;
	memset(g, 0, sizeof(*g));
	g->cfg = *cfg;
	for (int f = 0; f < PS_CTR_CAT; f++) {
		double c = floor((double)ps_ctr_kaggle_card[f] * cfg->scale);
		double s = cfg->zipf_min + (cfg->zipf_max - cfg->zipf_min) * f / (PS_CTR_CAT - 1);
		g->card[f] = c < 2 ? 2 : (uint64_t)c;
		g->s[f] = s;
		g->hx0[f] = zh(s, 1.5) - 1.0;
		g->hn[f] = zh(s, (double)g->card[f] + 0.5);
		g->t[f] = 2.0 - zhinv(s, zh(s, 2.5) - pow(2.0, -s));
	}
	/* about a quarter of the examples are clicks, as in Criteo's logs */
	g->bias = -1.6;
	return 0;
}

/* Zipf rank by rejection-inversion (Hörmann and Derflinger 1996). */
uint64_t ps_ctr_gen_rank(const struct ps_ctr_gen *g, uint64_t i, int f)
{
	uint64_t st = mix64(g->cfg.seed ^ mix64(i * 64 + (uint64_t)f + 1));
	double s = g->s[f], n = (double)g->card[f];

	for (;;) {
		double u = unit(st = mix64(st));
		double x = zhinv(s, g->hn[f] + u * (g->hx0[f] - g->hn[f]));
		double k = floor(x + 0.5);
		if (k < 1)
			k = 1;
		if (k > n)
			k = n;
		if (k - x <= g->t[f] || u * (g->hx0[f] - g->hn[f]) + g->hn[f] >= zh(s, k + 0.5) - pow(k, -s))
			return (uint64_t)k;
	}
}

/* Hidden weight of a categorical value, and of an integer feature. */
static double cat_weight(const struct ps_ctr_gen *g, int f, uint64_t v)
{
	/* frequent fields carry less signal per value: scale by 1/sqrt(log card) */
	double spread = g->cfg.signal / sqrt(log((double)g->card[f]) + 1.0);

	return gauss(mix64(g->cfg.seed * 31 + 7) ^ mix64(v ^ ((uint64_t)f << 58))) * spread;
}

void ps_ctr_gen_example(const struct ps_ctr_gen *g, uint64_t i, struct ps_ctr_example *ex,
			double *p)
{
	uint64_t r = mix64(g->cfg.seed ^ mix64(~i));
	double z = g->bias;

	memset(ex, 0, sizeof(*ex));
	for (int k = 0; k < PS_CTR_NUM; k++) {
		r = mix64(r);
		if (unit(r) < g->cfg.missing) {
			ex->num_missing |= 1 << k;
			continue;
		}
		r = mix64(r);
		double lx = 1.0 + 0.25 * k + gauss(r);   /* log-normal counts */
		ex->num[k] = (int64_t)floor(exp(lx > 12 ? 12 : lx));
		z += g->cfg.signal * 0.15 * gauss(mix64(g->cfg.seed + 1000 + (uint64_t)k)) *
		     (log1p((double)ex->num[k]) - (1.0 + 0.25 * k));
	}
	for (int f = 0; f < PS_CTR_CAT; f++) {
		r = mix64(r);
		if (unit(r) < g->cfg.missing) {
			ex->cat_missing |= 1u << f;
			continue;
		}
		uint64_t rank = ps_ctr_gen_rank(g, i, f);
		uint64_t off = (uint64_t)((double)i / 1e6 * g->cfg.drift * (double)g->card[f]);
		/* bijective in rank + off for each (seed, field) */
		ex->cat[f] = mix64((rank + off) ^ mix64(g->cfg.seed ^ ((uint64_t)(f + 1) << 48)));
		z += cat_weight(g, f, ex->cat[f]);
	}
	*p = 1.0 / (1.0 + exp(-z));
	ex->label = unit(mix64(r ^ 0x1234567)) < *p;
}

int ps_auc_init(struct ps_auc *a)
{
	a->pos = calloc(PS_AUC_BINS, sizeof(uint64_t));
	a->neg = calloc(PS_AUC_BINS, sizeof(uint64_t));
	if (!a->pos || !a->neg) {
		ps_auc_free(a);
		return -ENOMEM;
	}
	return 0;
}

void ps_auc_add(struct ps_auc *a, double score, int label)
{
	double b = score * PS_AUC_BINS;
	uint32_t k = b <= 0 ? 0 : b >= PS_AUC_BINS - 1 ? PS_AUC_BINS - 1 : (uint32_t)b;

	(label ? a->pos : a->neg)[k]++;
}

/* Mann-Whitney: a positive beats every negative of a lower bin and half
 * of those in its own. */
double ps_auc_value(const struct ps_auc *a)
{
	double below = 0, win = 0, np = 0, nn = 0;

	for (uint32_t k = 0; k < PS_AUC_BINS; k++) {
		win += (double)a->pos[k] * (below + 0.5 * (double)a->neg[k]);
		below += (double)a->neg[k];
		np += (double)a->pos[k];
	}
	nn = below;
	return np > 0 && nn > 0 ? win / (np * nn) : NAN;
}

void ps_auc_free(struct ps_auc *a)
{
	free(a->pos);
	free(a->neg);
	a->pos = a->neg = NULL;
}
