/*
 * RFC 9457 problem details: every error the API answers, its status and
 * the page its type URL points at.
 */

#ifndef __H_PROBLEM_H
#define __H_PROBLEM_H

#include <kore/kore.h>
#include <kore/http.h>

#define PROBLEM_UNAUTHORIZED		0
#define PROBLEM_KEY_MISSING		1
#define PROBLEM_KEY_MALFORMED		2
#define PROBLEM_MEDIA_TYPE		3
#define PROBLEM_BODY_TOO_LARGE		4
#define PROBLEM_INVALID_JSON		5
#define PROBLEM_INVALID_REQUEST		6
#define PROBLEM_KEY_REUSED		7
#define PROBLEM_IN_PROGRESS		8
#define PROBLEM_INSUFFICIENT_BALANCE	9
#define PROBLEM_CARD_DECLINED		10
#define PROBLEM_PROVIDER_UNAVAILABLE	11
#define PROBLEM_PROVIDER_TIMEOUT	12
#define PROBLEM_DATABASE_UNAVAILABLE	13
#define PROBLEM_NOT_FOUND		14
#define PROBLEM_METHOD_NOT_ALLOWED	15
#define PROBLEM_INTERNAL		16
#define PROBLEM_PAYMENT_REJECTED	17
#define PROBLEM_KEY_EXPIRED		18
#define PROBLEM_BALANCE_LIMIT		19
#define PROBLEM_PAYMENT_NOT_FOUND	20
#define PROBLEM_REFUND_EXCEEDS		21
#define PROBLEM_REFUND_IN_PROGRESS	22
#define PROBLEM_REFUND_REJECTED		23
#define PROBLEM_DATABASE_MISCONFIGURED	24
#define PROBLEM_PROVIDER_RATE_LIMITED	25
#define PROBLEM_OUTCOME_PENDING		26
#define PROBLEM_MAX			27

/* No problem: a read whose function never answers NULL (idem_read). */
#define PROBLEM_NONE			(-1)

#define PROBLEM_CONTENT_TYPE	"application/problem+json"
#define JSON_CONTENT_TYPE	"application/json"

const char	*problem_title(int);
int	problem_status(int);
void	problem_type_url(int, char *, size_t);
void	problem_body(struct kore_buf *, int, const char *);
void	problem_respond(struct http_request *, int, const char *, ...)
	    __attribute__((format (printf, 3, 4)));

int	problem_not_found(struct http_request *);
int	problem_page(struct http_request *);
void	problem_routes_register(const char *);
void	problem_table_json(struct kore_buf *);

#endif
