/* ctr_gen.h - a synthetic click log in Criteo's format, with a known best
 * AUC (no click log ships with Debian; tests use small generated files).
 *
 * 26 categorical fields with cardinalities shaped like Criteo Kaggle's
 * (9.25 million values in all, the largest field 2.59 million; scaled by
 * `scale`), each drawn as a Zipf rank (exponent per field, spread evenly
 * over [zipf_min, zipf_max]) and mapped to a 64-bit value by a bijective
 * mix of (seed, field, rank + drift offset). 13 integer features, log-normal
 * counts. The label is drawn from a hidden logistic model: a weight per
 * categorical value and per log-count, so the best achievable AUC is that
 * of the true probabilities, which ctr_gen reports. With drift > 0 the
 * ranks slide onto new values over time (drift x cardinality of a field per
 * million examples): old values stop appearing and new ones with their own
 * weights take their place, so a TTL has rows to drop. Example i depends
 * only on (seed, i): any range of a log can be made alone (--skip).
 */
#ifndef PS_CTR_GEN_H
#define PS_CTR_GEN_H

#include <stdint.h>
#include "criteo.h"

struct ps_ctr_gen_cfg {
	uint64_t seed;
	double zipf_min, zipf_max;   /* 0.9, 1.2 */
	double scale;                /* cardinalities times this (>0), at least 2 each */
	double drift;                /* per million examples, fraction of a field's values */
	double missing;              /* probability of an empty feature */
	double signal;               /* std of the hidden weights (sharpness) */
};

struct ps_ctr_gen {
	struct ps_ctr_gen_cfg cfg;
	uint64_t card[PS_CTR_CAT];
	double s[PS_CTR_CAT];        /* Zipf exponents */
	double hx0[PS_CTR_CAT], hn[PS_CTR_CAT], t[PS_CTR_CAT]; /* sampler constants */
	double bias;
};

/* The cardinalities of Criteo Kaggle's fields (the generator's shape). */
extern const uint64_t ps_ctr_kaggle_card[PS_CTR_CAT];

void ps_ctr_gen_default(struct ps_ctr_gen_cfg *cfg);
/* 0, or PS_ECONFIG when a setting is out of range. */
int ps_ctr_gen_init(struct ps_ctr_gen *g, const struct ps_ctr_gen_cfg *cfg);

/* Example i (any order), and the true click probability behind its label. */
void ps_ctr_gen_example(const struct ps_ctr_gen *g, uint64_t i, struct ps_ctr_example *ex,
			double *p);

/* The Zipf rank of field f in example i's draw (tests: the distribution). */
uint64_t ps_ctr_gen_rank(const struct ps_ctr_gen *g, uint64_t i, int f);

/* AUC from binned scores: add (score in [0, 1], label) pairs, then read. */
struct ps_auc {
	uint64_t *pos, *neg;         /* PS_AUC_BINS each */
};
#define PS_AUC_BINS (1u << 20)
int ps_auc_init(struct ps_auc *a);
void ps_auc_add(struct ps_auc *a, double score, int label);
double ps_auc_value(const struct ps_auc *a);
void ps_auc_free(struct ps_auc *a);

#endif
