/* frame_aead.c - AEAD records of frames (AES-256-GCM or ChaCha20-Poly1305,
 * from OpenSSL's libcrypto). */
#include <errno.h>
#include <string.h>
#include <openssl/evp.h>
#include "frame_aead.h"
#include "wire.h"

#define NONCE_LEN 12

_Static_assert(PS_MAC_TAG_LEN == 16, "the AEAD tag takes the MAC's place");

const char *const ps_cipher_names[PS_CIPHER_COUNT_ + 1] = { "aes-256-gcm", "chacha20-poly1305",
							     NULL };

const char *ps_cipher_name(int c)
{
	return c >= 0 && c < PS_CIPHER_COUNT_ ? ps_cipher_names[c] : "an unknown cipher";
}

int ps_aead_init(struct ps_aead *a)
{
	a->ctx = EVP_CIPHER_CTX_new();
	a->enc = 0;
	a->failed = 1; /* no key yet: nothing verifies */
	return a->ctx ? 0 : -ENOMEM;
}

void ps_aead_free(struct ps_aead *a)
{
	EVP_CIPHER_CTX_free(a->ctx); /* clears the key schedule */
	a->ctx = NULL;
}

int ps_aead_set_key(struct ps_aead *a, int cipher, const uint8_t key[PS_AEAD_KEY_LEN], int enc)
{
	const EVP_CIPHER *ev = cipher == PS_CIPHER_AES256GCM ? EVP_aes_256_gcm()
			     : cipher == PS_CIPHER_CHACHA20POLY1305 ? EVP_chacha20_poly1305()
			     : NULL;

	a->failed = 1;
	if (!ev)
		return -EINVAL;
	if (!a->ctx || EVP_CipherInit_ex(a->ctx, ev, NULL, NULL, NULL, enc) != 1 ||
	    EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_IVLEN, NONCE_LEN, NULL) != 1 ||
	    EVP_CipherInit_ex(a->ctx, NULL, NULL, key, NULL, enc) != 1)
		return -ENOMEM;
	a->enc = enc;
	return 0;
}

void ps_aead_begin(struct ps_aead *a, uint64_t seq, const uint8_t *hdr, size_t hdr_len)
{
	uint8_t nonce[NONCE_LEN] = { 0 };
	int len;

	for (int i = 0; i < 8; i++)
		nonce[4 + i] = (uint8_t)(seq >> (8 * i));
	/* the key stays; only the nonce changes (-1: keep the direction) */
	a->failed = !a->ctx || EVP_CipherInit_ex(a->ctx, NULL, NULL, NULL, nonce, -1) != 1 ||
		    EVP_CipherUpdate(a->ctx, NULL, &len, hdr, (int)hdr_len) != 1;
}

void ps_aead_update(struct ps_aead *a, uint8_t *out, const uint8_t *in, size_t n)
{
	while (n && !a->failed) {
		int chunk = n > (1u << 30) ? 1 << 30 : (int)n, len = 0;

		if (EVP_CipherUpdate(a->ctx, out, &len, in, chunk) != 1 || len != chunk)
			a->failed = 1; /* a stream cipher returns what it was given */
		out += chunk;
		in += chunk;
		n -= (size_t)chunk;
	}
}

void ps_aead_seal_end(struct ps_aead *a, uint8_t *tag)
{
	uint8_t rest[32];
	int len = 0;

	if (a->failed || !a->enc || EVP_CipherFinal_ex(a->ctx, rest, &len) != 1 || len != 0 ||
	    EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, PS_MAC_TAG_LEN, tag) != 1)
		memset(tag, 0, PS_MAC_TAG_LEN); /* cannot match a real tag but by chance */
}

int ps_aead_open_end(struct ps_aead *a, const uint8_t *tag)
{
	uint8_t rest[32];
	int len = 0;

	if (a->failed || a->enc)
		return -1;
	/* the ctrl takes a non-const pointer and only reads it */
	if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, PS_MAC_TAG_LEN, (void *)tag) != 1)
		return -1;
	return EVP_CipherFinal_ex(a->ctx, rest, &len) == 1 && len == 0 ? 0 : -1;
}
