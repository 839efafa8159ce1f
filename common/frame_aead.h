/* frame_aead.h - encrypted frames (security.encrypt, docs/security.md).
 *
 * With encryption on, every frame after the handshake is one AEAD record
 * instead of a MACed frame: the 24-byte header stays in clear and is the
 * associated data (its lengths are needed to read the frame), the metadata
 * and payload are encrypted, and the 16-byte tag follows them where the MAC
 * would be. The key is the direction's session key (auth.h), the 96-bit
 * nonce is 4 zero bytes then the frame's 64-bit sequence number, little
 * endian, so a nonce is never used twice under one key; a replayed, dropped
 * or reordered frame fails as it does with MACs.
 *
 * The cipher is OpenSSL's AES-256-GCM or ChaCha20-Poly1305 (security.cipher;
 * BENCHMARKS.md has both measured here). Incremental and in place, so a
 * receiver decrypts the bytes as they arrive and a sender encrypts into the
 * buffer that goes to the socket. Nothing decrypted is handed on before the
 * tag checks.
 */
#ifndef PS_FRAME_AEAD_H
#define PS_FRAME_AEAD_H

#include <stddef.h>
#include <stdint.h>

#define PS_AEAD_KEY_LEN 32

/* security.cipher; on the wire (Hello field auth_cipher) as this value + 1,
 * 0 meaning "not encrypted". */
enum ps_cipher {
	PS_CIPHER_AES256GCM = 0,
	PS_CIPHER_CHACHA20POLY1305 = 1,
	PS_CIPHER_COUNT_
};

/* The ciphers' names in enum order, NULL-terminated (the config's values
 * of security.cipher). */
extern const char *const ps_cipher_names[PS_CIPHER_COUNT_ + 1];

/* The name of cipher c ("aes-256-gcm"), or "an unknown cipher". */
const char *ps_cipher_name(int c);

/* One direction's cipher state, reused frame after frame. */
struct ps_aead {
	void *ctx;   /* OpenSSL EVP_CIPHER_CTX */
	int enc;     /* 1: seals frames, 0: opens them */
	int failed;  /* an EVP call of this frame failed: its tag never verifies */
};

/* Allocates a's state: 0 or -ENOMEM. ps_aead_free releases it (NULL-safe,
 * and safe on a zeroed struct). */
int ps_aead_init(struct ps_aead *a);
void ps_aead_free(struct ps_aead *a);

/* Loads key for cipher, to seal (enc 1) or open (enc 0) the frames of one
 * direction: 0, or -EINVAL for an unknown cipher, -ENOMEM when OpenSSL
 * cannot set it up. Call again for a new key. */
int ps_aead_set_key(struct ps_aead *a, int cipher, const uint8_t key[PS_AEAD_KEY_LEN], int enc);

/* Starts frame seq with its header (the associated data). */
void ps_aead_begin(struct ps_aead *a, uint64_t seq, const uint8_t *hdr, size_t hdr_len);
/* Encrypts or decrypts n bytes from in to out (out == in allowed). */
void ps_aead_update(struct ps_aead *a, uint8_t *out, const uint8_t *in, size_t n);
/* Sealing: writes the 16-byte tag (zeros when a call failed). */
void ps_aead_seal_end(struct ps_aead *a, uint8_t *tag);
/* Opening: 0 when tag is the frame's tag (OpenSSL compares in constant
 * time), -1 otherwise. */
int ps_aead_open_end(struct ps_aead *a, const uint8_t *tag);

#endif
