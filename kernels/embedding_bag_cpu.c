/* embedding_bag_cpu.c - the embedding bag ops of the cpu backend (the
 * layout is struct ps_bag_shape's, common/compute.h).
 *
 * Forward: each bag's rows are added (then divided by the bag's size for a
 * mean) into its dim floats of y. Backward: each row's gradient is the sum
 * of the dy slots of the bags naming it, walked through the caller's
 * transpose of idx in its order, so no two rows ever write the same floats
 * and the sum's order is fixed: the same reference order the cuda kernels
 * follow, so both backends give the same bits up to fp32 rounding of
 * identical operation sequences.
 */
#include <stdio.h>
#include <string.h>
#include "compute.h"
#include "ps_err.h"

__attribute__((optimize("O3")))
int ps__cpu_embedding_bag_fwd(struct ps_compute *c, const struct ps_bag_shape *s,
			      const float *rows, const int32_t *offsets, const int32_t *idx,
			      float *y)
{
	int rc = ps__bag_shape_check(s, c->err, sizeof(c->err));
	int dim = s->dim;

	if (rc)
		return rc;
	/* every index first: a bad one writes nothing */
	for (int b = 0; b < s->nbags; b++) {
		if (offsets[b + 1] < offsets[b] || offsets[b] < 0) {
			snprintf(c->err, sizeof(c->err), "embedding_bag_fwd: offsets[%d..%d] = %d, %d "
				 "are not increasing", b, b + 1, offsets[b], offsets[b + 1]);
			return -EINVAL;
		}
		for (int e = offsets[b]; e < offsets[b + 1]; e++)
			if (idx[e] < 0 || idx[e] >= s->nrows) {
				snprintf(c->err, sizeof(c->err), "embedding_bag_fwd: idx[%d] = %d (bag %d) "
					 "is outside 0..%d", e, idx[e], b, s->nrows - 1);
				return -EINVAL;
			}
	}
	for (int b = 0; b < s->nbags; b++) {
		float *out = y + (size_t)(b / s->fields) * s->ldy + (size_t)(b % s->fields) * dim;
		int first = offsets[b], end = offsets[b + 1];

		memset(out, 0, sizeof(float) * (size_t)dim);
		for (int e = first; e < end; e++) {
			const float *r = rows + (size_t)idx[e] * dim;
			for (int d = 0; d < dim; d++)
				out[d] += r[d];
		}
		if (s->mode == PS_BAG_MEAN && end - first > 1) {
			float inv = 1.0f / (float)(end - first);
			for (int d = 0; d < dim; d++)
				out[d] *= inv;
		}
	}
	return 0;
}

__attribute__((optimize("O3")))
int ps__cpu_embedding_bag_bwd(struct ps_compute *c, const struct ps_bag_shape *s,
			      const float *dy, const int32_t *offsets, const int32_t *row_offsets,
			      const int32_t *row_bags, float *drows, float alpha)
{
	int rc = ps__bag_shape_check(s, c->err, sizeof(c->err));
	int dim = s->dim;

	if (rc)
		return rc;
	for (int r = 0; r < s->nrows; r++)
		for (int k = row_offsets[r]; k < row_offsets[r + 1]; k++)
			if (row_bags[k] < 0 || row_bags[k] >= s->nbags) {
				snprintf(c->err, sizeof(c->err), "embedding_bag_bwd: row_bags[%d] = %d "
					 "(row %d) is outside 0..%d", k, row_bags[k], r, s->nbags - 1);
				return -EINVAL;
			}
	for (int r = 0; r < s->nrows; r++) {
		float *g = drows + (size_t)r * dim;

		memset(g, 0, sizeof(float) * (size_t)dim);
		for (int k = row_offsets[r]; k < row_offsets[r + 1]; k++) {
			int b = row_bags[k], size = offsets[b + 1] - offsets[b];
			const float *src = dy + (size_t)(b / s->fields) * s->ldy +
					   (size_t)(b % s->fields) * dim;
			float w = s->mode == PS_BAG_MEAN && size > 1 ? 1.0f / (float)size : 1.0f;
			for (int d = 0; d < dim; d++)
				g[d] += w * src[d];
		}
		for (int d = 0; d < dim; d++)
			g[d] *= alpha;
	}
	return 0;
}
