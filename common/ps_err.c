/* ps_err.c - names for error codes. */
#include <string.h>
#include "ps_err.h"

const char *ps_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case PS_ECONFIG: return "invalid configuration";
	case PS_EPROTO: return "protocol error";
	case PS_EVERSION: return "protocol version mismatch";
	case PS_EMAP: return "shard map mismatch";
	case PS_ETOOBIG: return "length exceeds the configured limit";
	case PS_ENOTSUP: return "not supported in this build or on this machine";
	case PS_ECLOSED: return "connection closed";
	case PS_ETIMEDOUT: return "timed out";
	case PS_EREFUSED: return "refused by peer";
	case PS_ENOTENSOR: return "unknown tensor";
	case PS_ESHAPE: return "tensor size mismatch";
	case PS_ESTATE: return "invalid state for this call";
	case PS_ECLOCK: return "clock outside the accepted window";
	case PS_EDUP: return "duplicate push for this clock";
	case PS_ENOFINITE: return "value not finite";
	case PS_EAUTH: return "authentication failed";
	case PS_ERESOLVE: return "the host name did not resolve to an address";
	case PS_ERESHARD: return "the shard stops for a re-shard (the push is sent again on the new map)";
	default:
		break;
	}
	if (err < 0 && err > -4096)
		return strerror(-err);
	return "unknown error";
}
