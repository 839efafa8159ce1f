/* frame_mac.c - Poly1305 tags of frames under per-frame one-time keys
 * (libsodium ChaCha20 for the key, OpenSSL Poly1305 for the tag). */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <sodium.h>
#include "frame_mac.h"
#include "wire.h"

_Static_assert(crypto_stream_chacha20_NONCEBYTES == 8, "nonce length");

static EVP_MAC *poly1305;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void fetch(void)
{
	if (sodium_init() >= 0)
		poly1305 = EVP_MAC_fetch(NULL, "POLY1305", NULL);
}

int ps_mac_init(struct ps_mac *m)
{
	pthread_once(&once, fetch);
	m->ctx = poly1305 ? EVP_MAC_CTX_new(poly1305) : NULL;
	m->failed = 0;
	return m->ctx ? 0 : -ENOMEM;
}

void ps_mac_free(struct ps_mac *m)
{
	EVP_MAC_CTX_free(m->ctx);
	m->ctx = NULL;
}

void ps_mac_begin(struct ps_mac *m, const uint8_t key[PS_MAC_KEY_LEN], uint64_t seq)
{
	uint8_t nonce[8], otk[32];

	for (int i = 0; i < 8; i++)
		nonce[i] = (uint8_t)(seq >> (8 * i));
	crypto_stream_chacha20(otk, sizeof(otk), nonce, key);
	/* a failed call must not leave the previous frame's key in place: the
	 * tag then fails closed (ps_mac_end, ps_mac_verify) */
	m->failed = EVP_MAC_init(m->ctx, otk, sizeof(otk), NULL) != 1;
	sodium_memzero(otk, sizeof(otk));
}

void ps_mac_update(struct ps_mac *m, const void *p, size_t n)
{
	if (n && EVP_MAC_update(m->ctx, p, n) != 1)
		m->failed = 1;
}

void ps_mac_end(struct ps_mac *m, uint8_t *tag)
{
	size_t len = 0;

	if (EVP_MAC_final(m->ctx, tag, &len, PS_MAC_TAG_LEN) != 1 || len != PS_MAC_TAG_LEN ||
	    m->failed)
		memset(tag, 0, PS_MAC_TAG_LEN); /* cannot match a real tag but by chance */
}

int ps_mac_verify(struct ps_mac *m, const uint8_t *tag)
{
	uint8_t want[PS_MAC_TAG_LEN];
	size_t len = 0;
	int ok;

	ok = EVP_MAC_final(m->ctx, want, &len, sizeof(want)) == 1 && len == sizeof(want) &&
	     !m->failed && crypto_verify_16(want, tag) == 0;
	sodium_memzero(want, sizeof(want));
	return ok ? 0 : -1;
}
