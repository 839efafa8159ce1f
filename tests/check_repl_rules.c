/* check_repl_rules.c - the role rules of a replicated shard's two processes
 * (ps__repl_partner_verdict, server/replica.c; docs/reliability.md,
 * "Failover", "Rejoining" and "The rule against split brain"): what a
 * process does when its partner dials in, for every pair of states, with
 * the partner's epoch older, the same and newer, and for two joining
 * processes with the same epoch, every order of their batch numbers and
 * both replica indices; and the dialing side's rule for the partner's
 * answer (ps__repl_reply_verdict). The expectations are written out, row by row, from
 * the documented rules:
 *  - a primary takes the partner as its backup, unless the partner is a
 *    primary of a later epoch: then it steps down;
 *  - a backup takes over when the process dialing from the primary's place
 *    says it is not a primary (restarted, or stepped down), whatever its
 *    epoch; a primary dialing it is refused;
 *  - of two joining processes the one with the newer state (epoch, then
 *    batch number), else replica 0, serves; the other is refused;
 *  - a process without replication (off) never serves a partner.
 */
#include <check.h>
#include <stdint.h>
#include "replica.h"

enum { OFF = PS_REPL_OFF, JOIN = PS_REPL_JOINING, BACK = PS_REPL_BACKUP, PRIM = PS_REPL_PRIMARY };
enum { ACC = PS_REPL_V_ACCEPT, TAKE = PS_REPL_V_TAKE_OVER, DOWN = PS_REPL_V_STEP_DOWN,
       REF = PS_REPL_V_REFUSE };

static const char *vname(int v)
{
	static const char *n[] = { "accept", "take over", "step down", "refuse" };
	return v >= 0 && v < 4 ? n[v] : "?";
}

static const char *sname(int s)
{
	static const char *n[] = { "off", "joining", "backup", "primary" };
	return s >= 0 && s < 4 ? n[s] : "?";
}

/* Every state pair; the verdict with the partner's epoch older, the same,
 * newer (same batch number; joining pairs of the same epoch: replica 0
 * here, so the tie goes to this process). */
static const struct {
	int state, peer;
	int v[3]; /* partner's epoch: older, same, newer */
} pairs[] = {
	{ OFF, OFF, { REF, REF, REF } },
	{ OFF, JOIN, { REF, REF, REF } },
	{ OFF, BACK, { REF, REF, REF } },
	{ OFF, PRIM, { REF, REF, REF } },
	{ JOIN, OFF, { REF, REF, REF } },
	{ JOIN, JOIN, { TAKE, TAKE, REF } },
	{ JOIN, BACK, { REF, REF, REF } },
	{ JOIN, PRIM, { REF, REF, REF } },
	{ BACK, OFF, { TAKE, TAKE, TAKE } },
	{ BACK, JOIN, { TAKE, TAKE, TAKE } },
	{ BACK, BACK, { TAKE, TAKE, TAKE } },
	{ BACK, PRIM, { REF, REF, REF } },
	{ PRIM, OFF, { ACC, ACC, ACC } },
	{ PRIM, JOIN, { ACC, ACC, ACC } },
	{ PRIM, BACK, { ACC, ACC, ACC } },
	{ PRIM, PRIM, { ACC, ACC, DOWN } },
};

START_TEST(test_every_state_pair)
{
	const uint64_t epoch = 5, lsn = 100, peer_epoch[3] = { 4, 5, 6 };

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
		for (int e = 0; e < 3; e++) {
			int v = ps__repl_partner_verdict(pairs[i].state, 0, epoch, lsn, pairs[i].peer,
							 peer_epoch[e], lsn);
			ck_assert_msg(v == pairs[i].v[e], "%s, partner %s with epoch %llu against "
				      "%llu: %s, the rule says %s", sname(pairs[i].state),
				      sname(pairs[i].peer), (unsigned long long)peer_epoch[e],
				      (unsigned long long)epoch, vname(v), vname(pairs[i].v[e]));
		}
}
END_TEST

/* Two joining processes: the epoch first (a newer epoch wins whatever the
 * batch numbers), then the batch number, then replica 0. */
static const struct {
	uint64_t epoch, lsn, peer_epoch, peer_lsn;
	int me;
	int v;
} joins[] = {
	{ 3, 10, 3, 10, 0, TAKE },   /* the same state: replica 0 serves */
	{ 3, 10, 3, 10, 1, REF },
	{ 3, 11, 3, 10, 0, TAKE },   /* more batches */
	{ 3, 11, 3, 10, 1, TAKE },
	{ 3, 10, 3, 11, 0, REF },    /* fewer batches: even replica 0 waits */
	{ 3, 10, 3, 11, 1, REF },
	{ 4, 1, 3, 500, 1, TAKE },   /* a newer epoch beats more batches */
	{ 3, 500, 4, 1, 0, REF },
	{ 0, 0, 0, 0, 0, TAKE },     /* a cold start */
	{ 0, 0, 0, 0, 1, REF },
};

