/* pusher.c - the worker's push thread (pusher.h).
 *
 * One job at a time: begin() publishes (gen, clock), the thread waits for
 * each gradient pair of that backward pass in push order (last layer
 * first), pushes it, and end() waits for the job to finish. The first
 * layer's pair is pushed last and ends the clock (PS_PUSH_END_CLOCK). */
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
	uint64_t done;                /* the last pass finished */
	int stop;
	int rc;                       /* the job's outcome */
	char err[512];
	struct ps_tensor (*t)[2];     /* per pair: must outlive the push */
	int64_t *ids;
	int nids;
};

/* Pushes the pairs of pass gen; 0 or the first error (reason in p->err). */
static int push_pass(struct ps_pusher *p, uint64_t gen, uint64_t clock)
{
	const struct ps_config *cfg = p->cfg;
	struct ps_net *net = p->net;
	int wt, bt, rc;

	p->nids = 0;
	for (int k = 0; k < net->ngrads; k++) {
		if ((rc = ps_net_grad_wait(net, gen, k, &wt, &bt))) {
			snprintf(p->err, sizeof(p->err), "%s", net->err);
			return rc;
		}
		p->t[k][0] = (struct ps_tensor){ cfg->tensors[wt].name, net->host_g[wt],
						 cfg->tensors[wt].count, 0 };
		p->t[k][1] = (struct ps_tensor){ cfg->tensors[bt].name, net->host_g[bt],
						 cfg->tensors[bt].count, 0 };
		unsigned flags = k == net->ngrads - 1 ? PS_PUSH_END_CLOCK : 0;
		int64_t id = ps_client_push(p->cli, clock, p->t[k], 2, flags);
		if (id < 0) {
			snprintf(p->err, sizeof(p->err), "push at clock %llu: %s",
				 (unsigned long long)clock, ps_client_error(p->cli));
			return (int)id;
		}
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
		pthread_mutex_unlock(&p->mu);
		int rc = push_pass(p, gen, clock);
		pthread_mutex_lock(&p->mu);
		p->rc = rc;
		p->done = gen;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
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
	if (!p->t || !p->ids)
		goto err_free_p;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	rc = pthread_create(&p->thread, NULL, run, p);
	if (rc) {
		snprintf(err, errlen, "cannot start the push thread: %s", strerror(rc));
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		free(p->t);
		free(p->ids);
		free(p);
		return -rc;
	}
	*out = p;
	return 0;

err_free_p:
	free(p->t);
	free(p->ids);
	free(p);
err_nomem:
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

void ps_pusher_begin(struct ps_pusher *p, uint64_t gen, uint64_t clock)
{
	pthread_mutex_lock(&p->mu);
	p->gen = gen;
	p->clock = clock;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int ps_pusher_end(struct ps_pusher *p, const int64_t **ids, int *nids, char *err, size_t errlen)
{
	int rc;

	pthread_mutex_lock(&p->mu);
	while (p->done != p->gen)
		pthread_cond_wait(&p->cv, &p->mu);
	rc = p->rc;
	if (rc)
		snprintf(err, errlen, "%s", p->err);
	*ids = p->ids;
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
	free(p->t);
	free(p->ids);
	free(p);
}
