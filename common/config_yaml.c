/* config_yaml.c - the config loader's first step: libyaml's event parser
 * builds a small tree of nodes that remember their line. Aliases, nesting
 * deeper than MAX_DEPTH, more than MAX_NODES nodes, huge scalars and invalid
 * input are refused here, so hostile files cost little.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "config.h"
#include "config_int.h"
#include "ps_err.h"

/* Writes "NAME:LINE: message" into the caller's buffer; returns PS_ECONFIG. */
int cfg_fail(struct ctx *c, int line, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!c->err || !c->errlen)
		return PS_ECONFIG;
	n = line > 0 ? snprintf(c->err, c->errlen, "%s:%d: ", c->name, line)
		     : snprintf(c->err, c->errlen, "%s: ", c->name);
	if (n >= 0 && (size_t)n < c->errlen) {
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - n, fmt, ap);
		va_end(ap);
	}
	return PS_ECONFIG;
}

/* Copies text for a message: control bytes become '?', long text is cut. */
const char *cfg_show(const char *s, char *buf, size_t len)
{
	size_t i;

	for (i = 0; s[i] && i + 4 < len && i < 60; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	buf[i] = 0;
	if (s[i])
		strcpy(buf + i, "...");
	return buf;
}

/* How a node looks in a message: "a list", "a mapping" or the quoted text. */
const char *cfg_what(const struct ynode *n, char *buf, size_t len)
{
	char tmp[80];

	if (n->kind == YN_SEQ)
		return "a list";
	if (n->kind == YN_MAP)
		return "a mapping";
	snprintf(buf, len, "'%s'", cfg_show(n->text, tmp, sizeof(tmp)));
	return buf;
}

void cfg_node_free(struct ynode *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		cfg_node_free(n->kids[i]);
	free(n->kids);
	free(n->text);
	free(n);
}

/* Creates a node and hangs it below the innermost open collection (or makes
 * it the root), so that freeing the root always frees every node. */
static int node_attach(struct ctx *c, struct ynode **stack, int depth, struct ynode **root,
		       int kind, int line, struct ynode **out)
{
	struct ynode *n, *p, **kids;

	if (++c->nnodes > MAX_NODES)
		return cfg_fail(c, line, "more than %d YAML nodes; not a configuration file", MAX_NODES);
	n = calloc(1, sizeof(*n));
	if (!n)
		goto err_nomem;
	n->kind = kind;
	n->line = line;
	if (depth == 0) {
		*root = n;
	} else {
		p = stack[depth - 1];
		if (p->nkids == p->cap) {
			kids = realloc(p->kids, (p->cap ? 2 * p->cap : 4) * sizeof(*kids));
			if (!kids)
				goto err_free_node;
			p->kids = kids;
			p->cap = p->cap ? 2 * p->cap : 4;
		}
		p->kids[p->nkids++] = n;
	}
	*out = n;
	return 0;

err_free_node:
	free(n);
err_nomem:
	cfg_fail(c, line, "out of memory");
	return -ENOMEM;
}

/* Reports libyaml's own error: where the problem is, and what it is. */
static int syntax_error(struct ctx *c, const yaml_parser_t *p)
{
	const char *problem = p->problem ? p->problem : "unknown problem";

	if (p->error == YAML_MEMORY_ERROR) {
		cfg_fail(c, 0, "out of memory");
		return -ENOMEM;
	}
	if (p->error == YAML_READER_ERROR)
		return cfg_fail(c, 0, "invalid input at byte %zu: %s", p->problem_offset, problem);
	if (p->context)
		return cfg_fail(c, (int)p->problem_mark.line + 1, "YAML syntax error: %s (%s at line %d)",
			    problem, p->context, (int)p->context_mark.line + 1);
	return cfg_fail(c, (int)p->problem_mark.line + 1, "YAML syntax error: %s", problem);
}

/* Parses one YAML document from buf into a tree; *rootp is NULL for an
 * empty stream. */
int cfg_build_tree(struct ctx *c, const char *buf, size_t len, struct ynode **rootp)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct ynode *stack[MAX_DEPTH], *root = NULL, *n;
	int depth = 0, ndocs = 0, done = 0, rc = 0, line;

	if (!yaml_parser_initialize(&p)) {
		cfg_fail(c, 0, "out of memory");
		return -ENOMEM;
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
	while (!done && !rc) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = syntax_error(c, &p);
			goto err_free_tree;
		}
		line = (int)ev.start_mark.line + 1;
		switch (ev.type) {
		case YAML_DOCUMENT_START_EVENT:
			if (++ndocs > 1)
				rc = cfg_fail(c, line, "more than one YAML document; "
					  "put the whole configuration in one");
			break;
		case YAML_ALIAS_EVENT:
			rc = cfg_fail(c, line, "YAML aliases (*%s) are not supported; write the value out",
				  (const char *)ev.data.alias.anchor);
			break;
		case YAML_SCALAR_EVENT:
			if (ev.data.scalar.length > MAX_SCALAR) {
				rc = cfg_fail(c, line, "scalar of %zu bytes is longer than the limit of %d",
					  ev.data.scalar.length, MAX_SCALAR);
				break;
			}
			if (memchr(ev.data.scalar.value, 0, ev.data.scalar.length)) {
				rc = cfg_fail(c, line, "NUL character in a scalar");
				break;
			}
			rc = node_attach(c, stack, depth, &root, YN_SCALAR, line, &n);
			if (rc)
				break;
			n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
			n->len = ev.data.scalar.length;
			n->text = malloc(n->len + 1);
			if (!n->text) {
				rc = -ENOMEM;
				cfg_fail(c, line, "out of memory");
				break;
			}
			memcpy(n->text, ev.data.scalar.value, n->len);
			n->text[n->len] = 0;
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (depth >= MAX_DEPTH) {
				rc = cfg_fail(c, line, "nesting deeper than %d levels", MAX_DEPTH);
				break;
			}
			rc = node_attach(c, stack, depth, &root,
					 ev.type == YAML_SEQUENCE_START_EVENT ? YN_SEQ : YN_MAP, line, &n);
			if (!rc)
				stack[depth++] = n;
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			depth--;
			break;
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	if (rc)
		goto err_free_tree;
	yaml_parser_delete(&p);
	*rootp = root;
	return 0;

err_free_tree:
	cfg_node_free(root);
	yaml_parser_delete(&p);
	return rc;
}
