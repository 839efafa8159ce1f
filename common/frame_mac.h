/* frame_mac.h - the MAC and sequence number of every frame on an
 * authenticated connection (docs/security.md).
 *
 * Each direction of a connection has its own 32-byte key (auth.h derives
 * both from the shared secret and the handshake). Frame n of a direction
 * (n counts from 0 when the keys are set) is authenticated with Poly1305
 * under a one-time key, the first 32 bytes of ChaCha20(key, nonce n): the
 * construction of ChaCha20-Poly1305, without encryption. The tag covers the
 * 24-byte header (type, flags, lengths and the low 32 bits of n), the
 * metadata and the payload, so an altered byte, a replayed, dropped or
 * reordered frame, or a frame from another connection fails the check.
 * Incremental, so a receiver folds the bytes in as they arrive.
 *
 * The one-time key comes from libsodium's ChaCha20; Poly1305 itself from
 * OpenSSL's libcrypto, whose AVX2 code runs at 5.5 GB/s on the CI machine
 * against 2.3 GB/s for libsodium 1.0.18's (BENCHMARKS.md): the MAC is on
 * every byte pushed and pulled.
 */
#ifndef PS_FRAME_MAC_H
#define PS_FRAME_MAC_H

#include <stddef.h>
#include <stdint.h>

#define PS_MAC_KEY_LEN 32

/* The two keys of one end of a connection, and what they protect frames
 * with: cipher -1, this MAC; else an enum ps_cipher, whose AEAD records
 * (frame_aead.h) encrypt and authenticate frames in its place. */
struct ps_frame_keys {
	uint8_t send[PS_MAC_KEY_LEN];
	uint8_t recv[PS_MAC_KEY_LEN];
	int cipher;
};

/* One MAC computation at a time; reusable for frame after frame. */
struct ps_mac {
	void *ctx;   /* OpenSSL EVP_MAC_CTX */
	int failed;  /* an EVP_MAC call of this tag failed: the tag never verifies */
};

/* Allocates m's state: 0 or -ENOMEM. ps_mac_free releases it (NULL-safe). */
int ps_mac_init(struct ps_mac *m);
void ps_mac_free(struct ps_mac *m);

/* Starts the tag of frame seq under key. */
void ps_mac_begin(struct ps_mac *m, const uint8_t key[PS_MAC_KEY_LEN], uint64_t seq);
void ps_mac_update(struct ps_mac *m, const void *p, size_t n);
/* Writes the 16-byte tag (PS_MAC_TAG_LEN). */
void ps_mac_end(struct ps_mac *m, uint8_t *tag);
/* 0 when tag (16 bytes) is the frame's tag, compared in constant time;
 * -1 otherwise. */
int ps_mac_verify(struct ps_mac *m, const uint8_t *tag);

#endif
