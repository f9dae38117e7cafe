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

struct idem_field {
	const char	*name;
	int		kind;
	int		required;
	int		fingerprint;
};

/* An operation: what its key rows are called and what its body holds. */
struct idem_operation {
	const char		*name;
	int			route;
	const struct idem_field	*fields;
	size_t			nfields;
};

struct idem_request {
	u_int64_t			started;
	const struct idem_operation	*op;
	int				route;

	struct auth_lookup	auth;
	char			client_id[AUTH_CLIENT_ID_MAX + 1];
	char			key[IDEM_KEY_MAX + 1];
	char			fingerprint[65];
	struct json_value	*body;
	const char		*values[IDEM_FIELDS_MAX];
	struct kore_buf		canonical;

	struct db_call		db;
	int			db_active;

	void			*extra;
	void			(*extra_free)(void *);
};

struct idem_request	*idem_request(struct http_request *, int,
			    const struct idem_operation *);
int			idem_method(struct http_request *, int, const char *);

int	idem_authenticate(struct http_request *);
int	idem_admit(struct http_request *);
int	idem_execute(struct http_request *, const char *, int,
	    const char **);
int	idem_respond_outcome(struct http_request *);
int	idem_respond_read(struct http_request *);

struct json_value	*idem_parse_body(struct http_request *, char *, size_t);
int	idem_id_valid(const char *, size_t);
void	idem_db_reset(struct idem_request *);
void	idem_respond(struct http_request *, int, const void *, size_t, int);
int	idem_respond_row(struct http_request *, int, int, int);
int	idem_fail(struct http_request *, int, const char *, ...)
	    __attribute__((format (printf, 3, 4)));
int	idem_fail_mismatch(struct http_request *);
int	idem_fail_db(struct http_request *, struct db_call *);

#endif
