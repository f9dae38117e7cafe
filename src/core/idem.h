/*
 * The shared core of both idempotency strategies: authentication, the
 * Idempotency-Key, the body and its fields, the fingerprint, and the
 * responses (saved, replayed or a problem). Every API route runs its
 * request through these steps, listed in its own http_state table.
 */

#ifndef __H_IDEM_H
#define __H_IDEM_H

#include <kore/kore.h>
#include <kore/http.h>

#include "auth.h"
#include "db.h"
#include "json.h"

#define IDEM_KEY_MAX		255
#define IDEM_BODY_MAX		65536
#define IDEM_FIELDS_MAX		8
#define IDEM_AMOUNT_MAX		9007199254740991LL
#define IDEM_ID_MAX		128
#define IDEM_TEXT_MAX		1024

/* What a body field must hold. */
#define FIELD_AMOUNT		1
#define FIELD_POINTS		2
#define FIELD_CURRENCY		3
#define FIELD_ID		4
#define FIELD_TEXT		5
#define FIELD_REF		6
#define FIELD_POINTS_POSITIVE	7
#define FIELD_TOKEN		8	/* 1 to 255 visible ASCII */

/* What an answer's member holds, beside the kinds above (its document). */
#define FIELD_COUNT		9	/* an integer, 0 to 2^53-1 */
#define FIELD_STRING		10	/* any string */
#define FIELD_TIME		11	/* a timestamptz as JSON shows it */
#define FIELD_LIST		12	/* an array of the rows of .items */

/*
 * A member of a request's body (the operation's fields: checked by kind,
 * in the fingerprint or not) or of its answer (docs/openapi.json only,
 * which scripts/openapi.py writes from these tables; every test checks
 * the answers it gets against it). doc says what it is, in one sentence.
 *
 * In an answer, required 0 means the member may be null; values, if set,
 * lists what a string may be ("pending|succeeded"), and items is the table
 * of a FIELD_LIST's rows (IDEM_ITEMS).
 *
 * A body field's kind gives its range (FIELD_AMOUNT: an integer from 1 to
 * 2^53-1); the field may narrow it, never widen it, and the validator, the
 * field's 400, the OpenAPI document and the bad-input catalogue all read
 * the result (idem_field_limits):
 *	IDEM_RANGE(lo, hi)	an integer's bounds, both included;
 *	IDEM_LENGTH(lo, hi)	a string's length in bytes (0: the kind's);
 *	.pattern		a POSIX extended regular expression the
 *				string must match, written in what ECMA-262
 *				reads alike (bracket expressions, anchors,
 *				{n,m}; no \d or \w): the document's pattern;
 *	.values			what the string may be ("EUR|RUB|USD").
 * A limit outside the kind's, or on the wrong kind, stops the build
 * (scripts/openapi-tables.c).
 */
struct idem_field {
	const char		*name;
	int			kind;
	int			required;
	int			fingerprint;
	const char		*doc;
	const char		*values;
	const struct idem_field	*items;
	size_t			nitems;
	int			ranged;
	int64_t			min;
	int64_t			max;
	size_t			minlen;
	size_t			maxlen;
	const char		*pattern;
};

#define IDEM_RANGE(lo, hi)	.ranged = 1, .min = (lo), .max = (hi)
#define IDEM_LENGTH(lo, hi)	.minlen = (lo), .maxlen = (hi)

/* What a body field may hold: its kind's limits, narrowed by its own. */
struct idem_limits {
	int			integer;
	int64_t			min;
	int64_t			max;
	int			nonzero;
	size_t			minlen;
	size_t			maxlen;
	const char		*pattern;
	const char		*values;
};

#define IDEM_RULE_LEN		512

/* A table and its count, as members of an initializer. */
#define IDEM_COUNT(t)		(sizeof(t) / sizeof((t)[0]))
#define IDEM_FIELDS(t)		.fields = (t), .nfields = IDEM_COUNT(t)
#define IDEM_ANSWER(t)		.answer = (t), .nanswer = IDEM_COUNT(t)
#define IDEM_ITEMS(t)		.items = (t), .nitems = IDEM_COUNT(t)

/*
 * The first states of every route's table (http_state_run): authenticate,
 * then a write admits its body, and the strategy's own states follow.
 * A read goes from authentication to its own states.
 */
#define IDEM_STATE_AUTHENTICATE	0
#define IDEM_STATE_ADMIT	1
#define IDEM_STATE_READ		1
#define IDEM_STATE_STRATEGY	2

