/*
 * libcurl's multi interface driven by Kore's event loop: curl tells which
 * sockets to watch (watch_socket) and when to wake it (schedule_timeout);
 * Kore's epoll and timers call back into curl_multi_socket_action().
 */

#include <sys/types.h>
#include <sys/epoll.h>

#include <stdio.h>
#include <string.h>

#include "provider.h"
#include "provider_client.h"
#include "settings.h"

#define RESPONSE_MAX		65536

/*
 * A page of a provider's list (a reconciliation): Stripe's charges are a
 * few KiB each, 100 to a page.
 */
#define LIST_RESPONSE_MAX	(1024 * 1024)

/*
 * A kept-alive connection to the provider is reused only while it has been
 * idle for less than this many seconds. Servers time out an idle kept-alive
 * connection (Kore, the fake provider: http_header_timeout, 10 s by
 * default; Apache and Node.js: 5 s); Kore writes a 408 on it before it
 * closes it, and a request sent on that connection read the stale 408 as
 * the provider's answer: a 502 from a healthy provider. libcurl's default
 * (118 s) is above all of them. CURLOPT_MAXAGE_CONN: libcurl >= 7.65
 * (Debian 12 has 7.88).
 */
#define PROVIDER_CONN_MAXAGE_S	4L

/*
 * A 408 on a reused connection is sent once more on a fresh one (see
 * call_resend()), if at least this much of the call's timeout is left.
 */
#define PROVIDER_RESEND_MIN_MS	100L

/*
 * A socket libcurl asked us to watch; Kore's epoll loop hands it back to
 * socket_ready() as the event's data.
 *
 * Kore reads a whole batch of events from epoll before it runs the first
 * handler, and libcurl may close any of its sockets from inside
 * curl_multi_socket_action(): handling one socket also runs the timeouts
 * of every other transfer, and a transfer that timed out closes its
 * connection. An event of that socket can still be waiting further down
 * the same batch. So CURL_POLL_REMOVE never frees a watch: it takes the
 * socket out of epoll, marks the watch dead and puts it on the graveyard;
 * a dead watch ignores the event still in the batch, and a zero-delay timer
 * frees the graveyard. Kore runs timers only after the whole batch has
 * been handled, and no later batch can name a socket that left epoll.
 */
struct socket_watch {
	struct kore_event		evt;
	curl_socket_t			fd;
	int				dead;
	TAILQ_ENTRY(socket_watch)	list;
};

TAILQ_HEAD(watch_list, socket_watch);

static int	watch_socket(CURL *, curl_socket_t, int, void *, void *);
static int	schedule_timeout(CURLM *, long, void *);
static void	proof_read(struct provider_call *, CURL *);
static void	socket_ready(void *, int);
static void	timeout_fired(void *, u_int64_t);
static void	graveyard_free(void *, u_int64_t);
static void	collect_finished(void);
static size_t	response_append(char *, size_t, size_t, void *);
static int	call_resend(struct provider_call *, CURL *);
static void	call_prepare(struct provider_call *, const char *);
static void	call_add(struct provider_call *);

static CURLM			*multi = NULL;
static struct kore_timer	*timer = NULL;
static struct kore_timer	*reaper = NULL;
static struct watch_list	graveyard = TAILQ_HEAD_INITIALIZER(graveyard);

void
provider_client_init(void)
{
	if (multi != NULL)
		return;

	if ((multi = curl_multi_init()) == NULL)
		fatal("curl_multi_init failed");

	curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, watch_socket);
	curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, schedule_timeout);
}

/*
 * Before a reload: the multi handle holds our callbacks. No call is in
 * flight then (each belongs to a request, a job round or a flow whose
 * client left (handoff.c), which hold the worker), so cleaning it up only
 * closes idle connections.
 */
void
provider_client_unload(void)
{
	if (timer != NULL) {
		kore_timer_remove(timer);
		timer = NULL;
	}

	if (multi != NULL) {
		curl_multi_cleanup(multi);
		multi = NULL;
	}

	/* Kore reloads from its loop, after the event batch: free them now. */
	if (reaper != NULL) {
		kore_timer_remove(reaper);
		reaper = NULL;
	}
	graveyard_free(NULL, 0);
}

/*
 * Starts a POST to the provider's path with the given Idempotency-Key and
 * body, written as the provider takes it (provider.c).
 */
void
provider_call_start(struct provider_call *call, const char *path,
    const char *key, const char *body, size_t len)
{
	char		header[512];

	call_prepare(call, path);

	(void)snprintf(header, sizeof(header), "Idempotency-Key: %s", key);
	call->headers = curl_slist_append(call->headers, header);
	call->headers = curl_slist_append(call->headers,
	    provider->body == BODY_FORM ?
	    "Content-Type: application/x-www-form-urlencoded" :
	    "Content-Type: application/json");
	call->headers = curl_slist_append(call->headers, "Expect:");

	curl_easy_setopt(call->easy, CURLOPT_HTTPHEADER, call->headers);
	curl_easy_setopt(call->easy, CURLOPT_POSTFIELDSIZE, (long)len);
	curl_easy_setopt(call->easy, CURLOPT_COPYPOSTFIELDS, body);

	call_add(call);
}

