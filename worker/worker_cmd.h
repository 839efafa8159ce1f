/* worker_cmd.h - ps-worker --exec: a user's command as the worker. */
#ifndef PS_WORKER_CMD_H
#define PS_WORKER_CMD_H

/* Runs cmd with /bin/sh -c as worker rank of nworkers, with PS_CONFIG (the
 * absolute path of config), PS_RANK, PS_NUM_WORKERS and, when secret is
 * not NULL, PS_SECRET_FILE in its environment (the Python package reads
 * them). SIGTERM, SIGINT and SIGHUP are passed on to it. Returns its exit
 * status (128 + the signal that ended it), or 127 when it cannot start. */
int ps__worker_exec(const char *cmd, const char *config, int rank, int nworkers,
		    const char *secret);

#endif
