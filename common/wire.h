/* wire.h - the fixed frame header (docs/protocol.md).
 *
 *  offset size field
 *  0      4    magic "PSF1" (0x31465350 little-endian)
 *  4      1    protocol version (PS_PROTOCOL_VERSION)
 *  5      1    message type (enum ps_msg_type)
 *  6      2    flags (PS_FRAME_F_*)
 *  8      4    metadata length (protobuf-c message bytes)
 *  12     4    sequence number (low 32 bits) with flag MAC, else 0
 *  16     8    payload length (raw bytes after the metadata)
 * With flag MAC (an authenticated connection, see frame_mac.h) a 16-byte
 * Poly1305 tag follows the payload; it is not counted in payload length.
 * All integers little-endian. ps_wire_check() validates a decoded header
 * against the limits before any buffer is allocated for the frame body.
 */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define PS_WIRE_MAGIC 0x31465350u
#define PS_PROTOCOL_VERSION 1
/* The largest clock a peer may name (Hello.done_clock) or a checkpoint
 * hold, plus one: far past any run, and clock arithmetic stays far from
 * wrapping (and exact in a double). */
#define PS_MAX_CLOCK (UINT64_C(1) << 53)
#define PS_WIRE_HDR_LEN 24
/* Frames before the handshake completes are at most this big. */
#define PS_WIRE_HANDSHAKE_MAX 4096

enum ps_msg_type {
	PS_MSG_HELLO = 1,
	PS_MSG_HELLO_REPLY = 2,
	PS_MSG_PUSH = 3,
	PS_MSG_PUSH_ACK = 4,
	PS_MSG_PULL = 5,
	PS_MSG_PULL_REPLY = 6,
	PS_MSG_ERROR = 7,
	PS_MSG_STATS_REQUEST = 8,
	PS_MSG_STATS = 9,
	PS_MSG_HEARTBEAT = 10,
	PS_MSG_AUTH_CHALLENGE = 11,
	PS_MSG_AUTH = 12,
	PS_MSG_PULL_ROWS = 13,
	PS_MSG_PULL_ROWS_REPLY = 14,
	PS_MSG_PUSH_ROWS = 15,
	PS_MSG_REPL_BATCH = 16,
	PS_MSG_REPL_ACK = 17,
	PS_MSG_REPL_SNAPSHOT = 18,
	PS_MSG_DECLARE = 19,
	PS_MSG_DECLARE_TABLES = 20,
	PS_MSG_MAX_ = 21
};

enum {
	PS_FRAME_F_LZ4 = 1u << 0, /* payload LZ4-compressed */
	PS_FRAME_F_MAC = 1u << 1, /* sequence number in the header, MAC after the payload */
	PS_FRAME_F_ENC = 1u << 2, /* with F_MAC: metadata and payload encrypted, the MAC an
				   * AEAD tag (frame_aead.h) */
};
#define PS_FRAME_F_KNOWN (PS_FRAME_F_LZ4 | PS_FRAME_F_MAC | PS_FRAME_F_ENC)
#define PS_MAC_TAG_LEN 16

struct ps_frame_hdr {
	uint8_t version;
	uint8_t type;
	uint16_t flags;
	uint32_t meta_len;
	uint32_t seq;         /* low 32 bits of the sender's frame count (flag MAC) */
	uint64_t payload_len;
};

/* Limits a receiver enforces on each frame header. */
struct ps_wire_limits {
	uint64_t max_frame;  /* meta + payload */
	uint32_t max_meta;
	/* Backpressure (transport.h): a connection stops reading frames while
	 * more than max_queue bytes it was sent wait to leave; the transport's
	 * own limits (at create) also bound all connections together with
	 * max_queue_total. 0 = no bound. */
	uint64_t max_queue;
	uint64_t max_queue_total;
};

void ps_wire_encode_hdr(uint8_t out[PS_WIRE_HDR_LEN], const struct ps_frame_hdr *h);

/* Decodes and validates 24 bytes. Returns 0, or PS_EPROTO (bad magic,
 * reserved bits, unknown type or flags), PS_EVERSION, PS_ETOOBIG; on error
 * writes a one-line reason into why (whylen bytes) naming the values. */
int ps_wire_decode_hdr(const uint8_t in[PS_WIRE_HDR_LEN], const struct ps_wire_limits *lim,
		       struct ps_frame_hdr *h, char *why, size_t whylen);

const char *ps_wire_type_name(unsigned type);

#endif
