/* optim_group.c - optimizer groups of declared tensors (a torch
 * param_group each): their names, the bounds of their settings, how two
 * of them differ, and their wire form (Declare.groups).
 *
 * A group is a struct ps_optim_cfg. Its kind name "sgd" is PS_OPT_SGD
 * without momentum and PS_OPT_MOMENTUM with it (torch.optim.SGD is both).
 * The client checks the groups it declares and the shard checks the ones
 * it receives with the same function (ps_optim_group_check), so a peer's
 * settings are bounded before the shard builds anything from them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optim_group.h"
#include "ps_err.h"

static const char *const kind_names[] = {
	[PS_OPT_SGD] = "sgd", [PS_OPT_MOMENTUM] = "sgd", [PS_OPT_ADAM] = "adam",
	[PS_OPT_ADAGRAD] = "adagrad", [PS_OPT_ADAMW] = "adamw", [PS_OPT_REDUCE] = "reduce",
};

const char *ps_optim_group_kind_name(enum ps_optim_kind k)
{
	return (unsigned)k < PS_OPT_COUNT ? kind_names[k] : "unknown";
}

int ps_optim_group_kind(const char *name, float momentum, enum ps_optim_kind *k)
{
	if (!name)
		return PS_ECONFIG;
	if (!strcmp(name, "sgd"))
		*k = momentum != 0.0f ? PS_OPT_MOMENTUM : PS_OPT_SGD;
	else if (!strcmp(name, "adam"))
		*k = PS_OPT_ADAM;
	else if (!strcmp(name, "adamw"))
		*k = PS_OPT_ADAMW;
	else if (!strcmp(name, "adagrad"))
		*k = PS_OPT_ADAGRAD;
	else if (!strcmp(name, "reduce"))
		*k = PS_OPT_REDUCE;
	else
		return PS_ECONFIG;
	return 0;
}

/* x in the fewest digits that read back as x (0.8f as "0.8"). */
static const char *short_float(float x, char *buf, size_t len)
{
	for (int p = 1; p <= 9; p++) {
		snprintf(buf, len, "%.*g", p, (double)x);
		if (strtof(buf, NULL) == x)
			break;
	}
	return buf;
}

/* 0 when lo <= x <= hi (lo < x when open_lo, x < hi when open_hi) and x
 * is finite; else PS_ECONFIG with the field named in why. */
static int in_range(int g, const char *field, float x, double lo, int open_lo, double hi,
		    int open_hi, char *why, size_t wl)
{
	double v = x;

	if (isfinite(x) && (open_lo ? v > lo : v >= lo) && (open_hi ? v < hi : v <= hi))
		return 0;
	char b[32];

	snprintf(why, wl, "optimizer group %d: %s is %s, expected %s%g, %g%s", g, field,
		 short_float(x, b, sizeof(b)), open_lo ? "(" : "[", lo, hi, open_hi ? ")" : "]");
	return PS_ECONFIG;
}

int ps_optim_group_lr_check(int g, float lr, char *why, size_t wl)
{
	if (isfinite(lr) && lr >= 0.0f)
		return 0;
	char b[32];

	snprintf(why, wl, "optimizer group %d: learning rate %s is not finite and >= 0", g,
		 short_float(lr, b, sizeof(b)));
	return -EINVAL;
}

