/*
 * Kore enforces its HTTP timeouts (http_header_timeout, http_body_timeout,
 * the keep-alive idle time) from its event loop, every 500 ms, but only
 * while the loop wakes up: a worker with no request in flight and no
 * timer due sleeps in epoll without a bound. There a client that sent
 * half of its headers and stopped, or a kept-alive connection left idle,
 * kept its connection for as long as it liked, past every timeout (a
 * slowloris; tests/http/27_bad_input_catalogue.py). A timer in every
 * worker bounds that sleep, so the timeouts hold.
 *
 * The same timer stops a worker whose parent died (a kill -9 of the
 * parent, the OOM killer): Kore 4.1's workers each keep the other's
 * channel to the parent open and never see it go, and kept serving on the
 * instance's port for minutes, so that a supervisor could not start the
 * instance again (bind: address in use). The kernel sends the worker
 * SIGQUIT (Kore's normal stop, which cuts the requests in flight as any
 * stop of Kore 4.1 does: their clients retry with their keys) the moment
 * its parent dies (PR_SET_PDEATHSIG); should the parent have died before
 * that was set, the worker's parent is no longer the one named in
 * WAKEUP_PARENT_ENV (set by the parent before it forks), and the timer
 * asks the same within WAKEUP_MS.
 */

#include <sys/types.h>
#include <sys/prctl.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <kore/kore.h>

#include "wakeup.h"

/* Kore's own period for checking connection timeouts. */
#define WAKEUP_MS	500

/* The parent's pid, for its workers. */
#define WAKEUP_PARENT_ENV	"IDEM_KORE_PARENT_PID"

static void	wakeup_tick(void *, u_int64_t);

static struct kore_timer	*timer = NULL;
static pid_t			parent = 0;

/*
 * In the parent, before it forks its workers.
 */
void
wakeup_parent_set(void)
{
	char		pid[32];

	(void)snprintf(pid, sizeof(pid), "%d", (int)getpid());
	if (setenv(WAKEUP_PARENT_ENV, pid, 1) == -1)
		fatal("%s: setenv: %s", __func__, errno_s);
}

void
wakeup_start(void)
{
	const char	*env;

	if (worker == NULL || timer != NULL)
		return;

	if (prctl(PR_SET_PDEATHSIG, SIGQUIT) == -1)
		kore_log(LOG_ERR, "%s: prctl: %s", __func__, errno_s);
	/* The parent that forked it, even if it is gone already. */
	if ((env = getenv(WAKEUP_PARENT_ENV)) != NULL)
		parent = (pid_t)strtol(env, NULL, 10);
	else
		parent = getppid();
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
	static int	quitting = 0;

	/* Waking the event loop does the rest; Kore checks the connections. */
	if (quitting || getppid() == parent)
		return;

	quitting = 1;
	kore_log(LOG_NOTICE, "the parent process (pid %d) is gone: stopping",
	    (int)parent);
	/* kill(2), not raise(3): the sandbox allows kill only. */
	(void)kill(getpid(), SIGQUIT);
}
