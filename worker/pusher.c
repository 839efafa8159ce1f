/* pusher.c - the worker's push thread (pusher.h).
 *
 * One job at a time: begin() publishes (gen, clock), the thread waits for
 * each gradient pair of that backward pass in push order (last layer
 * first), pushes it, and end() waits for the job to finish. The first
 * layer's pair is pushed last and ends the clock (PS_PUSH_END_CLOCK).
 *
 * With train.pull: layer each pair goes out as a pushpull: the same write
 * carries the pull of that pair's weights for the next step (sync: version
 * clock + 1, which a shard reaches once every worker pushed the layer;
 * async: after this push, staleness bounded as for the next clock). So the
 * last layers' new weights travel while the first layers are still being
 * differentiated and pushed. Tensors no layer owns ride with the last
 * pair's pull. Before the first pull of a pass overwrites host_w, the
 * previous step's upload must have read it (ps_net_weights_wait). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pusher.h"
#include "ps_err.h"

struct ps_pusher {
	struct ps_client *cli;
	struct ps_net *net;
	const struct ps_config *cfg;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t gen, clock;          /* the job: pass gen, pushed at clock */
	int leave;                    /* ... whose clock-ending push leaves (PS_PUSH_LEAVE) */
	uint64_t done;                /* the last pass finished */
	int stop;
	int rc;                       /* the job's outcome */
	char err[512];
	struct ps_tensor (*t)[2];     /* per pair: must outlive the push */
	struct ps_tensor *w;          /* pulls: pair k's at w + 2k, then the extra */
	int *extra;                   /* tensors no layer owns (pulled last) */
	int nextra;
	int64_t *ids, *pids;          /* per pair: push and pull requests */
	int nids;
};

/* Pushes the pairs of pass gen; 0 or the first error (reason in p->err). */
static int push_pass(struct ps_pusher *p, uint64_t gen, uint64_t clock, int leave)
{
	const struct ps_config *cfg = p->cfg;
	struct ps_net *net = p->net;
	int per_layer = cfg->train.pull == PS_PULL_LAYER;
	uint64_t min_version = cfg->consistency == PS_SYNC ? clock + 1 : 0;
	int wt, bt, rc;

	p->nids = 0;
	if (per_layer && (rc = ps_net_weights_wait(net))) {
		snprintf(p->err, sizeof(p->err), "weights upload: %.230s", net->c->err);
		return rc;
	}
	for (int k = 0; k < net->ngrads; k++) {
		int last = k == net->ngrads - 1;
		if ((rc = ps_net_grad_wait(net, gen, k, &wt, &bt))) {
			snprintf(p->err, sizeof(p->err), "%s", net->err);
			return rc;
		}
		p->t[k][0] = ps_tensor_of(cfg, wt, net->host_g[wt]);
		p->t[k][1] = ps_tensor_of(cfg, bt, net->host_g[bt]);
		unsigned flags = last ? PS_PUSH_END_CLOCK | (leave ? PS_PUSH_LEAVE : 0)
				      : PS_PULL_AFTER_CLOCK;
		int64_t id, ids[2] = { 0, 0 };
		if (per_layer) {
			struct ps_tensor *w = p->w + 2 * k;
			int nw = 2 + (last ? p->nextra : 0);
			w[0] = ps_tensor_of(cfg, wt, net->host_w[wt]);
			w[1] = ps_tensor_of(cfg, bt, net->host_w[bt]);
			for (int i = 0; last && i < p->nextra; i++)
				w[2 + i] = ps_tensor_of(cfg, p->extra[i], net->host_w[p->extra[i]]);
			rc = ps_client_pushpull(p->cli, clock, p->t[k], 2, flags, min_version, w, nw,
						ids);
			id = rc ? rc : ids[0];
		} else {
			id = ps_client_push(p->cli, clock, p->t[k], 2,
					    flags & (PS_PUSH_END_CLOCK | PS_PUSH_LEAVE));
		}
		if (id < 0) {
			snprintf(p->err, sizeof(p->err), "push at clock %llu: %s",
				 (unsigned long long)clock, ps_client_error(p->cli));
			return (int)id;
		}
		p->pids[p->nids] = ids[1];
		p->ids[p->nids++] = id;
	}
	return 0;
}

static void *run(void *arg)
{
	struct ps_pusher *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->gen == p->done)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop)
			break;
		uint64_t gen = p->gen, clock = p->clock;
		int leave = p->leave;
		pthread_mutex_unlock(&p->mu);
		int rc = push_pass(p, gen, clock, leave);
		pthread_mutex_lock(&p->mu);
		p->rc = rc;
		p->done = gen;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void free_pusher(struct ps_pusher *p)
{
	free(p->t);
	free(p->w);
	free(p->extra);
	free(p->ids);
	free(p->pids);
	free(p);
}

int ps_pusher_start(struct ps_pusher **out, struct ps_client *cli, struct ps_net *net,
		    const struct ps_config *cfg, char *err, size_t errlen)
{
	struct ps_pusher *p = calloc(1, sizeof(*p));
	int rc;

	*out = NULL;
	if (!p)
		goto err_nomem;
	p->cli = cli;
	p->net = net;
	p->cfg = cfg;
	p->t = calloc((size_t)net->ngrads + 1, sizeof(*p->t));
	p->ids = calloc((size_t)net->ngrads + 1, sizeof(*p->ids));
	p->pids = calloc((size_t)net->ngrads + 1, sizeof(*p->pids));
	p->w = calloc(2 * (size_t)net->ngrads + (size_t)cfg->ntensors, sizeof(*p->w));
	p->extra = calloc((size_t)cfg->ntensors + 1, sizeof(*p->extra));
	if (!p->t || !p->ids || !p->pids || !p->w || !p->extra)
		goto err_free_p;
	for (int i = 0; i < cfg->ntensors; i++)
		if (!net->dev_w[i])
			p->extra[p->nextra++] = i;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	rc = pthread_create(&p->thread, NULL, run, p);
	if (rc) {
		snprintf(err, errlen, "cannot start the push thread: %s", strerror(rc));
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		free_pusher(p);
		return -rc;
	}
	*out = p;
	return 0;

err_free_p:
	free_pusher(p);
err_nomem:
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

void ps_pusher_begin(struct ps_pusher *p, uint64_t gen, uint64_t clock, int leave)
{
	pthread_mutex_lock(&p->mu);
	p->gen = gen;
	p->clock = clock;
	p->leave = leave;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int ps_pusher_end(struct ps_pusher *p, const int64_t **ids, const int64_t **pulls, int *nids,
		  char *err, size_t errlen)
{
	int rc;

	pthread_mutex_lock(&p->mu);
	while (p->done != p->gen)
		pthread_cond_wait(&p->cv, &p->mu);
	rc = p->rc;
	if (rc)
		snprintf(err, errlen, "%s", p->err);
	*ids = p->ids;
	if (pulls)
		*pulls = p->pids;
	*nids = p->nids;
	pthread_mutex_unlock(&p->mu);
	return rc;
}

void ps_pusher_stop(struct ps_pusher *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free_pusher(p);
}
