/* stats.c - struct ps_shard_stats as a dict: the counters ps-stat shows
 * (and its --json), under the struct's field names.
 */
#include <string.h>
#include "pyps.h"

static int put(PyObject *d, const char *key, PyObject *v)
{
	int rc;

	if (!v)
		return -1;
	rc = PyDict_SetItemString(d, key, v);
	Py_DECREF(v);
	return rc;
}

#define U64(d, s, f) put(d, #f, PyLong_FromUnsignedLongLong((s)->f))
#define INT(d, s, f) put(d, #f, PyLong_FromLong((s)->f))
#define DBL(d, s, f) put(d, #f, PyFloat_FromDouble((s)->f))
#define STR(d, s, f) put(d, #f, PyUnicode_DecodeUTF8((s)->f, (Py_ssize_t)strnlen((s)->f, \
					sizeof((s)->f)), "replace"))

static PyObject *u64_list(const uint64_t *a, int n)
{
	PyObject *l = PyList_New(n);

	for (int i = 0; l && i < n; i++) {
		PyObject *v = PyLong_FromUnsignedLongLong(a[i]);
		if (!v || PyList_SetItem(l, i, v) < 0) {
			Py_DECREF(l);
			return NULL;
		}
	}
	return l;
}

static PyObject *table_dict(const struct ps_table_stats *t)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (STR(d, t, name) || INT(d, t, dim) || U64(d, t, rows) || U64(d, t, bytes) ||
	    U64(d, t, admitted) || U64(d, t, evicted) || U64(d, t, cap_rows) || U64(d, t, expired) ||
	    U64(d, t, filter_ids) || U64(d, t, filter_bytes) || U64(d, t, filter_lookups) ||
	    U64(d, t, filter_hits) || U64(d, t, pulled_rows) || U64(d, t, pushed_rows) ||
	    U64(d, t, version) || U64(d, t, checksum) || DBL(d, t, epoch_unix)) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

PyObject *pyps_stats_dict(const struct ps_shard_stats *s)
{
	PyObject *d = PyDict_New(), *l;
	int nw = s->nworkers < 64 ? s->nworkers : 64;
	int nt = s->ntables < PS_STATS_MAX_TABLES ? s->ntables : PS_STATS_MAX_TABLES;

	if (!d)
		return NULL;
	if (INT(d, s, shard) || DBL(d, s, uptime_s) || U64(d, s, pushes) || U64(d, s, pulls) ||
	    U64(d, s, bytes_in) || U64(d, s, bytes_out) || U64(d, s, applies) ||
	    U64(d, s, errors) || U64(d, s, rejected_frames) || U64(d, s, auth_failures) ||
	    U64(d, s, duplicate_pushes) || U64(d, s, reader_refused) || U64(d, s, reply_queue_bytes) ||
	    U64(d, s, reply_queue_peak) || U64(d, s, reply_queue_total_peak) ||
	    INT(d, s, paused_connections) || DBL(d, s, apply_seconds) || U64(d, s, apply_bytes) ||
	    INT(d, s, connections) || U64(d, s, max_clock_gap) || U64(d, s, param_checksum) ||
	    put(d, "push_raw_bytes", u64_list(s->push_raw_bytes, 8)) ||
	    put(d, "push_wire_bytes", u64_list(s->push_wire_bytes, 8)) ||
	    U64(d, s, pull_raw_bytes) || U64(d, s, pull_wire_bytes) ||
	    put(d, "push_lat", u64_list(s->push_lat, PS_HISTO_BUCKETS)) ||
	    put(d, "pull_lat", u64_list(s->pull_lat, PS_HISTO_BUCKETS)) ||
	    DBL(d, s, push_lat_sum_s) || DBL(d, s, pull_lat_sum_s) ||
	    INT(d, s, checkpoint_status) || STR(d, s, checkpoint_path) ||
	    U64(d, s, checkpoint_bytes) || DBL(d, s, checkpoint_seconds) ||
	    STR(d, s, checkpoint_error) || INT(d, s, checkpoint_on) ||
	    DBL(d, s, checkpoint_age_s) || U64(d, s, checkpoint_failures) ||
	    INT(d, s, checkpoint_every_s) || INT(d, s, repl_state) || U64(d, s, repl_epoch) ||
	    STR(d, s, repl_partner) || INT(d, s, repl_partner_up) || U64(d, s, repl_lag) ||
	    U64(d, s, repl_failovers) || U64(d, s, repl_lsn) || INT(d, s, repl_replica) ||
	    U64(d, s, repl_batches) || U64(d, s, repl_bytes) || U64(d, s, repl_heartbeats) ||
	    INT(d, s, nworkers) || put(d, "worker_clock", u64_list(s->worker_clock, nw)) ||
	    put(d, "dedup_seq", u64_list(s->dedup_seq, nw)) ||
	    put(d, "dedup_digest", u64_list(s->dedup_digest, nw)))
		goto err;
	l = PyList_New(nw);
	for (int i = 0; l && i < nw; i++)
		if (PyList_SetItem(l, i, PyBool_FromLong(s->worker_up[i])) < 0) {
			Py_CLEAR(l);
		}
	if (put(d, "worker_up", l))
		goto err;
	l = PyList_New(s->nmembers < 64 ? s->nmembers : 64);
	for (int i = 0; l && i < s->nmembers && i < 64; i++)
		if (PyList_SetItem(l, i, PyLong_FromLong(s->members[i])) < 0)
			Py_CLEAR(l);
	if (put(d, "members", l) || U64(d, s, member_epoch) || U64(d, s, member_current) ||
	    U64(d, s, joins) || U64(d, s, leaves))
		goto err;
	/* re-sharding: the map epoch, what a --reshard-from start took in, a
	 * live re-shard's stop; the joins and leaves under way, rank: clock */
	if (U64(d, s, map_epoch) || U64(d, s, reshard_in_bytes) || U64(d, s, reshard_in_slices) ||
	    U64(d, s, reshard_in_rows) || U64(d, s, stop_at) || INT(d, s, stop_committed) ||
	    U64(d, s, top_clock))
		goto err;
	/* what the workers declared at run time (0: nothing) */
	if (U64(d, s, decl_digest) || INT(d, s, decl_tensors) || INT(d, s, decl_tables))
		goto err;
	for (int w = 0; w < 2; w++) {
		int n = w ? s->nleaving : s->njoining;
		const int *rk = w ? s->leaving : s->joining;
		const uint64_t *ck = w ? s->leaving_clock : s->joining_clock;
		PyObject *m = PyDict_New();

		for (int i = 0; m && i < n && i < 16; i++) {
			PyObject *k = PyLong_FromLong(rk[i]);
			PyObject *v = PyLong_FromUnsignedLongLong(ck[i]);
			if (!k || !v || PyDict_SetItem(m, k, v) < 0)
				Py_CLEAR(m);
			Py_XDECREF(k);
			Py_XDECREF(v);
		}
		if (put(d, w ? "leaving" : "joining", m))
			goto err;
	}
	l = PyList_New(nt);
	for (int i = 0; l && i < nt; i++) {
		PyObject *t = table_dict(&s->tables[i]);
		if (!t || PyList_SetItem(l, i, t) < 0)
			Py_CLEAR(l);
	}
	if (put(d, "tables", l))
		goto err;
	return d;
err:
	Py_DECREF(d);
	return NULL;
}
