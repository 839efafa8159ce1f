/* msg.h - protobuf-c metadata on top of a transport.
 *
 * Pairs each frame type with its protobuf-c descriptor, packs a message and
 * sends it with an optional raw payload, and unpacks a received frame's
 * metadata after checking that the frame type matches.
 */
#ifndef PS_MSG_H
#define PS_MSG_H

#include "ps.pb-c.h"
#include "transport.h"

/* Descriptor of the metadata message of frame type `type`, or NULL. */
const ProtobufCMessageDescriptor *ps_msg_descriptor(unsigned type);

/* Packs m and sends it as a frame of `type` with payload pieces (see
 * ps_transport_ops.send for flags, cb and ownership). */
int ps_msg_send(struct ps_conn *c, unsigned type, const ProtobufCMessage *m,
		const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		void *arg);

/* Sends an Error frame for req_id with code and a formatted message. */
int ps_msg_send_error(struct ps_conn *c, uint64_t req_id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Unpacks f's metadata as the message its type names. Returns NULL (and
 * the reason in why) when it does not decode, or when unpacked it would
 * take more than 32 times its size plus 4 KiB (a budget allocator bounds
 * what one frame can make a peer allocate). Free with
 * protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *ps_msg_unpack(const struct ps_frame *f, char *why, size_t whylen);

#endif
