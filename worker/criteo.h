/* criteo.h - click logs in Criteo's format (the Display Advertising
 * Challenge's train.txt and the Terabyte logs), plain or gzip.
 *
 * One example per line, 40 tab-separated fields: the label (0 or 1), 13
 * integer features, 26 categorical features as hexadecimal (8 digits in
 * Criteo's files; up to 16 accepted); any feature may be empty (missing).
 * The reader gives each categorical a 64-bit id that is a mix of its field
 * and value, so equal values of different fields are different rows of a
 * shared table, and a missing value its own id per field.
 */
#ifndef PS_CRITEO_H
#define PS_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#define PS_CTR_NUM 13
#define PS_CTR_CAT 26

struct ps_ctr_example {
	int label;
	int num_missing;              /* bit i: integer feature i was empty */
	int64_t num[PS_CTR_NUM];      /* 0 where missing */
	uint32_t cat_missing;         /* bit i: categorical i was empty */
	uint64_t cat[PS_CTR_CAT];     /* the values as written (0 where missing) */
};

struct ps_criteo;

/* Opens path (gzip when it starts with gzip's magic, else plain). 0, or a
 * negative code with the reason in err. */
int ps_criteo_open(struct ps_criteo **out, const char *path, char *err, size_t errlen);
void ps_criteo_close(struct ps_criteo *r);

/* Reads the next example: 1, 0 at the end, or PS_EPROTO with
 * "FILE:LINE: ..." and the offending text in err (the reader can go on
 * with the next line). */
int ps_criteo_next(struct ps_criteo *r, struct ps_ctr_example *ex, char *err, size_t errlen);

/* The embedding id of categorical field f's value (missing: its own id). */
uint64_t ps_criteo_id(int f, uint64_t value, int missing);

/* Writes ex as one line (with its newline) into buf (at least 512 bytes);
 * returns its length. */
size_t ps_criteo_format(const struct ps_ctr_example *ex, char *buf);

#endif
