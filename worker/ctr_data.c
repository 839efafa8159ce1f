/* ctr_data.c - the ctr preset's data (ctr_data.h): click logs read into
 * memory as embedding ids, numeric features and labels, and the exact AUC
 * of scored held-out examples.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "criteo.h"
#include "ctr_data.h"
#include "layers.h"
#include "ps_err.h"

#define F PS_CTR_FIELDS
#define NUMF PS_CTR_NUMERIC

int ps_ctr_load(struct ps_ctr_data *d, const char *path, int64_t limit, char *err,
		size_t errlen)
{
	struct ps_criteo *r = NULL;
	struct ps_ctr_example ex;
	int cap = 0, rc;

	memset(d, 0, sizeof(*d));
	rc = ps_criteo_open(&r, path, err, errlen);
	if (rc)
		return rc;
	while ((limit <= 0 || d->n < limit) && (rc = ps_criteo_next(r, &ex, err, errlen)) == 1) {
		if (d->n == cap) {
			int ncap = cap ? cap * 2 : 65536;
			uint64_t *ids = realloc(d->ids, sizeof(*ids) * F * (size_t)ncap);
			if (ids)
				d->ids = ids;
			float *num = realloc(d->num, sizeof(*num) * NUMF * (size_t)ncap);
			if (num)
				d->num = num;
			int32_t *label = realloc(d->label, sizeof(*label) * (size_t)ncap);
			if (label)
				d->label = label;
			if (!ids || !num || !label) {
				snprintf(err, errlen, "%s: out of memory at %d examples", path, d->n);
				rc = -ENOMEM;
				goto fail;
			}
			cap = ncap;
		}
		for (int f = 0; f < F; f++)
			d->ids[(size_t)d->n * F + f] = ps_criteo_id(f, ex.cat[f], (ex.cat_missing >> f) & 1);
		for (int k = 0; k < NUMF; k++)
			d->num[(size_t)d->n * NUMF + k] = ex.num[k] > 0 ? (float)log1p((double)ex.num[k]) : 0.0f;
		d->label[d->n++] = ex.label;
	}
	if (rc < 0)
		goto fail;
	ps_criteo_close(r);
	if (d->n == 0) {
		snprintf(err, errlen, "%s: no examples", path);
		ps_ctr_data_free(d);
		return PS_ECONFIG;
	}
	return 0;
fail:
	ps_criteo_close(r);
	ps_ctr_data_free(d);
	return rc;
}

void ps_ctr_data_free(struct ps_ctr_data *d)
{
	free(d->ids);
	free(d->num);
	free(d->label);
	memset(d, 0, sizeof(*d));
}

struct scored {
	float s;
	int32_t y;
};

static int by_score(const void *a, const void *b)
{
	float x = ((const struct scored *)a)->s, y = ((const struct scored *)b)->s;
	return (x > y) - (x < y);
}

double ps_ctr_auc(float *score, int32_t *label, int n)
{
	struct scored *v = malloc(sizeof(*v) * (size_t)(n > 0 ? n : 1));
	double pos = 0, neg = 0, rank_sum = 0;

	if (!v)
		return NAN;
	for (int i = 0; i < n; i++)
		v[i] = (struct scored){ score[i], label[i] };
	qsort(v, (size_t)n, sizeof(*v), by_score);
	for (int i = 0; i < n;) {
		int j = i, p = 0;
		while (j < n && v[j].s == v[i].s)
			p += v[j++].y != 0;
		/* ranks i+1..j share their mean (i + 1 + j) / 2 */
		rank_sum += p * (i + 1 + j) / 2.0;
		pos += p;
		neg += (j - i) - p;
		i = j;
	}
	free(v);
	if (pos == 0 || neg == 0)
		return NAN;
	return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}
