/*
 * Calls of the payment provider (POST /v1/charges, /v1/refunds, and the
 * GET of its lists when an answer is reconciled), made with libcurl's multi
 * interface on the worker's own event loop: any number of calls in
 * flight, none blocking the worker, no thread pool.
 */

#ifndef __H_PROVIDER_CLIENT_H
#define __H_PROVIDER_CLIENT_H

#include <curl/curl.h>

#include <kore/kore.h>
#include <kore/http.h>

#define PROVIDER_ID_MAX		128
#define PROVIDER_DETAIL_MAX	256

struct provider_call {
	CURL			*easy;
	struct curl_slist	*headers;
	struct kore_buf		response;
	size_t			response_max;
	char			errbuf[CURL_ERROR_SIZE];
	int			done;
	/* Sent again after a 408 on a reused connection (provider_client.c). */
	int			resent;
	CURLcode		result;
	long			status;
	/* The answer's Retry-After in seconds as libcurl read it, or 0. */
	curl_off_t		retry_after_sent;

	/* Woken up, or called back, when the call is done. */
	struct http_request	*req;
	void			(*cb)(struct provider_call *, void *);
	void			*arg;

	/*
	 * The answer's request id (its provider's kept_header), when it
	 * sent one: what proves a kept 5xx its own (provider_answer.c).
	 */
	char			proof[64];

	/* Filled by provider_answer_classify(). */
	char			id[PROVIDER_ID_MAX + 1];
	char			detail[PROVIDER_DETAIL_MAX];
	char			log[PROVIDER_DETAIL_MAX];
	u_int32_t		retry_after;
};

void	provider_client_init(void);
void	provider_client_unload(void);
void	provider_call_start(struct provider_call *, const char *,
	    const char *, const char *, size_t);
void	provider_call_get(struct provider_call *, const char *);
void	provider_call_cleanup(struct provider_call *);

#endif