/*
 * Starts a GET of the provider's path and query (a list, when an answer
 * is reconciled).
 */
void
provider_call_get(struct provider_call *call, const char *path)
{
	call_prepare(call, path);
	call->response_max = LIST_RESPONSE_MAX;
	curl_easy_setopt(call->easy, CURLOPT_HTTPHEADER, call->headers);
	curl_easy_setopt(call->easy, CURLOPT_HTTPGET, 1L);
	call_add(call);
}

/* What every call has: the URL, the secret, the timeout, the callbacks. */
static void
call_prepare(struct provider_call *call, const char *path)
{
	struct kore_buf		auth;
	char			url[2048];
	int			n;

	/* IDEM_PROVIDER_URL is at most 256 bytes (settings.c). */
	n = snprintf(url, sizeof(url), "%s%s", settings.provider_url, path);
	if (n < 0 || (size_t)n >= sizeof(url))
		fatal("%s: the provider URL is too long", __func__);

	kore_buf_init(&call->response, 256);
	call->response_max = RESPONSE_MAX;
	call->done = 0;
	call->resent = 0;
	call->headers = NULL;
	call->errbuf[0] = '\0';

	if ((call->easy = curl_easy_init()) == NULL)
		fatal("curl_easy_init failed");

	if (provider->bearer) {
		kore_buf_init(&auth, 128);
		kore_buf_appendf(&auth, "Authorization: Bearer %s",
		    settings.provider_secret);
		call->headers = curl_slist_append(call->headers,
		    kore_buf_stringify(&auth, NULL));
		kore_buf_cleanup(&auth);
	}

	curl_easy_setopt(call->easy, CURLOPT_URL, url);
	curl_easy_setopt(call->easy, CURLOPT_TIMEOUT_MS,
	    (long)settings.provider_timeout_ms);
	curl_easy_setopt(call->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(call->easy, CURLOPT_MAXAGE_CONN,
	    PROVIDER_CONN_MAXAGE_S);
	curl_easy_setopt(call->easy, CURLOPT_WRITEFUNCTION, response_append);
	curl_easy_setopt(call->easy, CURLOPT_WRITEDATA, call);
	curl_easy_setopt(call->easy, CURLOPT_ERRORBUFFER, call->errbuf);
	curl_easy_setopt(call->easy, CURLOPT_PRIVATE, call);
}

static void
call_add(struct provider_call *call)
{
	CURLMcode	rc;

	if ((rc = curl_multi_add_handle(multi, call->easy)) != CURLM_OK)
		fatal("curl_multi_add_handle: %s", curl_multi_strerror(rc));
}

void
provider_call_cleanup(struct provider_call *call)
{
	if (call->easy != NULL) {
		if (!call->done)
			curl_multi_remove_handle(multi, call->easy);
		curl_easy_cleanup(call->easy);
		call->easy = NULL;
	}

	if (call->headers != NULL) {
		curl_slist_free_all(call->headers);
		call->headers = NULL;
	}

	kore_buf_cleanup(&call->response);
}

static int
watch_socket(CURL *easy, curl_socket_t fd, int what, void *udata,
    void *socketp)
{
	struct socket_watch	*w = socketp;
	int			events;

	if (what == CURL_POLL_REMOVE) {
		if (w != NULL) {
			kore_platform_disable_read(fd);
			curl_multi_assign(multi, fd, NULL);
			w->dead = 1;
			TAILQ_INSERT_TAIL(&graveyard, w, list);
			if (reaper == NULL) {
				reaper = kore_timer_add(graveyard_free, 0,
				    NULL, KORE_TIMER_ONESHOT);
			}
		}
		return (0);
	}

	if (w == NULL) {
		w = kore_calloc(1, sizeof(*w));
		w->evt.type = KORE_TYPE_CURL_HANDLE;
		w->evt.handle = socket_ready;
		w->fd = fd;
		curl_multi_assign(multi, fd, w);
	}

	events = 0;
	if (what & CURL_POLL_IN)
		events |= EPOLLIN;
	if (what & CURL_POLL_OUT)
		events |= EPOLLOUT;

	kore_platform_event_schedule(fd, events, 0, w);

	return (0);
}

static int
schedule_timeout(CURLM *m, long timeout_ms, void *udata)
{
	if (timer != NULL) {
		kore_timer_remove(timer);
		timer = NULL;
	}

	if (timeout_ms >= 0) {
		timer = kore_timer_add(timeout_fired, (u_int64_t)timeout_ms,
		    NULL, KORE_TIMER_ONESHOT);
	}

	return (0);
}

static void
socket_ready(void *arg, int error)
{
	struct socket_watch	*w = arg;
	int			flags, running;

	/* Its socket was closed earlier in this batch (see socket_watch). */
	if (w->dead)
		return;

	flags = 0;
	if (w->evt.flags & KORE_EVENT_READ)
		flags |= CURL_CSELECT_IN;
	if (w->evt.flags & KORE_EVENT_WRITE)
		flags |= CURL_CSELECT_OUT;
	if (error)
		flags |= CURL_CSELECT_ERR;

	/* curl_multi_socket_action() may close this very socket. */
	w->evt.flags = 0;
	curl_multi_socket_action(multi, w->fd, flags, &running);

	collect_finished();
}

static void
timeout_fired(void *arg, u_int64_t now)
{
	int		running;

	/* Kore frees a one-shot timer after this callback. */
	timer = NULL;
	curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);

	collect_finished();
}