int ps_optim_group_check(int g, const struct ps_optim_cfg *o, int async, char *why, size_t wl)
{
	int rc;

	if ((unsigned)o->kind >= PS_OPT_COUNT) {
		snprintf(why, wl, "optimizer group %d: unknown kind %d", g, (int)o->kind);
		return PS_ECONFIG;
	}
	if ((rc = ps_optim_group_lr_check(g, o->lr, why, wl)))
		return PS_ECONFIG;
	if ((rc = in_range(g, "momentum", o->momentum, 0, 0, 1e6, 0, why, wl)) ||
	    (rc = in_range(g, "dampening", o->dampening, 0, 0, 1, 0, why, wl)) ||
	    (rc = in_range(g, "beta1", o->beta1, 0, 0, 1, 1, why, wl)) ||
	    (rc = in_range(g, "beta2", o->beta2, 0, 0, 1, 1, why, wl)) ||
	    (rc = in_range(g, "weight_decay", o->weight_decay, 0, 0, 1e6, 0, why, wl)) ||
	    (rc = in_range(g, "lr_decay", o->lr_decay, 0, 0, 1e6, 0, why, wl)) ||
	    (rc = in_range(g, "initial_accumulator", o->initial_accumulator, 0, 0, 1e30, 0, why,
			   wl)))
		return rc;
	if ((o->kind == PS_OPT_ADAM || o->kind == PS_OPT_ADAMW || o->kind == PS_OPT_ADAGRAD) &&
	    (rc = in_range(g, "eps", o->eps, 0, 1, 1e6, 0, why, wl)))
		return rc;
	if (o->nesterov && (o->kind != PS_OPT_MOMENTUM || o->dampening != 0.0f)) {
		snprintf(why, wl, "optimizer group %d: nesterov needs sgd with momentum > 0 and "
			 "dampening 0 (as torch.optim.SGD)", g);
		return PS_ECONFIG;
	}
	if (o->kind == PS_OPT_REDUCE && async) {
		snprintf(why, wl, "optimizer group %d: kind reduce (the weights become the clock's "
			 "gradient) needs consistency.mode sync: in async mode there is no clock "
			 "whose gradients it could combine", g);
		return PS_ECONFIG;
	}
	return 0;
}

int ps_optim_group_diff(int g, const struct ps_optim_cfg *a, const struct ps_optim_cfg *b,
			char *why, size_t wl)
{
	char x[32], y[32];
#define F(field)                                                                          \
	if (a->field != b->field) {                                                       \
		snprintf(why, wl, "optimizer group %d: " #field " is %s on the shard, %s in " \
			 "this declaration", g, short_float((float)a->field, x, sizeof(x)),  \
			 short_float((float)b->field, y, sizeof(y)));                        \
		return 1;                                                                 \
	}
	if (a->kind != b->kind) {
		snprintf(why, wl, "optimizer group %d: kind is %s%s on the shard, %s%s in this "
			 "declaration", g, ps_optim_group_kind_name(a->kind),
			 a->kind == PS_OPT_MOMENTUM ? " (momentum)" : "",
			 ps_optim_group_kind_name(b->kind),
			 b->kind == PS_OPT_MOMENTUM ? " (momentum)" : "");
		return 1;
	}
	F(momentum)
	F(dampening)
	F(nesterov)
	F(beta1)
	F(beta2)
	F(eps)
	F(weight_decay)
	F(lr_decay)
	F(initial_accumulator)
	F(average)
#undef F
	return 0;
}

void ps_optim_group_to_msg(const struct ps_optim_cfg *o, Ps__OptimGroup *m)
{
	ps__optim_group__init(m);
	m->kind = (char *)ps_optim_group_kind_name(o->kind);
	m->lr = o->lr;
	m->momentum = o->momentum;
	m->dampening = o->dampening;
	m->nesterov = o->nesterov != 0;
	m->beta1 = o->beta1;
	m->beta2 = o->beta2;
	m->eps = o->eps;
	m->weight_decay = o->weight_decay;
	m->lr_decay = o->lr_decay;
	m->initial_accumulator = o->initial_accumulator;
	m->average = o->average != 0;
}

int ps_optim_group_from_msg(int g, const Ps__OptimGroup *m, int async, struct ps_optim_cfg *o,
			    char *why, size_t wl)
{
	memset(o, 0, sizeof(*o));
	if (ps_optim_group_kind(m->kind, m->momentum, &o->kind)) {
		snprintf(why, wl, "optimizer group %d: unknown kind '%.40s' (expected sgd, adam, "
			 "adamw, adagrad or reduce)", g, m->kind ? m->kind : "");
		return PS_ECONFIG;
	}
	o->lr = m->lr;
	o->momentum = m->momentum;
	o->dampening = m->dampening;
	o->nesterov = m->nesterov;
	o->beta1 = m->beta1;
	o->beta2 = m->beta2;
	o->eps = m->eps;
	o->weight_decay = m->weight_decay;
	o->lr_decay = m->lr_decay;
	o->initial_accumulator = m->initial_accumulator;
	o->average = m->average;
	return ps_optim_group_check(g, o, async, why, wl);
}
