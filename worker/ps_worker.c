/* ps_worker.c - ps-worker: trains the config's model through the shards.
 *
 *   ps-worker --config F --rank R [--epochs N] [--batch B] [--device cpu|cuda|auto]
 *
 * The ctr preset (click logs, an embedding table) has its own loop in
 * ctr_train.c. Otherwise, per step: forward and backward are queued on the compute backend; the
 * push thread (pusher.c) pushes each layer's gradients as soon as they are
 * in host memory (the first layer's push ends the clock) while this thread
 * prepares the next batch; then the next weights are pulled (sync: the
 * version after this clock; async: whatever the staleness bound allows)
 * and uploaded. The loss is read once per step.
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ps_time.h"
#include "codec.h"
#include "compute.h"
#include "auth.h"
#include "config.h"
#include "dataset.h"
#include "epoch.h"
#include "model_file.h"
#include "ctr_train.h"
#include "net.h"
#include "ps_client.h"
#include "pusher.h"
#include "worker_cmd.h"
#include "stop_signal.h"
#include "ps_err.h"
#include "ps_log.h"
#include "version.h"

static volatile sig_atomic_t g_stop;

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: ps-worker --config FILE --rank R [options]\n"
		"       ps-worker --config FILE --eval MODEL [--device D]\n"
		"\n"
		"Trains the config's model on the training data, pushing gradients to and\n"
		"pulling weights from the config's shards. Each clock's members take the\n"
		"next batches of the epoch's shuffled order, one each in rank order, so\n"
		"workers may join (a rank that is not a member joins when it starts) and\n"
		"leave (SIGTERM: the step's batch is trained, its push leaves, exit 130)\n"
		"while every image of an epoch is trained once; train.epochs counts from\n"
		"clock 0, so a worker started against running shards goes on from their\n"
		"clock. The ctr preset reads train.train_file and train.test_file (click\n"
		"logs in Criteo's format) and pulls and pushes embedding rows as well;\n"
		"its epochs report held-out AUC and logloss instead of accuracy.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE    cluster configuration (YAML), required\n"
		"  -r, --rank R         this worker's rank, 0..workers-1; default: $PS_RANK,\n"
		"                       else $JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)\n"
		"  -e, --epochs N       epochs to train (default: train.epochs)\n"
		"  -b, --batch B        examples per step (default: train.batch)\n"
		"  -d, --device D       cpu, cuda or auto (default: train.device); auto uses\n"
		"                       the GPU when there is one, else the CPU\n"
		"  -n, --limit N        train on the first N images only, 0 = all\n"
		"                       (default: train.limit; every worker must use the same)\n"
		"  -m, --metrics-dir D  folder for worker-R.jsonl (default: train.metrics_dir)\n"
		"  -s, --save-model F   after training, write the final weights to F\n"
		"  -E, --eval F         no training and no servers: report the test accuracy\n"
		"                       of the weights in F (saved by --save-model) for the\n"
		"                       config's model, and exit\n"
		"  -l, --log-level L    debug, info, warn, error or off\n"
		"      --secret-file F  the cluster secret (default: the config's\n"
		"                       security.secret_file, else $PS_SECRET_FILE)\n"
		"      --record-examples F  append one line per step to F: clock, epoch,\n"
		"                       batch slot and the training image (ctr: example)\n"
		"                       indices (tests)\n"
		"  -x, --exec CMD       no training here: run CMD (with /bin/sh -c) as this\n"
		"                       worker, with PS_CONFIG, PS_RANK, PS_NUM_WORKERS (and\n"
		"                       PS_SECRET_FILE from --secret-file) in its environment,\n"
		"                       signals passed on; exits with its status\n"
		"  -h, --help           this text\n"
		"      --version        version, wire protocol, rdma and CUDA plug-in of this build\n"
		"\n"
		"Progress goes to stderr: one updating line on a terminal, plain lines\n"
		"otherwise. Each epoch appends a JSON line (loss, test accuracy, samples/s,\n"
		"MB pushed) to train.metrics_dir/worker-R.jsonl.\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

/* The rank the environment gives when --rank is absent: $PS_RANK (the
 * launchers' --worker-cmd variable), else $JOB_COMPLETION_INDEX (what a
 * Kubernetes Indexed Job gives each pod), *src naming it. *rank untouched
 * when neither is set; -1 after printing the error when the one set is not
 * a rank. */
