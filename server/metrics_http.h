/* metrics_http.h - a shard's Prometheus endpoint (config `stats.http`).
 *
 * libmicrohttpd serves GET /metrics (Prometheus text exposition 0.0.4) and
 * GET /healthz from its own thread. The counters belong to the shard's loop
 * thread, so a request never reads them directly: it asks the loop (a
 * uv_async_t) to render the page, waits for it (at most 2 s), and serves
 * that copy. /healthz reads a beat the loop sets every 250 ms instead: 200
 * "ok" while it is under 2 s old, 503 after, and nothing asked of the loop.
 * /readyz (a Kubernetes readiness probe) is /healthz and, with
 * cluster.replicas, a settled role (primary, or a backup holding the
 * primary's state): 503 naming the partner while joining. Neither exists
 * before the shard has loaded its checkpoint and listens.
 * One client address holds at most 8 of the 64 connections; a request
 * header must be in within 5 s of its connection or last reply.
 */
#ifndef PS_METRICS_HTTP_H
#define PS_METRICS_HTTP_H

#include <stddef.h>
#include <stdio.h>

struct ps_server;
struct ps_metrics_http;

/* Listens on host:port (numeric address or name) and starts serving.
 * Call on the loop thread after ps_server_init_from. 0, or a negative code
 * (logged with the address). */
int ps_metrics_http_start(struct ps_server *s, const char *host, int port,
			  struct ps_metrics_http **out);

/* Stops serving (requests in flight get 503) and frees h. Loop thread. */
void ps_metrics_http_stop(struct ps_metrics_http *h);

/* Writes the shard's metrics in Prometheus text format to f (loop thread).
 * Exposed for tests and for ps-server --dump-metrics style tools. */
void ps_metrics_render(const struct ps_server *s, FILE *f);

#endif
