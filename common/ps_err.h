/* ps_err.h - error codes shared by every module.
 *
 * Functions return 0 on success or a negative code: -errno where one fits,
 * otherwise one of the PS_E* values below (all below -4096 so they never
 * collide with errno values). ps_strerror() names either kind.
 */
#ifndef PS_ERR_H
#define PS_ERR_H

#include <errno.h>

enum {
	PS_EBASE = -5000,
	PS_ECONFIG,      /* configuration file invalid */
	PS_EPROTO,       /* peer broke the wire protocol */
	PS_EVERSION,     /* protocol version mismatch */
	PS_EMAP,         /* shard map hash mismatch */
	PS_ETOOBIG,      /* a length exceeds the configured limit */
	PS_ENOTSUP,      /* feature not built in or not available here */
	PS_ECLOSED,      /* connection closed */
	PS_ETIMEDOUT,    /* request or connect timed out */
	PS_EREFUSED,     /* handshake refused by the peer */
	PS_ENOTENSOR,    /* unknown tensor name or id */
	PS_ESHAPE,       /* tensor size mismatch */
	PS_ESTATE,       /* call not valid in the current state */
	PS_ECLOCK,       /* clock out of the accepted window */
	PS_EDUP,         /* duplicate push for the same clock and slice */
	PS_ENOFINITE,    /* value is NaN or infinite */
	PS_EAUTH,        /* authentication failed: wrong or missing secret, bad MAC */
	PS_ERESOLVE,     /* a host name did not resolve to an address */
	PS_ERESHARD,     /* the shard stops for a re-shard: push again on the new map */
	PS_ELAST
};

/* Returns a static description of a 0/-errno/PS_E* code. Never NULL. */
const char *ps_strerror(int err);

#endif
