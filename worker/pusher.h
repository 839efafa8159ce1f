/* pusher.h - the worker's push thread: pushes each layer's gradients as
 * soon as the backward pass has them in host memory (ps_net_grad_wait),
 * so encoding and sending overlap the layers still being differentiated
 * and the thread that queues the compute never waits for the device; with
 * train.pull: layer, each push carries the pull of that layer's weights
 * for the next step. */
#ifndef PS_PUSHER_H
#define PS_PUSHER_H

#include <stdint.h>
#include "net.h"
#include "config.h"
#include "ps_client.h"

struct ps_pusher;

/* Starts the thread for net's gradients through cli. */
int ps_pusher_start(struct ps_pusher **out, struct ps_client *cli, struct ps_net *net,
		    const struct ps_config *cfg, char *err, size_t errlen);
/* Hands over backward pass gen (from ps_net_backward) to push at clock,
 * its clock-ending push leaving the membership when leave is set
 * (PS_PUSH_LEAVE); returns at once. May be called before
 * ps_net_backward(gen) itself. */
void ps_pusher_begin(struct ps_pusher *p, uint64_t gen, uint64_t clock, int leave);
/* Waits until every gradient pair of the pass has been handed to the
 * client; *ids, *nids: the push requests to ps_client_wait for, in push
 * order, and (pulls not NULL) *pulls: with train.pull: layer the pull of
 * each pair's weights into host_w for the next step, else 0s (valid until
 * the next begin). 0, or the first error with the reason in err (nothing
 * after a failed pair is pushed; requests already sent are in *ids). */
int ps_pusher_end(struct ps_pusher *p, const int64_t **ids, const int64_t **pulls, int *nids,
		  char *err, size_t errlen);
/* Stops and joins the thread (after an end, or abandoning a pass). */
void ps_pusher_stop(struct ps_pusher *p);

#endif
