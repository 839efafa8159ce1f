/* frame_mac.c - Poly1305 tags of frames under per-frame one-time keys. */
#include <string.h>
#include "frame_mac.h"
#include "wire.h"

_Static_assert(crypto_onetimeauth_BYTES == PS_MAC_TAG_LEN, "tag length");
_Static_assert(crypto_onetimeauth_KEYBYTES == 32, "one-time key length");
_Static_assert(crypto_stream_chacha20_NONCEBYTES == 8, "nonce length");

void ps_mac_begin(struct ps_mac *m, const uint8_t key[PS_MAC_KEY_LEN], uint64_t seq)
{
	uint8_t nonce[8], otk[32];

	for (int i = 0; i < 8; i++)
		nonce[i] = (uint8_t)(seq >> (8 * i));
	crypto_stream_chacha20(otk, sizeof(otk), nonce, key);
	crypto_onetimeauth_init(&m->st, otk);
	sodium_memzero(otk, sizeof(otk));
}

void ps_mac_update(struct ps_mac *m, const void *p, size_t n)
{
	if (n)
		crypto_onetimeauth_update(&m->st, p, n);
}

void ps_mac_end(struct ps_mac *m, uint8_t *tag)
{
	crypto_onetimeauth_final(&m->st, tag);
	sodium_memzero(&m->st, sizeof(m->st));
}

int ps_mac_verify(struct ps_mac *m, const uint8_t *tag)
{
	uint8_t want[PS_MAC_TAG_LEN];
	int rc;

	ps_mac_end(m, want);
	rc = crypto_verify_16(want, tag);
	sodium_memzero(want, sizeof(want));
	return rc == 0 ? 0 : -1;
}