START_TEST(test_joining_pair)
{
	for (size_t i = 0; i < sizeof(joins) / sizeof(joins[0]); i++) {
		int v = ps__repl_partner_verdict(JOIN, joins[i].me, joins[i].epoch, joins[i].lsn, JOIN,
						 joins[i].peer_epoch, joins[i].peer_lsn);
		ck_assert_msg(v == joins[i].v, "joining replica %d at epoch %llu batch %llu, partner "
			      "at epoch %llu batch %llu: %s, the rule says %s", joins[i].me,
			      (unsigned long long)joins[i].epoch, (unsigned long long)joins[i].lsn,
			      (unsigned long long)joins[i].peer_epoch,
			      (unsigned long long)joins[i].peer_lsn, vname(v), vname(joins[i].v));
	}
}
END_TEST

/* A backup's takeover and a primary's acceptance do not depend on the
 * batch numbers either way, nor on which replica it is. */
START_TEST(test_batches_do_not_matter_outside_joining)
{
	const int states[] = { BACK, PRIM };
	const uint64_t lsns[] = { 0, 7, 1000 };

	for (int s = 0; s < 2; s++)
		for (int me = 0; me < 2; me++)
			for (int a = 0; a < 3; a++)
				for (int b = 0; b < 3; b++) {
					int v = ps__repl_partner_verdict(states[s], me, 2, lsns[a], JOIN, 2,
									 lsns[b]);
					ck_assert_msg(v == (states[s] == BACK ? TAKE : ACC),
						      "%s replica %d at batch %llu, joining partner at "
						      "batch %llu: %s", sname(states[s]), me,
						      (unsigned long long)lsns[a],
						      (unsigned long long)lsns[b], vname(v));
				}
}
END_TEST

/* The dialing side (ps__repl_reply_verdict): the partner's HelloReply.
 * An ok from a primary: follow it as its backup (a primary does not dial:
 * an ok to one is a protocol error, as is an ok from no primary); a
 * refusal from a joining partner: a backup takes over whatever the
 * epochs, a joining process when it holds the newer state (else replica
 * 0); anything else: dial again. */
static const struct {
	int state, ok, peer;
	int v[3]; /* partner's epoch: older, same, newer */
} replies[] = {
	{ JOIN, 1, PRIM, { ACC, ACC, ACC } },
	{ BACK, 1, PRIM, { ACC, ACC, ACC } },
	{ PRIM, 1, PRIM, { REF, REF, REF } },
	{ JOIN, 1, JOIN, { REF, REF, REF } },
	{ JOIN, 1, BACK, { REF, REF, REF } },
	{ BACK, 0, JOIN, { TAKE, TAKE, TAKE } },
	{ BACK, 0, BACK, { REF, REF, REF } },
	{ BACK, 0, PRIM, { REF, REF, REF } },
	{ JOIN, 0, JOIN, { TAKE, TAKE, REF } },
	{ JOIN, 0, BACK, { REF, REF, REF } },
	{ JOIN, 0, PRIM, { REF, REF, REF } },
	{ OFF, 0, JOIN, { REF, REF, REF } },
};

START_TEST(test_dialing_side)
{
	const uint64_t epoch = 5, lsn = 100, peer_epoch[3] = { 4, 5, 6 };

	for (size_t i = 0; i < sizeof(replies) / sizeof(replies[0]); i++)
		for (int e = 0; e < 3; e++) {
			int v = ps__repl_reply_verdict(replies[i].state, 0, epoch, lsn, replies[i].ok,
						       replies[i].peer, peer_epoch[e], lsn);
			ck_assert_msg(v == replies[i].v[e], "%s, %s from a %s partner with epoch "
				      "%llu against %llu: %s, the rule says %s",
				      sname(replies[i].state), replies[i].ok ? "ok" : "refused",
				      sname(replies[i].peer), (unsigned long long)peer_epoch[e],
				      (unsigned long long)epoch, vname(v), vname(replies[i].v[e]));
		}
	/* the joining tie-breaks hold on this side too */
	ck_assert_int_eq(ps__repl_reply_verdict(JOIN, 1, 3, 10, 0, JOIN, 3, 10), REF);
	ck_assert_int_eq(ps__repl_reply_verdict(JOIN, 1, 3, 11, 0, JOIN, 3, 10), TAKE);
	ck_assert_int_eq(ps__repl_reply_verdict(JOIN, 0, 3, 10, 0, JOIN, 3, 11), REF);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("repl_rules");
	TCase *tc = tcase_create("verdict");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_every_state_pair);
	tcase_add_test(tc, test_joining_pair);
	tcase_add_test(tc, test_batches_do_not_matter_outside_joining);
	tcase_add_test(tc, test_dialing_side);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
