/* dataset.h - labelled image sets in IDX files (MNIST, Fashion-MNIST) and
 * the per-worker batcher that feeds training from them.
 *
 * A data set is one IDX image file (magic 0x00000803: count, rows, cols, then
 * count*rows*cols unsigned bytes) and one IDX label file (magic 0x00000801:
 * count, then count unsigned bytes), gzip-compressed or plain. Nothing in a
 * file is trusted: magic, dimensions, exact size, image/label count agreement
 * and label range are checked before the set is handed out, and no buffer is
 * sized from a header alone.
 *
 * The batcher gives each worker an equal, disjoint, contiguous part of the
 * (optionally limited) training set and walks it in full batches, reshuffled
 * every epoch from (seed, epoch) so that runs are reproducible.
 */
#ifndef PS_DATASET_H
#define PS_DATASET_H

#include <stddef.h>
#include <stdint.h>

/* Limits on what a header may claim; anything larger is refused. */
#define PS_DATASET_MAX_IMAGES 10000000
#define PS_DATASET_MAX_SIDE   4096

/* Per-pixel normalization applied by ps_dataset_fill and ps_batcher_next:
 * x = (p / 255 - MEAN) / STD, the Fashion-MNIST training-set statistics. */
#define PS_DATASET_MEAN 0.2860f
#define PS_DATASET_STD  0.3530f

struct ps_dataset {
	int n;                 /* images, equal to labels */
	int rows, cols;        /* pixels per image side */
	int classes;           /* every label is < classes */
	uint8_t *images;       /* n x rows x cols bytes, image after image, row-major */
	uint8_t *labels;       /* n bytes */
};

/* Loads an image file and its label file (each gzip or plain). Every label
 * must be < classes (1..256). d is overwritten (free a loaded set first);
 * on error it is left empty and err holds one line naming the file and what
 * is wrong. Returns 0 or a negative code: -errno for system errors,
 * -EBADMSG for malformed content, PS_ETOOBIG for implausible dimensions,
 * PS_ESHAPE when the counts differ, -EINVAL for bad arguments. */
int ps_dataset_load(struct ps_dataset *d, const char *images_path, const char *labels_path,
		    int classes, char *err, size_t errlen);

/* Loads DIR/SPLIT-images-idx3-ubyte and DIR/SPLIT-labels-idx1-ubyte, split
 * being "train" or "t10k", each taken with the .gz suffix when that file
 * exists and without it otherwise. Missing files are reported with a hint
 * to install Debian's dataset-fashion-mnist package
 * (/usr/share/datasets/fashion-mnist). Errors as ps_dataset_load. */
int ps_dataset_load_dir(struct ps_dataset *d, const char *dir, const char *split, int classes,
			char *err, size_t errlen);

/* Frees what a load allocated and empties d; safe on an empty set. */
void ps_dataset_free(struct ps_dataset *d);

/* Writes images first..first+count-1 to x as normalized floats (count x 1 x
 * rows x cols, NCHW with one channel) and their labels to y. The caller
 * guarantees 0 <= first and first + count <= d->n. */
void ps_dataset_fill(const struct ps_dataset *d, int first, int count, float *x, int32_t *y);

/* One worker's view of the training set. Fields are private to dataset.c. */
struct ps_batcher {
	const struct ps_dataset *d;
	int batch;             /* images per batch */
	int first, count;      /* this worker's part: images first..first+count-1 */
	int *order;            /* count image indices in this epoch's order */
	int pos;               /* next position in order */
	uint64_t seed;
};

/* Prepares worker rank of nworkers to read batches of batch images from the
 * first limit images of d (0: all; more than d->n: all). Every worker gets
 * (used / nworkers) images, the remainder being dropped, so all take the
 * same number of steps; a part smaller than one batch gives no batches. The
 * batcher starts at epoch 0. d must outlive b. Returns 0, -EINVAL for bad
 * arguments or -ENOMEM; on error b is left empty. */
int ps_batcher_init(struct ps_batcher *b, const struct ps_dataset *d, int rank, int nworkers,
		    int batch, long limit, uint64_t seed);

/* Starts epoch: this worker's part in an order that depends only on the
 * seed and epoch (Fisher-Yates driven by splitmix64). */
void ps_batcher_epoch(struct ps_batcher *b, int epoch);

/* Writes the next full batch to x (batch x rows x cols floats, normalized as
 * ps_dataset_fill) and y; returns the batch size, or 0 once the epoch has no
 * full batch left. */
int ps_batcher_next(struct ps_batcher *b, float *x, int32_t *y);

/* Full batches per epoch. */
int ps_batcher_batches(const struct ps_batcher *b);

/* The next batch is read from position pos of this epoch's order (a
 * multiple of the batch below count), and the image indices it holds. */
void ps_batcher_seek(struct ps_batcher *b, int pos);
const int *ps_batcher_peek(const struct ps_batcher *b);

/* Frees the order and empties b; safe on an empty batcher. */
void ps_batcher_free(struct ps_batcher *b);

#endif