static int rank_from_env(int *rank, const char **src)
{
	static const char *const vars[] = { "PS_RANK", "JOB_COMPLETION_INDEX" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);

		if (!v || !*v)
			continue;
		if (parse_int(v, 0, 1 << 20, rank)) {
			fprintf(stderr, "ps-worker: $%s: expected a worker rank, got '%s'\n", vars[i], v);
			return -1;
		}
		*src = vars[i];
		return 0;
	}
	return 0;
}

/* Whether host names this machine by a loopback address. */
static int loopback(const char *host)
{
	return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

/* The cpu backend's compute threads (train.threads; docs/architecture.md,
 * Training): as set, or for 0 the cores divided among the workers on this
 * machine. A config whose shards are all on loopback runs every worker
 * here too (scripts/ps-local.sh); otherwise a worker is taken to have the
 * machine to itself. OMP_NUM_THREADS, where set, is the backend's own
 * default and wins over the guess (0 passed on). */
static int compute_threads(const struct ps_config *cfg)
{
	const char *env = getenv("OMP_NUM_THREADS");
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int here = 1, all_local = cfg->nshards > 0;

	if (cfg->train.threads > 0)
		return cfg->train.threads;
	if (env && *env)
		return 0;
	for (int i = 0; i < cfg->nshards; i++)
		all_local &= loopback(cfg->shards[i].host);
	if (all_local && cfg->nworkers > 1)
		here = cfg->nworkers;
	if (cores < 1)
		cores = 1;
	return cores / here > 0 ? (int)(cores / here) : 1;
}

/* Picks and creates the backend; prints one line when falling back. */
static int open_backend(const struct ps_config *cfg, const struct ps_compute_ops **ops,
			struct ps_compute **c)
{
	struct ps_compute_opts opts = { .tf32 = (enum ps_tf32)cfg->train.tf32,
					.threads = compute_threads(cfg) };
	int device = cfg->train.device;
	char err[512] = "";
	int rc;

	if (device != PS_DEVICE_CPU) {
		rc = ps_compute_load("cuda", ops, err, sizeof(err));
		if (rc == 0)
			rc = (*ops)->create(c, &opts, err, sizeof(err));
		if (rc == 0)
			return 0;
		if (device == PS_DEVICE_CUDA) {
			ps_error("device cuda requested but not usable: %s", err[0] ? err : ps_strerror(rc));
			return rc;
		}
		ps_info("no usable GPU (%s); training on the CPU", err[0] ? err : ps_strerror(rc));
	}
	*ops = &ps_compute_cpu_ops;
	rc = (*ops)->create(c, &opts, err, sizeof(err));
	if (rc)
		ps_error("cpu backend: %s", err);
	else if (opts.threads)
		ps_info("cpu backend (oneDNN): %d compute thread(s)", opts.threads);
	else
		ps_info("cpu backend (oneDNN): OMP_NUM_THREADS=%s compute thread(s)",
			getenv("OMP_NUM_THREADS"));
	return rc;
}

/* Starts the pull of every tensor into host_w (min_version for sync):
 * its request id, or a negative code. */
static int64_t pull_start(struct ps_client *cli, struct ps_net *net, const struct ps_config *cfg,
			  uint64_t min_version, struct ps_tensor *t)
{
	for (int i = 0; i < cfg->ntensors; i++)
		t[i] = ps_tensor_of(cfg, i, net->host_w[i]);
	return ps_client_pull(cli, min_version, t, cfg->ntensors);
}

/* Pulls every tensor into host_w and uploads it. */
static int pull_weights(struct ps_client *cli, struct ps_net *net, const struct ps_config *cfg,
			uint64_t min_version, struct ps_tensor *t)
{
	int64_t id = pull_start(cli, net, cfg, min_version, t);
	int rc = id < 0 ? (int)id : ps_client_wait(cli, id);
	return rc ? rc : ps_net_upload_weights(net);
}

/* After a step's pushes were handed to the client: waits for their acks
 * and for the next step's weights, uploads them, and adds the time waited
 * for the network to *t_net (and per gradient pair to t_layer[k]) and the
 * uploads' to *t_upload. train.pull: layer: pair k's pull went out with its
 * push (pids[k], pusher.c); they are waited for in push order and each
 * pair is uploaded as it lands. step: one pull of every tensor starts here,
 * behind the pushes without waiting for their acks (a shard handles one
 * connection's frames in order, so it answers the pull after applying
 * them; sync: once the clock is complete). 0, or -1 with the error logged. */
static int await_weights(struct ps_client *cli, struct ps_net *net, const struct ps_config *cfg,
			 uint64_t clock, const int64_t *ids, const int64_t *pids, int nids,
			 struct ps_tensor *pt, double *t_net, double *t_upload, double *t_layer)
{
	int whole = cfg->train.pull == PS_PULL_STEP;
	const char *what = "push";
	double t0 = ps_now_s(), t1;
	int64_t pid = 0;

	/* the last weights' upload has read host_w long ago; the wait only
	 * makes sure before the pull overwrites it */
	if (whole)
		pid = ps_net_weights_wait(net) ? -EIO :
		      pull_start(cli, net, cfg, cfg->consistency == PS_SYNC ? clock + 1 : 0, pt);
	for (int k = 0; k < nids; k++) {
		what = "push";
		if (ps_client_wait(cli, ids[k]))
			goto err_net;
		if (!pids[k])
			continue;
		what = "pull";
		if (ps_client_wait(cli, pids[k]))
			goto err_net;
		t1 = ps_now_s();
		t_layer[k] += t1 - t0;
		*t_net += t1 - t0;
		if (ps_net_upload_pair(net, k))
			goto err_upload;
		t0 = ps_now_s();
		*t_upload += t0 - t1;
	}
	what = "pull";
	if (whole && (pid < 0 || ps_client_wait(cli, pid)))
		goto err_net;
	t1 = ps_now_s();
	*t_net += t1 - t0;
	if (whole ? ps_net_upload_weights(net) : ps_net_upload_mark(net))
		goto err_upload;
	*t_upload += ps_now_s() - t1;
	return 0;

err_net:
	ps_error("%s at clock %llu: %s", what, (unsigned long long)clock, ps_client_error(cli));
	return -1;
err_upload:
	ps_error("upload at clock %llu: %s", (unsigned long long)clock, net->c->err);
	return -1;
}

/* --eval: the test accuracy of saved weights, without servers. */
static int eval_saved(const struct ps_config *cfg, const char *path)
{
	const struct ps_compute_ops *ops;
	struct ps_compute *comp = NULL;
	struct ps_dataset test = { 0 };
	struct ps_net net = { 0 };
	double acc, loss;
	char err[1024];
	int rc = 1, batch = 256;

	if (open_backend(cfg, &ops, &comp))
		return 1;
	if (ps_dataset_load_dir(&test, cfg->train.data_dir, "t10k", cfg->model.classes, err,
				sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	if (ps_net_init(&net, cfg, ops, comp, batch, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	if (ps_model_load(path, cfg, net.host_w, err, sizeof(err))) {
		ps_error("--eval: %s", err);
		goto out;
	}
	if (ps_net_upload_weights(&net) || ps_epoch_evaluate(&net, &test, &acc, &loss)) {
		ps_error("evaluation failed: %s", comp->err);
		goto out;
	}
	printf("%s: test accuracy %.4f, test loss %.4f (%d images, %s)\n", path, acc, loss,
	       test.n, ops->name);
	rc = 0;
out:
	ps_net_free(&net);
	ps_dataset_free(&test);
	if (comp)
		ops->destroy(comp);
	return rc;
}

/* Connects to the shards, retrying while they are still starting. */
static int connect_client(const struct ps_config *cfg, int rank, struct ps_client **cli)
{
	char err[1024];
	int rc;

	for (double t0 = ps_now_s();; sleep(1)) {
		rc = ps_client_init(cli, cfg, rank, err, sizeof(err));
		if (rc == 0 || rc != -ECONNREFUSED || ps_now_s() - t0 > cfg->limits.connect_timeout_ms / 1000.0 || g_stop)
			break;
	}
	if (rc) {
		ps_error("%s", err);
		return rc;
	}
	/* a rank that left before (or one above cluster.initial_workers, which
	 * ps_client_init joined already) is a member again; a member already
	 * stays as it is */
	rc = ps_client_join(*cli);
	if (rc)
		ps_error("joining the cluster: %s", ps_client_error(*cli));
	return rc;
}

/* train.metrics_dir/worker-R.jsonl for appending, or NULL (none, or not
 * writable: a warning). */
static FILE *open_metrics(const struct ps_config *cfg, int rank)
{
	char path[600];
	FILE *f;

	if (!cfg->train.metrics_dir[0])
		return NULL;
	mkdir(cfg->train.metrics_dir, 0755);
	snprintf(path, sizeof(path), "%s/worker-%d.jsonl", cfg->train.metrics_dir, rank);
	f = fopen(path, "a");
	if (!f)
		ps_warn("cannot write metrics to %s: %m", path);
	return f;
}

/* The ctr preset: click logs and an embedding table (ctr_train.c);
 * record_path: --record-examples, or NULL. */
static int run_ctr(const struct ps_config *cfg, int rank, const char *record_path)
{
	const struct ps_compute_ops *ops;
	struct ps_compute *comp = NULL;
	struct ps_client *cli = NULL;
	FILE *metrics = NULL, *record = NULL;
	int rc = 1;

	if (!cfg->train.train_file[0] || !cfg->train.test_file[0]) {
		ps_error("%s: the ctr preset reads click logs: set train.train_file and "
			 "train.test_file (Criteo's format; ps-ctrgen writes them)", cfg->path);
		return 2;
	}
	if (record_path && !(record = fopen(record_path, "a"))) {
		ps_error("--record-examples %s: %s", record_path, strerror(errno));
		return 1;
	}
	if (open_backend(cfg, &ops, &comp)) {
		if (record)
			fclose(record);
		return 1;
	}
	metrics = open_metrics(cfg, rank);
	if (connect_client(cfg, rank, &cli) == 0)
		rc = ps_ctr_train(cfg, rank, ops, comp, cli, metrics, record, &g_stop);
	if (metrics)
		fclose(metrics);
	if (record)
		fclose(record);
	ps_client_free(cli);
	ops->destroy(comp);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' }, { "rank", required_argument, NULL, 'r' },
		{ "epochs", required_argument, NULL, 'e' }, { "batch", required_argument, NULL, 'b' },
		{ "device", required_argument, NULL, 'd' }, { "log-level", required_argument, NULL, 'l' },
		{ "metrics-dir", required_argument, NULL, 'm' },
		{ "limit", required_argument, NULL, 'n' },
		{ "save-model", required_argument, NULL, 's' },
		{ "eval", required_argument, NULL, 'E' },
		{ "secret-file", required_argument, NULL, 'K' },
		{ "exec", required_argument, NULL, 'x' },
		{ "record-examples", required_argument, NULL, 'X' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' }, { NULL, 0, NULL, 0 },
	};
	const char *config = NULL, *level = NULL, *device = NULL, *metrics_dir = NULL;
	const char *save_model = NULL, *eval_model = NULL, *secret = NULL, *exec_cmd = NULL;
	const char *record_path = NULL;
	int rank = -1, epochs = 0, batch = 0, limit = -1, opt, rc = 1;
	const char *rank_src = "--rank"; /* or the variable the rank came from */
	/* large (tensors table): static, so early exits on bad flags free nothing */
	static struct ps_config cfg_storage;
	struct ps_config *cfg = &cfg_storage;
	char err[1024];

	while ((opt = getopt_long(argc, argv, "c:r:e:b:d:l:m:n:s:E:x:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c': config = optarg; break;
		case 'r':
			if (parse_int(optarg, 0, 1 << 20, &rank)) {
				fprintf(stderr, "ps-worker: --rank: expected a worker rank, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'e':
			if (parse_int(optarg, 1, 100000, &epochs)) {
				fprintf(stderr, "ps-worker: --epochs: expected 1..100000, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'b':
			if (parse_int(optarg, 1, 65536, &batch)) {
				fprintf(stderr, "ps-worker: --batch: expected 1..65536, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'd':
			device = optarg;
			if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "auto")) {
				fprintf(stderr, "ps-worker: --device: expected cpu, cuda or auto, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'l': level = optarg; break;
		case 's': save_model = optarg; break;
		case 'E': eval_model = optarg; break;
		case 'K': secret = optarg; break;
		case 'x': exec_cmd = optarg; break;
		case 'X': record_path = optarg; break;
		case 'm':
			metrics_dir = optarg;
			if (strlen(optarg) >= sizeof(cfg->train.metrics_dir)) {
				fprintf(stderr, "ps-worker: --metrics-dir: path longer than %zu bytes\n",
					sizeof(cfg->train.metrics_dir) - 1);
				return 2;
			}
			break;
		case 'n':
			if (parse_int(optarg, 0, 1000000000, &limit)) {
				fprintf(stderr, "ps-worker: --limit: expected 0..1000000000 images, got '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'V': ps__version_print(stdout, "ps-worker"); return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			fprintf(stderr, "Try 'ps-worker --help'.\n");
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ps-worker: unexpected argument '%s'\nTry 'ps-worker --help'.\n", argv[optind]);
		return 2;
	}
	if (eval_model && (rank >= 0 || save_model)) {
		fprintf(stderr, "ps-worker: --eval runs alone: no --rank or --save-model with it\n");
		return 2;
	}
	if (eval_model)
		rank = 0;
	if (rank < 0 && rank_from_env(&rank, &rank_src))
		return 2;
	if (!config || rank < 0) {
		fprintf(stderr, "ps-worker: --config FILE and --rank R (or $PS_RANK or $JOB_COMPLETION_INDEX) are required\nTry 'ps-worker --help'.\n");
		return 2;
	}
	if (ps_config_load(cfg, config, err, sizeof(err))) {
		fprintf(stderr, "ps-worker: %s\n", err);
		return 2;
	}
	if (secret && ps_auth_set_secret_file(cfg, secret)) {
		fprintf(stderr, "ps-worker: --secret-file: name too long\n");
		return 2;
	}
	if (rank >= cfg->nworkers) {
		fprintf(stderr, "ps-worker: %s%s %d: %s has workers 0..%d\n",
			strcmp(rank_src, "--rank") ? "$" : "", rank_src, rank, config,
			cfg->nworkers - 1);
		return 2;
	}
	if (exec_cmd)
		return ps__worker_exec(exec_cmd, config, rank, cfg->nworkers, secret);
	if (cfg->model.nlayers == 0) {
		fprintf(stderr, "ps-worker: %s: the model has no layers; set model.preset (mlp, cnn, ctr) or model.layers\n", config);
		return 2;
	}
	enum ps_log_level lvl;
	if (ps_log_parse_level(level ? level : cfg->log_level, &lvl)) {
		fprintf(stderr, "ps-worker: --log-level: expected debug, info, warn, error or off, got '%s'\n", level);
		return 2;
	}
	ps_log_init("worker", rank);
	ps_log_set_level(lvl);
	if (epochs)
		cfg->train.epochs = epochs;
	if (batch)
		cfg->train.batch = batch;
	if (limit >= 0)
		cfg->train.train_limit = limit;
	if (metrics_dir)
		snprintf(cfg->train.metrics_dir, sizeof(cfg->train.metrics_dir), "%s", metrics_dir);
	if (device)
		cfg->train.device = !strcmp(device, "cpu") ? PS_DEVICE_CPU
				    : !strcmp(device, "cuda") ? PS_DEVICE_CUDA : PS_DEVICE_AUTO;
	/* before any thread starts (stop_signal.c: why no handler may run on
	 * a thread in oneDNN's kernels) */
	int src = ps__stop_signal_init(&g_stop);
	if (src)
		ps_warn("stop signals: no thread to take them (%s); handled on any thread",
			strerror(-src));
	if (!strcmp(cfg->model.preset, "ctr")) {
		if (eval_model || save_model) {
			fprintf(stderr, "ps-worker: --eval and --save-model take dense models only; "
				"ctr's embedding rows stay on the shards (their checkpoints keep them)\n");
			return 2;
		}
		return run_ctr(cfg, rank, record_path);
	}
	if (eval_model)
		return eval_saved(cfg, eval_model);

	const struct ps_compute_ops *ops;
	struct ps_compute *comp = NULL;
	struct ps_dataset train = { 0 }, test = { 0 };
	struct ps_batcher bt = { 0 };
	struct ps_net net = { 0 };
	/* a big buffer (the last staged batch's images): static */
	static struct ps_slot_stage st;
	FILE *record = NULL;
	struct ps_client *cli = NULL;
	struct ps_pusher *pusher = NULL;
	struct ps_tensor *pt = calloc((size_t)cfg->ntensors, sizeof(*pt));
	/* per gradient pair: the epoch's wait for its pull (train.pull: layer) */
	double *t_layer = NULL;
	int per_layer = cfg->train.pull == PS_PULL_LAYER;
	FILE *metrics = NULL;
	int classes = cfg->model.classes;

	if (record_path && !(record = fopen(record_path, "a"))) {
		ps_error("--record-examples %s: %s", record_path, strerror(errno));
		goto out;
	}
	if (open_backend(cfg, &ops, &comp))
		goto out;
	if (ps_dataset_load_dir(&train, cfg->train.data_dir, "train", classes, err, sizeof(err)) ||
	    ps_dataset_load_dir(&test, cfg->train.data_dir, "t10k", classes, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	if (cfg->train.test_limit > 0 && cfg->train.test_limit < test.n) {
		test.n = (int)cfg->train.test_limit; /* the arrays stay whole: free needs no n */
		ps_info("test accuracy on the first %d test images (train.test_limit)", test.n);
	}
	if (train.rows * train.cols != cfg->model.input[0] * cfg->model.input[1] * cfg->model.input[2]) {
		ps_error("%s: images are %dx%d, the model takes %dx%dx%d", cfg->train.data_dir,
			 train.rows, train.cols, cfg->model.input[0], cfg->model.input[1],
			 cfg->model.input[2]);
		goto out;
	}
	/* One order of the whole training set per epoch, cut into slots of a
	 * batch; the members of each clock take the next slots, in rank order
	 * (ps_client_members), so whoever joins or leaves, every slot of an
	 * epoch is trained once (sync; docs/reliability.md). */
	if (ps_batcher_init(&bt, &train, 0, 1, cfg->train.batch, (long)cfg->train.train_limit,
			    cfg->seed)) {
		ps_error("cannot split the training set");
		goto out;
	}
	long used = cfg->train.train_limit > 0 && cfg->train.train_limit < train.n
		    ? (long)cfg->train.train_limit : train.n;
	long slots = used / cfg->train.batch;
	if (slots < 1) {
		ps_error("%ld images give no full batch of %d", used, cfg->train.batch);
		goto out;
	}
	if (ps_net_init(&net, cfg, ops, comp, cfg->train.batch, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	t_layer = calloc((size_t)net.ngrads + 1, sizeof(*t_layer));
	if (!pt || !t_layer)
		goto out;
	metrics = open_metrics(cfg, rank);
	if (connect_client(cfg, rank, &cli)) {
		rc = 1;
		goto out;
	}
	rc = 1;
	ps_info("training %s (%d tensors) on %s: %d epoch(s) of %ld batches of %d among the "
		"workers, %s, weights pulled per %s",
		cfg->model.preset[0] ? cfg->model.preset : "model", cfg->ntensors, ops->name,
		cfg->train.epochs, slots, cfg->train.batch,
		cfg->consistency == PS_SYNC ? "sync" : "async", per_layer ? "layer" : "step");
	/* 0, where the shards resumed from a checkpoint, or where this worker
	 * joined a running cluster */
	uint64_t clock = ps_client_clock(cli);
	if (pull_weights(cli, &net, cfg, cfg->consistency == PS_SYNC ? clock : 0, pt)) {
		ps_error("initial pull: %s", ps_client_error(cli));
		goto out;
	}
	if (ps_pusher_start(&pusher, cli, &net, cfg, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}

	int tty = isatty(STDERR_FILENO);
	double t_start = ps_now_s();
	if (clock && ps_client_from_checkpoint(cli))
		ps_info("shards resumed from a checkpoint: continuing at clock %llu",
			(unsigned long long)clock);
	else if (clock)
		ps_info("the shards are at clock %llu already (a running cluster joined, or one "
			"kept running since an earlier run of the workers): continuing there",
			(unsigned long long)clock);
	st.bt = &bt;
	st.epoch = -1;
	st.slots = slots;
	st.record = record;
	struct ps_members_info mi;
	struct ps_epoch_acc ea = { .e = -1 };
	int leaving = 0;
	uint64_t leave_at = UINT64_MAX; /* after a stop signal: the clock whose push leaves */
	long staged = -1; /* the slot whose batch is ready for the next forward */
	double last_print = 0, t_mark, t_end;
	for (;;) {
		if (ps_client_members(cli, &mi) || mi.index < 0) {
			ps_error("clock %llu: this worker is not among its members",
				 (unsigned long long)clock);
			goto out;
		}
		long g = (long)(mi.before + (uint64_t)mi.index);
		if (g / slots != ea.e) { /* this worker's first slot of a new epoch */
			if (ea.e >= 0 && ps_epoch_end(cfg, rank, &net, &test, ops, metrics, cli, &ea,
						     t_start, t_layer, tty, g_stop))
				goto out;
			/* rank 0's evaluation ran batches through the net: stage again */
			staged = -1;
			ea = (struct ps_epoch_acc){ .e = (int)(g / slots), .t_epoch = ps_now_s() };
			last_print = 0;
			for (int k = 0; k < net.ngrads; k++)
				t_layer[k] = 0;
		}
		if (ea.e >= cfg->train.epochs) {
			/* done: the clock's other members may still train theirs */
			if (ps_client_leave(cli, clock))
				ps_warn("leaving at clock %llu: %s", (unsigned long long)clock,
					ps_client_error(cli));
			break;
		}
		if (g_stop && leave_at == UINT64_MAX) {
			/* this clock's slot is this worker's: trained, and in async
			 * mode with a staleness the clocks the others may be told with
			 * it as a member (ps_client_leave_begin), then it leaves */
			if (ps_client_leave_begin(cli, &leave_at)) {
				ps_warn("leaving: %s; leaving after this clock", ps_client_error(cli));
				leave_at = clock;
			}
			ps_info("stop signal: leaving after clock %llu", (unsigned long long)leave_at);
		}
		leaving = clock >= leave_at;
		if (staged != g && ps_slot_stage(&net, &st, g)) {
			ps_error("batch: %s", comp->err);
			goto out;
		}
		staged = -1;
		ps_slot_record(&st, clock, g);
		const int64_t *ids, *pids;
		float loss;
		uint64_t gen = net.gen + 1;
		int correct, nids, count = net.ready_count;
		t_mark = ps_now_s();
		if (ps_net_forward(&net)) {
			ps_error("forward: %s", comp->err);
			goto out;
		}
		ps_pusher_begin(pusher, gen, clock, leaving);
		/* Workers' gradients are summed by the shards: scale by 1/W so
		 * the update is the mean over the global batch (W: this clock's
		 * members; at the end of the last epoch those with no batch left
		 * only leave, and count as zero gradients: a full-size step on
		 * the one batch left measured 2-4 points less test accuracy in
		 * it_train). */
		if (ps_net_backward(&net, 1.0f / (float)mi.count, &gen)) {
			ps_pusher_end(pusher, &ids, &pids, &nids, err, sizeof(err));
			ps_error("backward at step %d: %s", ea.steps, comp->err);
			goto out;
		}
		/* the next batch, while the device computes and the push thread
		 * pushes: the slot this worker gets next if the members stay */
		long next = g + mi.count;
		if (!leaving && next / slots < cfg->train.epochs) {
			if (ps_slot_stage(&net, &st, next)) {
				ps_error("batch: %s", comp->err);
				goto out;
			}
			staged = next;
		}
		t_end = ps_now_s();
		ea.t_compute += t_end - t_mark;
		if (ps_pusher_end(pusher, &ids, &pids, &nids, err, sizeof(err))) {
			ps_error("step %d: %s", ea.steps, err);
			goto out;
		}
		t_mark = ps_now_s();
		ea.t_push += t_mark - t_end;
		if (ps_net_loss(&net, &loss, &correct)) {
			ps_error("loss at step %d: %s", ea.steps, comp->err);
			goto out;
		}
		/* on cuda reading the loss waits for the device: compute */
		ea.t_compute += ps_now_s() - t_mark;
		if (await_weights(cli, &net, cfg, clock, ids, pids, nids, pt, &ea.t_net,
				  &ea.t_upload, t_layer))
			goto out;
		clock++;
		ea.steps++;
		ea.loss_sum += loss * count;
		ea.correct += correct;
		ea.seen += count;
		double now = ps_now_s();
		if (now - last_print > (tty ? 0.25 : 10.0)) {
			uint64_t raw, wire;
			last_print = now;
			ps_client_push_bytes(cli, &raw, &wire);
			fprintf(stderr, "%sepoch %d/%d  step %d  batch %ld/%ld  %d worker(s)  loss %.4f  "
				"acc %.3f  %.0f samples/s  %.1f MB pushed", tty ? "\r" : "", ea.e + 1,
				cfg->train.epochs, ea.steps, g % slots + 1, slots, mi.count,
				ea.loss_sum / ea.seen, (double)ea.correct / ea.seen,
				ea.seen / (now - ea.t_epoch), wire / 1e6);
			if (wire != raw && wire)
				fprintf(stderr, " (%.1fx smaller)", (double)raw / (double)wire);
			fputs(tty ? "\033[K" : "\n", stderr);
		}
		if (leaving)
			break;
	}
	/* stopped by a signal: the epoch so far (no evaluation) */
	if (leaving && ea.seen &&
	    ps_epoch_end(cfg, rank, &net, &test, ops, metrics, cli, &ea, t_start, t_layer, tty,
			 g_stop))
		goto out;
	rc = g_stop ? 130 : 0;
	if (g_stop)
		ps_info("stopped by signal");
	if (save_model && !g_stop && cfg->consistency == PS_SYNC) {
		/* members that got the epochs' last batches may train after this
		 * worker left: the weights after the last clock anyone trained
		 * (whose members are none, or all past the end) */
		for (uint64_t v = clock + 1;; v++) {
			if (pull_weights(cli, &net, cfg, v, pt) || ps_client_members(cli, &mi)) {
				ps_error("--save-model: pulling the final weights: %s",
					 ps_client_error(cli));
				rc = 1;
				goto out;
			}
			if (mi.count == 0 || mi.before >= (uint64_t)(slots * cfg->train.epochs))
				break;
		}
	}
	if (save_model && !g_stop) {
		/* host_w holds the weights of the last pull: after the last clock */
		if (ps_model_save(save_model, cfg, net.host_w, err, sizeof(err))) {
			ps_error("--save-model: %s", err);
			rc = 1;
		} else {
			ps_info("saved the model to %s", save_model);
		}
	}
out:
	if (record)
		fclose(record);
	if (metrics)
		fclose(metrics);
	ps_pusher_stop(pusher);
	ps_client_free(cli);
	ps_net_free(&net);
	if (comp)
		ops->destroy(comp);
	ps_batcher_free(&bt);
	ps_dataset_free(&train);
	ps_dataset_free(&test);
	free(pt);
	free(t_layer);
	return rc;
}
