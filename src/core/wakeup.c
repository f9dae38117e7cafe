/*
 * Kore enforces its HTTP timeouts (http_header_timeout, http_body_timeout,
 * the keep-alive idle time) from its event loop, every 500 ms, but only
 * while the loop wakes up: a worker with no request in flight and no
 * timer due sleeps in epoll without a bound. There a client that sent
 * half of its headers and stopped, or a kept-alive connection left idle,
 * kept its connection for as long as it liked, past every timeout (a
 * slowloris; tests/http/27_bad_input_catalogue.py). A timer in every
 * worker bounds that sleep, so the timeouts hold; it does nothing else.
 */

#include <sys/types.h>

#include <kore/kore.h>

#include "wakeup.h"

/* Kore's own period for checking connection timeouts. */
#define WAKEUP_MS	500

static void	wakeup_tick(void *, u_int64_t);

static struct kore_timer	*timer = NULL;

void
wakeup_start(void)
{
	if (worker == NULL || timer != NULL)
		return;

	timer = kore_timer_add(wakeup_tick, WAKEUP_MS, NULL, 0);
}

/*
 * Before a reload: the timer points into the code that goes.
 */
void
wakeup_stop(void)
{
	if (timer != NULL) {
		kore_timer_remove(timer);
		timer = NULL;
	}
}

static void
wakeup_tick(void *arg, u_int64_t now)
{
	/* Waking the event loop is all; Kore checks the connections. */
}
