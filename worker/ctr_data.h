/* ctr_data.h - the ctr preset's click logs in memory and the AUC it
 * reports (docs/embeddings.md). */
#ifndef PS_CTR_DATA_H
#define PS_CTR_DATA_H

#include <stddef.h>
#include <stdint.h>

/* A click log in memory, ready for batches: per example 26 embedding ids
 * (ps_criteo_id), 13 numeric features as log(1 + x) for x > 0 (else 0)
 * and the label. */
struct ps_ctr_data {
	int n;
	uint64_t *ids;            /* n x 26 */
	float *num;               /* n x 13 */
	int32_t *label;           /* n */
};

/* Reads up to limit examples (0 = all) of path. A malformed line is an
 * error (FILE:LINE and the text in err). 0 or a negative code. */
int ps_ctr_load(struct ps_ctr_data *d, const char *path, int64_t limit, char *err,
		size_t errlen);
void ps_ctr_data_free(struct ps_ctr_data *d);

/* The exact AUC of n (score, label) pairs: the probability that a random
 * positive scores above a random negative, ties counting one half (ranks
 * averaged over ties). Sorts score and label together. NaN without both
 * classes. */
double ps_ctr_auc(float *score, int32_t *label, int n);

#endif
