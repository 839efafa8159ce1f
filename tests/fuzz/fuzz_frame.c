/* fuzz_frame.c - libFuzzer target: a received frame as a shard sees it.
 * Inputs starting with 0xff are the bytes on the wire as they are; others
 * carry a valid header built from their first 5 bytes (type, flags, metadata
 * length) so the fuzzer spends its time past the magic: the header is checked against
 * limits, the metadata unpacked as the message its type names (Hello, Push,
 * Pull, Stats...), and for a Push every slice reference is bounds-checked
 * against the payload and decoded by its codec, as the shard does. Any
 * crash, sanitizer report or leak is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "msg.h"
#include "wire.h"

static void frame_free(struct ps_frame *f)
{
	(void)f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 1 << 16 };
	struct ps_frame f = { .release = frame_free };
	ProtobufCMessage *m;
	char why[256], err[256];
	uint8_t *body;

	uint8_t hdr[PS_WIRE_HDR_LEN];
	const uint8_t *src;     /* where the frame's body starts in the input */
	size_t avail;           /* and how many bytes of it there are */

	if (size < 5)
		return 0;
	if (data[0] == 0xff) {
		data++;
		size--;
		if (size < PS_WIRE_HDR_LEN)
			return 0;
		memcpy(hdr, data, PS_WIRE_HDR_LEN);
		src = data + PS_WIRE_HDR_LEN;
		avail = size - PS_WIRE_HDR_LEN;
	} else {
		struct ps_frame_hdr h = { .type = data[0], .flags = data[1] & 3,
					  .meta_len = (uint32_t)(data[2] | data[3] << 8) };

		h.payload_len = size - 4 > h.meta_len ? size - 4 - h.meta_len : 0;
		h.payload_len = data[4] & 1 ? h.payload_len : h.payload_len / 2;
		ps_wire_encode_hdr(hdr, &h);
		src = data + 4;
		avail = size - 4;
	}
	if (ps_wire_decode_hdr(hdr, &lim, &f.hdr, why, sizeof(why)) != 0)
		return 0;
	if (avail < f.hdr.meta_len + f.hdr.payload_len)
		return 0; /* the transport would still be waiting for bytes */
	/* an exact-size copy, so reading past the frame is caught */
	body = malloc(f.hdr.meta_len + f.hdr.payload_len + 1);
	if (!body)
		return 0;
	memcpy(body, src, f.hdr.meta_len + f.hdr.payload_len);
	f.meta = body;
	f.payload = body + f.hdr.meta_len;
	m = ps_msg_unpack(&f, why, sizeof(why));
	if (m && f.hdr.type == PS_MSG_PUSH) {
		const Ps__Push *p = (const Ps__Push *)m;

		for (size_t i = 0; i < p->n_slices; i++) {
			const Ps__SliceRef *r = p->slices[i];
			size_t n = 1 + (r->slice % 4096); /* the slice's element count */
			const struct ps_codec_ops *co = ps_codec_get((int)r->codec);
			float *out;

			if (r->offset > f.hdr.payload_len || r->length > f.hdr.payload_len - r->offset)
				continue; /* the shard refuses it here */
			if (!co || !(out = malloc(n * sizeof(float))))
				continue;
			co->decode(f.payload + r->offset, r->length, n, out, err, sizeof(err));
			free(out);
		}
	}
	if (m)
		protobuf_c_message_free_unpacked(m, NULL);
	free(body);
	return 0;
}
