/*
 * On SIGHUP Kore reloads the module in the parent and in every worker:
 * dlclose() and dlopen(), so every static of the old image is gone and
 * every pointer into it dangles. Work in flight holds such pointers: a
 * request's free callback and operation table, the timers of the fake
 * provider and of the jobs, libcurl's callbacks, a job's database call.
 *
 * So a worker reloads only while it holds no work. Each request with
 * state and each job round holds the worker (reload_hold); asked to
 * unload while held, the worker refuses (Kore keeps its old image and
 * calls it "forced no reloaded"), admits no new work (the handlers defer
 * new requests, which wait in Kore without any state of ours), and once
 * the last piece of work is released it sends itself SIGHUP, so that
 * Kore reloads it from its own loop, with nothing left to lose. Meanwhile
 * it gives up Kore's accept lock, so that new connections go to the other
 * workers instead of waiting here.
 *
 * The parent holds no work: its statics are refilled by the workers it
 * forks later (settings from the environment, the metrics mapping from a
 * tagged Kore allocation).
 */

#include <sys/types.h>

#include <signal.h>
#include <unistd.h>

#include "reload.h"

static u_int32_t	held = 0;
static int		pending = 0;
static u_int32_t	max_connections = 0;

void
reload_hold(void)
{
	held++;
}

void
reload_release(void)
{
	if (held == 0)
		fatal("%s: nothing held", __func__);

	held--;

	if (held == 0 && pending) {
		/*
		 * Kore keeps one pending signal: a SIGHUP now would replace
		 * a SIGQUIT or SIGTERM not yet handled, and the worker would
		 * reload instead of stopping, its parent waiting for it.
		 */
		if (sig_recv == SIGQUIT || sig_recv == SIGTERM ||
		    sig_recv == SIGINT)
			return;
		kore_log(LOG_NOTICE, "work drained; reloading the module");
		/* kill(2), not raise(3): the sandbox allows kill only. */
		if (kill(getpid(), SIGHUP) == -1)
			kore_log(LOG_ERR, "%s: kill: %s", __func__, errno_s);
	}
}

/*
 * The onload callback's answer to KORE_MODULE_UNLOAD.
 */
int
reload_unload(void)
{
	if (held == 0) {
		if (pending)
			worker_max_connections = max_connections;
		return (KORE_RESULT_OK);
	}

	if (!pending) {
		kore_log(LOG_NOTICE, "reload waits for %u requests or jobs "
		    "in flight", held);

		/*
		 * A worker "full" of connections releases Kore's accept lock
		 * and does not take it again: the other workers accept the
		 * new connections while this one drains. Restored before
		 * the reload (the setting lives in Kore, not in the module).
		 */
		max_connections = worker_max_connections;
		worker_max_connections = 0;
	}
	pending = 1;

	return (KORE_RESULT_ERROR);
}

/*
 * True for a new request that must wait for the reload: it is called
 * again by Kore until the new code takes it.
 */
int
reload_defer(struct http_request *req)
{
	return (pending && !http_state_exists(req));
}

int
reload_pending(void)
{
	return (pending);
}
