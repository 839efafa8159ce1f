/* check_rdma.c - the parts of the RDMA transport that need no device
 * (common/rdma_proto.c): credit accounting, the registered-buffer pool,
 * frame placement; and the start-up check, whose message must name what is
 * missing on this machine and suggest tcp. */
#include <check.h>
#include <string.h>
#include "config.h"
#include "ps_err.h"
#include "rdma_proto.h"
#include "test_util.h"
#include "transport.h"
#include "transport_rdma.h"
#include <infiniband/verbs.h>

/* A sender never has more sends outstanding than the receiver posted
 * buffers, the last credit is kept for credit-only messages, and credits
 * flow back as buffers are posted again. */
START_TEST(test_credits)
{
	struct ps_rdma_credits snd, rcv;
	int outstanding = 0;

	ps_rdma_credits_init(&snd, 8);
	ps_rdma_credits_init(&rcv, 8);
	for (int i = 0; i < 7; i++) {
		ck_assert_int_eq(ps_rdma_credit_take(&snd, 0), 1);
		outstanding++;
	}
	ck_assert_int_eq(ps_rdma_credit_take(&snd, 0), 0); /* the reserved one */
	ck_assert_int_eq(ps_rdma_credit_take(&snd, 1), 1); /* ... for an update */
	outstanding++;
	ck_assert_int_eq(ps_rdma_credit_take(&snd, 1), 0);
	ck_assert_int_eq(outstanding, 8);
	/* the receiver handles 5 and posts their buffers again */
	for (int i = 0; i < 5; i++)
		ps_rdma_credit_reposted(&rcv);
	ck_assert_int_eq(ps_rdma_credit_update_due(&rcv), 1); /* 5 >= 8/2 */
	uint32_t back = ps_rdma_credit_collect(&rcv);
	ck_assert_uint_eq(back, 5);
	ck_assert_uint_eq(ps_rdma_credit_collect(&rcv), 0);
	ck_assert_int_eq(ps_rdma_credit_update_due(&rcv), 0);
	ck_assert_int_eq(ps_rdma_credit_grant(&snd, back), 0);
	ck_assert_uint_eq(snd.avail, 5);
	/* a peer that returns more than it could have: refused, unchanged */
	ck_assert_int_eq(ps_rdma_credit_grant(&snd, 4), -1);
	ck_assert_uint_eq(snd.avail, 5);
	ck_assert_int_eq(ps_rdma_credit_grant(&snd, 3), 0);
	ck_assert_uint_eq(snd.avail, 8);
	ck_assert_int_eq(ps_rdma_credit_grant(&snd, 1), -1);
	/* random traffic: never above the receiver's buffers */
	ps_rdma_credits_init(&snd, 4);
	ps_rdma_credits_init(&rcv, 4);
	unsigned x = 12345;
	int inflight = 0, maxin = 0;
	for (int step = 0; step < 100000; step++) {
		x = x * 1103515245u + 12345u;
		if ((x >> 16) % 3 && ps_rdma_credit_take(&snd, 0))
			inflight++;
		else if (inflight > 0) { /* one arrives, is handled, its buffer reposted */
			inflight--;
			ps_rdma_credit_reposted(&rcv);
			if (ps_rdma_credit_update_due(&rcv) || (x >> 20) % 7 == 0)
				ck_assert_int_eq(ps_rdma_credit_grant(&snd, ps_rdma_credit_collect(&rcv)),
						 0);
		}
		if (inflight > maxin)
			maxin = inflight;
		ck_assert_int_le(inflight, 4);
	}
	ck_assert_int_eq(maxin, 3); /* 4 buffers, one credit kept back */
}
END_TEST

START_TEST(test_pool)
{
	struct ps_rdma_pool p;
	void *b[5];

	ck_assert_int_eq(ps_rdma_pool_init(&p, 4, 1000), 0);
	ck_assert_uint_eq(p.slot, 1024); /* rounded to 64 */
	for (int i = 0; i < 4; i++) {
		b[i] = ps_rdma_pool_get(&p);
		ck_assert_ptr_nonnull(b[i]);
		ck_assert_uint_eq((uintptr_t)b[i] % 64, 0);
		ck_assert_int_eq(ps_rdma_pool_index(&p, b[i]), i);
		memset(b[i], i, 1024); /* whole buffers, no overlap (ASan) */
	}
	ck_assert_ptr_null(ps_rdma_pool_get(&p));
	/* foreign, inner and double returns are refused */
	int x;
	ck_assert_int_eq(ps_rdma_pool_put(&p, &x), -1);
	ck_assert_int_eq(ps_rdma_pool_put(&p, (char *)b[1] + 8), -1);
	ck_assert_int_eq(ps_rdma_pool_index(&p, (char *)b[3] + 1024), -1);
	ck_assert_int_eq(ps_rdma_pool_put(&p, b[2]), 0);
	ck_assert_int_eq(ps_rdma_pool_put(&p, b[2]), -1);
	b[4] = ps_rdma_pool_get(&p);
	ck_assert_ptr_eq(b[4], b[2]); /* reused, never a new registration */
	ck_assert_ptr_null(ps_rdma_pool_get(&p));
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(ps_rdma_pool_put(&p, b[i]), 0);
	ck_assert_uint_eq(p.nfree, 4);
	ps_rdma_pool_free(&p);
	ck_assert_int_ne(ps_rdma_pool_init(&p, 0, 64), 0);
}
END_TEST

