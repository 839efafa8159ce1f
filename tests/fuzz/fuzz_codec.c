/* fuzz_codec.c - libFuzzer target: every gradient decoder and the LZ4
 * stage on arbitrary payloads. Byte 0 picks the decoder (0: LZ4 unpack,
 * 1..: codec kind), bytes 1-2 the slice's element count; the rest is the
 * payload, copied to an exact-size buffer so reads past it are caught.
 * decode and decode_add must both fail cleanly or succeed, and decode_add
 * must write nothing when it fails. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	size_t n, len;
	uint8_t *p;
	float *a, *b;

	if (size < 3)
		return 0;
	n = (size_t)data[1] | (size_t)data[2] << 8;
	len = size - 3;
	p = malloc(len ? len : 1);
	a = calloc(n ? n : 1, sizeof(float));
	b = calloc(n ? n : 1, sizeof(float));
	if (!p || !a || !b)
		goto out;
	memcpy(p, data + 3, len);
	if (data[0] % (PS_CODEC_COUNT + 1) == 0) {
		ps_lz4_unpack(p, len, a, n * sizeof(float), err, sizeof(err));
	} else {
		const struct ps_codec_ops *co = ps_codec_get(data[0] % (PS_CODEC_COUNT + 1) - 1);

		if (co && co->decode(p, len, n, a, err, sizeof(err)) != 0 &&
		    co->decode_add(p, len, n, 1.0f, b, err, sizeof(err)) != 0)
			for (size_t i = 0; i < n; i++)
				if (b[i] != 0.0f)
					abort(); /* a failed decode_add wrote into the sum */
	}
out:
	free(p);
	free(a);
	free(b);
	return 0;
}
