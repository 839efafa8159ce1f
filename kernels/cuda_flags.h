/* cuda_flags.h - faults our kernels find in their inputs (an index that
 * maxpool_fwd cannot have written), kept in one small struct in device
 * memory. The host learns of them without a wait of its own: every
 * download_async copies the struct to pinned memory behind its data, and
 * sync() and event_wait() check that copy. Sticky until reported. */
#ifndef PS_CUDA_FLAGS_H
#define PS_CUDA_FLAGS_H

struct ps__cuda_flags {
	int bad_pool;        /* nonzero: a maxpool_bwd index outside its window */
	int bad_pool_value;  /* that index */
	int bad_pool_at;     /* its position in idx */
	int pad;
};

#endif
