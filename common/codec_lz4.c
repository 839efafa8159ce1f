/* codec_lz4.c - the lossless LZ4 stage that follows a codec (docs/architecture.md, Interfaces).
 *
 * Layout: one LZ4 block (liblz4's raw block format, no frame header, no
 * checksum; the frame around it carries lengths and a MAC). The expanded
 * length is not stored: the receiver knows it from the frame metadata and
 * passes it as `expect`, and a block that expands to any other length is
 * refused.
 *
 * pack() asks liblz4 for at most len - 1 bytes of output, so a payload that
 * does not shrink (random-looking float mantissas often do not) costs one
 * aborted pass and returns 0: the caller sends it raw, without the flag.
 * unpack() writes into dst as it decodes: on failure dst holds garbage, which
 * is why it is a scratch buffer and never the accumulator.
 */
#include <limits.h>
#include <lz4.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

size_t ps_lz4_bound(size_t len)
{
	/* LZ4_COMPRESSBOUND, in size_t so it cannot overflow an int. */
	return len + len / 255 + 16;
}

size_t ps_lz4_pack(const void *src, size_t len, void *dst, size_t cap)
{
	size_t limit;
	int r;

	if (len == 0 || len > LZ4_MAX_INPUT_SIZE)
		return 0;
	/* at most len - 1 bytes: a result that does not shrink is not wanted,
	 * and LZ4 stops as soon as it cannot stay under the limit */
	limit = cap < len - 1 ? cap : len - 1;
	_Static_assert(LZ4_MAX_INPUT_SIZE <= INT_MAX, "limit < len fits an int");
	r = LZ4_compress_default(src, dst, (int)len, (int)limit);
	if (r <= 0 || (size_t)r >= len)
		return 0;
	return (size_t)r;
}

int ps_lz4_unpack(const void *src, size_t len, void *dst, size_t expect, char *err,
		  size_t errlen)
{
	int r;

	if (len == 0)
		return ps__codec_fail(err, errlen, "lz4: empty block");
	if (len > INT_MAX || expect > INT_MAX)
		return ps__codec_fail(err, errlen, "lz4: block of %zu bytes expanding to %zu is "
				      "beyond the 2 GiB limit of LZ4 blocks", len, expect);
	r = LZ4_decompress_safe(src, dst, (int)len, (int)expect);
	if (r < 0)
		return ps__codec_fail(err, errlen, "lz4: malformed block of %zu bytes, or it expands "
				      "to more than the %zu expected", len, expect);
	if ((size_t)r != expect)
		return ps__codec_fail(err, errlen, "lz4: block expands to %d bytes, expected %zu", r,
				      expect);
	return 0;
}