START_TEST(test_placement)
{
	ck_assert_int_eq(ps_rdma_place_frame(24, 4096, 1 << 20), PS_RDMA_SEND);
	ck_assert_int_eq(ps_rdma_place_frame(4096, 4096, 1 << 20), PS_RDMA_SEND);
	ck_assert_int_eq(ps_rdma_place_frame(4097, 4096, 1 << 20), PS_RDMA_WRITE);
	ck_assert_int_eq(ps_rdma_place_frame(1 << 20, 4096, 1 << 20), PS_RDMA_WRITE);
	ck_assert_int_eq(ps_rdma_place_frame((1 << 20) + 1, 4096, 1 << 20), PS_RDMA_TOO_BIG);
	ck_assert_int_eq(ps_rdma_place_frame(UINT64_MAX, 4096, 1 << 20), PS_RDMA_TOO_BIG);
}
END_TEST

/* The start-up check names what this machine lacks and suggests tcp; the
 * config loads with transport: rdma (the check is at start, not load). */
START_TEST(test_probe_message)
{
	char why[400] = "", err[512];
	struct ps_config cfg;

	/* which of the two messages depends on whether this machine has a
	 * device: ask verbs ourselves */
	int ndev = 0;
	struct ibv_device **devs = ibv_get_device_list(&ndev);
	if (devs)
		ibv_free_device_list(devs);
	ck_assert_int_eq(ps_rdma_probe(NULL, why, sizeof(why)), ndev > 0 ? 0 : PS_ENOTSUP);
	if (ndev == 0) {
		/* each remedy named: the other transport, a driver, soft-RoCE */
		ck_assert_msg(strstr(why, "no RDMA device found") &&
			      strstr(why, "; use transport: tcp, or load an HCA driver, or soft-RoCE "
				     "(rdma link add rxe0 type rxe netdev IFACE)"), "%s", why);
	} else {
		ck_assert_msg(strncmp(why, "devices here: ", 14) == 0, "%s", why);
	}
	printf("rdma here: %s\n", why);
	ck_assert_int_eq(ps_rdma_probe("no-such-dev0", why, sizeof(why)), PS_ENOTSUP);
	if (ndev == 0) {
		ck_assert_msg(strstr(why, "no RDMA device found"), "%s", why);
	} else {
		/* a device here (the soft-RoCE VM of make test-rdma): a name
		 * that is not one of them is refused naming what there is, and
		 * every device, first included, is found by its name */
		char names[200] = "", want[300];
		size_t len = 0;
		devs = ibv_get_device_list(&ndev);
		ck_assert_ptr_nonnull(devs);
		for (int i = 0; i < ndev; i++)
			len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "",
						ibv_get_device_name(devs[i]));
		snprintf(want, sizeof(want), "RDMA device 'no-such-dev0' not found (rdma.device); "
			 "this machine has: %s;", names);
		ck_assert_msg(strstr(why, want), "'%s' not in '%s'", want, why);
		for (int i = 0; i < ndev; i++) {
			ck_assert_int_eq(ps_rdma_probe(ibv_get_device_name(devs[i]), why, sizeof(why)),
					 0);
			snprintf(want, sizeof(want), "devices here: %s", names);
			ck_assert_str_eq(why, want);
		}
		ibv_free_device_list(devs);
	}
	ck_assert_msg(ps_config_load_string(&cfg, "cluster:\n  servers: [127.0.0.1:7000]\n"
					    "  workers: 1\nmodel: {preset: mlp}\n"
					    "transport: rdma\nrdma: {device: mlx5_0}\n", "t.yaml",
					    err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(cfg.transport, PS_TRANSPORT_RDMA);
	ck_assert_str_eq(cfg.rdma_device, "mlx5_0");
	/* the registry: rdma with a device that is not here is refused at
	 * start with the probe's reason, tcp is found, unknown names are not */
	int rc = 0;
	ck_assert_ptr_null(ps_transport_for(&cfg, why, sizeof(why), &rc));
	ck_assert_int_eq(rc, PS_ENOTSUP);
	ck_assert_msg(strncmp(why, "transport rdma: ", 16) == 0 && strstr(why, "transport: tcp"),
		      "%s", why);
	if (ndev > 0) { /* and with any device it is found */
		cfg.rdma_device[0] = 0;
		rc = 1;
		ck_assert_ptr_eq(ps_transport_for(&cfg, why, sizeof(why), &rc),
				 &ps_rdma_transport_ops);
		ck_assert_int_eq(rc, 0);
	}
	cfg.transport = PS_TRANSPORT_TCP;
	rc = 1;
	const struct ps_transport_ops *ops = ps_transport_for(&cfg, why, sizeof(why), &rc);
	ck_assert_ptr_nonnull(ops);
	ck_assert_str_eq(ops->name, "tcp");
	ck_assert_str_eq(ps_transport_find("rdma")->name, "rdma");
	ck_assert_ptr_null(ps_transport_find("quic"));
	ck_assert_ptr_null(ps_transport_find(""));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rdma");
	TCase *tc = tcase_create("rdma");
	int failed;

	/* in the emulated VM each forked case maps CUDA's libraries anew: seconds */
	tcase_set_timeout(tc, 30 * tu_time_scale());

	tcase_add_test(tc, test_credits);
	tcase_add_test(tc, test_pool);
	tcase_add_test(tc, test_placement);
	tcase_add_test(tc, test_probe_message);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
