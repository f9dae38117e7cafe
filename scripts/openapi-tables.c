/*
 * Prints the route table and the operations' tables as JSON, for
 * scripts/openapi.py: the compiler reads the C, not a pattern. Linked with
 * the files of src/operations/ and src/core/idem_input.c alone
 * (scripts/openapi.py builds it at every build, without DEV_ROUTES), its
 * references to the rest of the service left unresolved: nothing here
 * calls them. A body field's limits and its rule in words are the
 * validator's own (idem_field_limits, idem_field_rule), so that the
 * document says what a 400 says. The strategies and the parsers of
 * a read's argument are stand-ins defined below, so that a table's
 * pointer to one tells which it is.
 */

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "lease.h"
#include "transactional.h"

static void	string(const char *);
static void	fields(const char *, const struct idem_field *, size_t);
static void	limits(const char *, const struct idem_field *);
static void	fail(const char *, const char *) __attribute__((noreturn));

int
transactional_run(struct http_request *req)
{
	return (0);
}

int
lease_run(struct http_request *req)
{
	return (0);
}

int
idem_read_run(struct http_request *req)
{
	return (0);
}

int
idem_path_ref(struct http_request *req, char *out, size_t len)
{
	return (0);
}

int
idem_path_arg(struct http_request *req, char *out, size_t len)
{
	return (0);
}

static const char *
kind_name(const char *where, int kind)
{
	switch (kind) {
	case FIELD_AMOUNT:
		return ("amount");
	case FIELD_POINTS:
		return ("points");
	case FIELD_CURRENCY:
		return ("currency");
	case FIELD_ID:
		return ("id");
	case FIELD_TEXT:
		return ("text");
	case FIELD_REF:
		return ("ref");
	case FIELD_POINTS_POSITIVE:
		return ("positive");
	case FIELD_TOKEN:
		return ("token");
	case FIELD_COUNT:
		return ("count");
	case FIELD_STRING:
		return ("string");
	case FIELD_TIME:
		return ("time");
	case FIELD_LIST:
		return ("list");
	default:
		fail(where, "a field of no known kind");
	}
}

int
main(void)
{
	const struct idem_operation	*op;
	size_t				i, n;

	printf("[");
	for (i = 0; i < idem_nroutes; i++) {
		op = idem_routes[i].op;
		if (op == NULL)
			fail(idem_routes[i].label, "its operation is not defined "
			    "in src/operations/ (a typo in routes.c, or a static "
			    "table?)");
		printf("%s{\"method\":\"%s\",\"path\":", i > 0 ? "," : "",
		    idem_routes[i].method == HTTP_METHOD_GET ? "GET" : "POST");
		string(idem_routes[i].path);
		printf(",\"label\":");
		string(idem_routes[i].label);
		printf(",\"name\":");
		string(op->name);
		printf(",\"summary\":");
		string(op->summary);
		printf(",\"doc\":");
		string(op->doc);

		if (op->strategy == idem_read_run && op->read != NULL) {
			/* 0 is PROBLEM_UNAUTHORIZED: a member left unset. */
			if (op->read->not_found == 0)
				fail(idem_routes[i].label, "a read without "
				    ".not_found (a problem, or PROBLEM_NONE)");
			printf(",\"strategy\":\"read\",\"arg\":");
			string(op->read->arg);
			printf(",\"rule\":");
			string(op->read->rule);
			printf(",\"parse\":\"%s\",\"not_found\":%d",
			    op->read->parse == idem_path_ref ? "ref" : "id",
			    op->read->not_found);
		} else if (op->strategy == lease_run && op->call != NULL) {
			if (op->call->declined == 0 || op->call->rejected == 0)
				fail(idem_routes[i].label, "a lease call without "
				    ".declined or .rejected");
			printf(",\"strategy\":\"lease\",\"declined\":%d,"
			    "\"rejected\":%d", op->call->declined,
			    op->call->rejected);
		} else if (op->strategy == transactional_run) {
			printf(",\"strategy\":\"transactional\"");
		} else {
			fail(idem_routes[i].label, "a strategy this script "
			    "does not know (or a read or lease table missing)");
		}

		if (op->strategy != idem_read_run) {
			if (op->fields == NULL || op->nfields == 0)
				fail(idem_routes[i].label, "no fields");
			for (n = 0; n < op->nfields; n++) {
				if (op->fields[n].name == NULL)
					fail(idem_routes[i].label, "a field "
					    "table with a NULL row (a field "
					    "table has no end row; an answer "
					    "table has)");
			}
			fields("fields", op->fields, op->nfields);
			printf(",\"limits\":[");
			for (n = 0; n < op->nfields; n++) {
				printf("%s", n > 0 ? "," : "");
				limits(idem_routes[i].label, &op->fields[n]);
			}
			printf("]");
		}

		if (op->answer == NULL || op->nanswer == 0)
			fail(idem_routes[i].label, "no answer table "
			    "(IDEM_ANSWER)");
		fields("answer", op->answer, op->nanswer);
		printf("}");
	}
	printf("]\n");

	return (0);
}

static void
fields(const char *member, const struct idem_field *f, size_t n)
{
	size_t			i;

	printf(",\"%s\":[", member);
	for (i = 0; i < n; i++) {
		printf("%s{\"name\":", i > 0 ? "," : "");
		string(f[i].name);
		printf(",\"kind\":\"%s\",\"required\":%d,\"fingerprint\":%d,"
		    "\"doc\":", kind_name(f[i].name, f[i].kind),
		    f[i].required != 0, f[i].fingerprint != 0);
		string(f[i].doc);
		printf(",\"values\":");
		string(f[i].values);
		if (f[i].name == NULL)
			fail(member, "a row without a name");
		if (f[i].kind == FIELD_LIST) {
			if (f[i].items == NULL || f[i].nitems == 0)
				fail(f[i].name, "a FIELD_LIST without its rows "
				    "(IDEM_ITEMS)");
			printf(",\"items\":{\"table\":\"%s.%s\"", member,
			    f[i].name);
			fields("rows", f[i].items, f[i].nitems);
			printf("}");
		}
		printf("}");
	}
	printf("]");
}

/*
 * A body field's limits, its kind's narrowed by its own, and its rule in
 * words; a limit that does not narrow its kind's stops the build.
 */
static void
limits(const char *route, const struct idem_field *f)
{
	struct idem_limits	l;
	const char		*why;
	char			rule[IDEM_RULE_LEN], where[256];

	if (!idem_field_limits(f, &l, &why)) {
		(void)snprintf(where, sizeof(where), "%s: field %s", route,
		    f->name);
		fail(where, why);
	}
	idem_field_rule(f, rule, sizeof(rule));

	printf("{\"integer\":%d", l.integer);
	if (l.integer) {
		printf(",\"minimum\":%lld,\"maximum\":%lld,\"nonzero\":%d",
		    (long long)l.min, (long long)l.max, l.nonzero);
	} else {
		printf(",\"minLength\":%zu,\"maxLength\":%zu", l.minlen,
		    l.maxlen);
	}
	printf(",\"pattern\":");
	string(l.pattern);
	printf(",\"values\":");
	string(l.values);
	printf(",\"rule\":");
	string(rule);
	printf("}");
}

/* A JSON string, or null. */
static void
string(const char *s)
{
	if (s == NULL) {
		printf("null");
		return;
	}

	putchar('"');
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

static void
fail(const char *where, const char *what)
{
	fprintf(stderr, "openapi-tables: %s: %s\n", where ? where : "?", what);
	exit(1);
}
