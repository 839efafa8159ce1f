/* fuzz_rows.c - libFuzzer target: the delta-varint id decoding of row
 * requests (rows_wire.h). Bytes 0-1 give the id count; the rest are the
 * ids, copied to an exact-size buffer so reads past it are caught. A
 * decode that succeeds must give strictly increasing ids that encode back
 * to exactly the same bytes (the coding has one spelling per id list). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "rows_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[200];
	size_t n, len;
	uint8_t *p, *back;
	uint64_t *ids;

	if (size < 2)
		return 0;
	n = (size_t)data[0] | (size_t)data[1] << 8;
	len = size - 2;
	p = malloc(len ? len : 1);
	ids = malloc(sizeof(uint64_t) * (n ? n : 1));
	back = malloc(n * PS_VARINT_MAX + 1);
	if (!p || !ids || !back)
		goto out;
	memcpy(p, data + 2, len);
	if (ps_rows_ids_decode(p, len, n, ids, why, sizeof(why)) == 0) {
		for (size_t i = 1; i < n; i++)
			if (ids[i] <= ids[i - 1])
				abort();
		if (ps_rows_ids_encode(ids, n, back) != len || memcmp(back, p, len))
			abort();
	}
out:
	free(p);
	free(ids);
	free(back);
	return 0;
}