struct lease_call;
struct lease_flow;
struct idem_read;

/*
 * An operation is a table: its name (the key rows' operation, and the
 * name its SQL registers), the fields of its body (which fingerprint it),
 * the members of its answer, a summary and a paragraph for its document,
 * the strategy that runs it, and what that strategy needs of it: nothing
 * more for the transactional strategy (the SQL knows the operation's
 * function by name), the provider call for the lease strategy, the query
 * for a read.
 *
 * check, if set, is the operation's rule across its fields (two that must
 * differ), run on the body once every field present passed its own: it
 * returns 0 with the reason written in its buffer to refuse the request,
 * which is then a 400 like a bad field, and the key is not taken.
 */
struct idem_operation {
	const char		*name;
	const struct idem_field	*fields;
	size_t			nfields;
	const struct idem_field	*answer;
	size_t			nanswer;
	const char		*summary;
	const char		*doc;
	int			(*check)(struct json_value *, char *, size_t);
	int			(*strategy)(struct http_request *);
	const struct lease_call	*call;
	const struct idem_read	*read;
};

/*
 * A read: one SQL function of the client and one argument, by name.
 * not_found is the problem of a NULL answer (a 404), or PROBLEM_NONE for a
 * function that never answers NULL: if it ever does, that is a 500.
 */
struct idem_read {
	const char	*sql;
	const char	*arg;
	int		(*parse)(struct http_request *, char *, size_t);
	const char	*rule;
	int		not_found;
};

/*
 * A route: the one place that lists them (src/operations/routes.c). Its
 * index is its id; its label names it in the metrics.
 */
struct idem_route {
	int				method;
	const char			*path;
	const char			*label;
	const struct idem_operation	*op;
};

extern const struct idem_route	idem_routes[];
extern const size_t		idem_nroutes;

struct idem_request {
	u_int64_t			started;
	const struct idem_operation	*op;
	int				route;

	/* What the access log says of it (accesslog.c); -1: no answer. */
	int				outcome;
	int				replayed;

	struct auth_lookup	auth;
	char			client_id[AUTH_CLIENT_ID_MAX + 1];
	char			key[IDEM_KEY_MAX + 1];
	char			fingerprint[65];
	struct json_value	*body;
	struct kore_buf		canonical;
	struct kore_buf		request;
	char			arg[IDEM_ID_MAX + 1];

	struct db_call		db;
	int			db_active;
	int			conflict_retries;

	/* What the lease strategy keeps of the request, freed by it. */
	struct lease_flow	*lease;
	void			(*strategy_free)(struct idem_request *);
};

struct idem_request	*idem_request(struct http_request *, int,
			    const struct idem_operation *);
int			idem_method(struct http_request *, int, const char *);

int	idem_authenticate(struct http_request *);
int	idem_admit(struct http_request *);
int	idem_execute(struct http_request *, int, const char *, int,
	    const char **);
int	idem_execute_rerun(struct http_request *, int, const char *, int,
	    const char **, int (*)(struct idem_request *));
int	idem_respond_outcome(struct http_request *);
int	idem_read_run(struct http_request *);

struct json_value	*idem_parse_body(struct http_request *, char *, size_t);
int	idem_path_arg(struct http_request *, char *, size_t);
int	idem_path_ref(struct http_request *, char *, size_t);
int	idem_query_arg(struct http_request *, const char *, char *, size_t);
void	idem_db_reset(struct idem_request *);
void	idem_respond(struct http_request *, int, const void *, size_t, int);
int	idem_respond_row(struct http_request *, int);
int	idem_fail(struct http_request *, int, const char *, ...)
	    __attribute__((format (printf, 3, 4)));
int	idem_fail_mismatch(struct http_request *);
int	idem_fail_db(struct http_request *, struct db_call *);

/* idem_input.c: the client's bytes read without a request. */
int	idem_key_parse(const char *, char *);
int	idem_id_valid(const char *, size_t);
int	idem_field_check(const struct idem_field *, struct json_value *);
int	idem_field_limits(const struct idem_field *, struct idem_limits *,
	    const char **);
void	idem_field_rule(const struct idem_field *, char *, size_t);
int	idem_path_arg_parse(const char *, char *, size_t);
int	idem_path_ref_parse(const char *, char *, size_t);
int	idem_query_arg_parse(const char *, const char *, char *, size_t);

#endif
