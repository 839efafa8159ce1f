/* worker_cmd.c - ps-worker --exec CMD: the worker process becomes the
 * parent of a user's command (a Python training script, say), handing it
 * the config and rank through the environment. The launchers recognise
 * and stop workers by ps-worker's command line (ps-cluster.sh's status
 * and stop), so ps-worker stays as the parent and passes signals on,
 * rather than exec'ing the command in its place.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "worker_cmd.h"

static volatile sig_atomic_t child_pid;

static void forward(int sig)
{
	if (child_pid > 0)
		kill(child_pid, sig);
}

int ps__worker_exec(const char *cmd, const char *config, int rank, int nworkers,
		    const char *secret)
{
	char path[PATH_MAX], num[32];
	struct sigaction sa;
	pid_t pid;
	int st;

	if (!realpath(config, path)) {
		fprintf(stderr, "ps-worker: --exec: %s: %s\n", config, strerror(errno));
		return 127;
	}
	if (setenv("PS_CONFIG", path, 1) ||
	    (snprintf(num, sizeof(num), "%d", rank), setenv("PS_RANK", num, 1)) ||
	    (snprintf(num, sizeof(num), "%d", nworkers), setenv("PS_NUM_WORKERS", num, 1)) ||
	    (secret && setenv("PS_SECRET_FILE", secret, 1))) {
		fprintf(stderr, "ps-worker: --exec: setenv: %s\n", strerror(errno));
		return 127;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "ps-worker: --exec: fork: %s\n", strerror(errno));
		return 127;
	}
	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		fprintf(stderr, "ps-worker: --exec: /bin/sh: %s\n", strerror(errno));
		_exit(127);
	}
	child_pid = pid;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			fprintf(stderr, "ps-worker: --exec: waitpid: %s\n", strerror(errno));
			return 127;
		}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