/*
 * Frees the watches of closed sockets, once the event batch that may have
 * named them is over.
 */
static void
graveyard_free(void *arg, u_int64_t now)
{
	struct socket_watch	*w;

	/* Kore frees a one-shot timer after this callback. */
	reaper = NULL;

	while ((w = TAILQ_FIRST(&graveyard)) != NULL) {
		TAILQ_REMOVE(&graveyard, w, list);
		kore_free(w);
	}
}

static void
collect_finished(void)
{
	CURLMsg			*msg;
	struct provider_call	*call;
	int			left;

	while ((msg = curl_multi_info_read(multi, &left)) != NULL) {
		if (msg->msg != CURLMSG_DONE)
			continue;

		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &call);
		call->result = msg->data.result;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE,
		    &call->status);
		if (call_resend(call, msg->easy_handle))
			continue;
		proof_read(call, msg->easy_handle);
		/* Kept in the call: provider_answer.c reads nothing else. */
		if (curl_easy_getinfo(msg->easy_handle, CURLINFO_RETRY_AFTER,
		    &call->retry_after_sent) != CURLE_OK)
			call->retry_after_sent = 0;
		curl_multi_remove_handle(multi, msg->easy_handle);
		call->done = 1;

		if (call->req != NULL)
			http_request_wakeup(call->req);
		if (call->cb != NULL)
			call->cb(call, call->arg);
	}
}

/*
 * A 408 read on a reused connection is, most likely, the one the server
 * wrote when it timed the idle connection out, before our request reached
 * it: PROVIDER_CONN_MAXAGE_S makes that rare but cannot rule it out (the
 * server's idle timeout is not known, and it may close just as the request
 * goes out). A 408 says the server did not read the request, and the call
 * carries the same derived Idempotency-Key, so the request is sent once
 * more, on a fresh connection, within what is left of the call's timeout.
 * A 408 on a fresh connection, or on the resend, is the provider's answer.
 */
static int
call_resend(struct provider_call *call, CURL *easy)
{
	CURLMcode	rc;
	curl_off_t	spent_us;
	long		connects, left_ms;

	if (call->resent || call->result != CURLE_OK || call->status != 408)
		return (0);

	if (curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects) !=
	    CURLE_OK || connects != 0)
		return (0);

	if (curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME_T, &spent_us) !=
	    CURLE_OK)
		return (0);

	left_ms = (long)settings.provider_timeout_ms - (long)(spent_us / 1000);
	if (left_ms < PROVIDER_RESEND_MIN_MS)
		return (0);

	kore_log(LOG_NOTICE, "provider answered 408 on a reused connection: "
	    "sending the request again on a fresh one");

	curl_multi_remove_handle(multi, easy);
	call->resent = 1;
	call->status = 0;
	call->errbuf[0] = '\0';
	kore_buf_reset(&call->response);

	curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 1L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, left_ms);

	if ((rc = curl_multi_add_handle(multi, easy)) != CURLM_OK)
		fatal("curl_multi_add_handle: %s", curl_multi_strerror(rc));

	return (1);
}

static size_t
response_append(char *ptr, size_t size, size_t nmemb, void *udata)
{
	struct provider_call	*call = udata;
	size_t			len;

	len = size * nmemb;
	if (call->response.offset + len > call->response_max)
		return (0);

	kore_buf_append(&call->response, ptr, len);

	return (len);
}

/*
 * The answer's request id header, its provider's kept_header (Stripe's
 * Request-Id), kept in the call for provider_answer.c: a 5xx is the
 * provider's own, kept under the key, only with it.
 */
static void
proof_read(struct provider_call *call, CURL *easy)
{
	struct curl_header	*h;

	call->proof[0] = '\0';
	if (provider == NULL || provider->kept_header == NULL)
		return;
	if (curl_easy_header(easy, provider->kept_header, 0, CURLH_HEADER, -1,
	    &h) != CURLHE_OK || h->value == NULL)
		return;
	(void)kore_strlcpy(call->proof, h->value, sizeof(call->proof));
}
