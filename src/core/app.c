/*
 * Start-up of the two processes built from this module: the API
 * (kore.conf, server "api") and the fake payment provider
 * (conf/provider.conf, server "provider").
 */

#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <stdio.h>

#include <kore/kore.h>
#include <kore/http.h>
#include <kore/pgsql.h>
#include <kore/seccomp.h>

#include "accesslog.h"
#include "auth.h"
#include "db.h"
#include "docs.h"
#include "framing.h"
#include "jobs.h"
#include "metrics.h"
#include "problem.h"
#include "provider.h"
#include "provider_client.h"
#include "reload.h"
#include "replay_cache.h"
#include "schema.h"
#include "dev.h"
#include "operations.h"
#include "settings.h"
#include "wakeup.h"

/*
 * Syscalls beyond Kore's own filters: libpq's stat() of ~/.pgpass and its
 * GSSAPI probe, libcurl's getpeername(), shutdown(), which libcurl may
 * use on a connection it drops, getppid() and prctl(PR_SET_PDEATHSIG)
 * (a worker whose parent died stops: wakeup.c), and the C library's DNS
 * resolver, run by getaddrinfo_a()'s threads for the database layer
 * (db.c): clone3() and rseq() of the threads, uname(), sendmmsg() of its
 * queries and, for a name with more than one address, their RFC 6724
 * sort: the interfaces' addresses read over a netlink socket (socket()
 * for AF_NETLINK only, bind(), recvmsg(); sendto() and getsockname() are
 * Kore's) and a UDP socket connect()ed to each address (Kore's pgsql
 * filter allows those). Kore's filter kills the offending thread alone
 * (SECCOMP_RET_KILL): a resolver thread killed so would leave its name
 * unresolved until db.c gives the resolution up (DB_RESOLVE_STUCK_MS),
 * so tests/http/65_database_dns.py runs real DNS under the filter, with
 * one address, two, and /etc/hosts' localhost (::1 and 127.0.0.1).
 */
#define APP_SYSCALLS							\
	KORE_SYSCALL_ALLOW(shutdown),					\
	KORE_SYSCALL_ALLOW(newfstatat),					\
	KORE_SYSCALL_ALLOW(getdents64),					\
	KORE_SYSCALL_ALLOW(clone3),					\
	KORE_SYSCALL_ALLOW(rseq),					\
	KORE_SYSCALL_ALLOW(getpeername),				\
	KORE_SYSCALL_ALLOW(getppid),					\
	KORE_SYSCALL_ALLOW(uname),					\
	KORE_SYSCALL_ALLOW(sendmmsg),					\
	KORE_SYSCALL_ALLOW_ARG(socket, 0, AF_NETLINK),			\
	KORE_SYSCALL_ALLOW(bind),					\
	KORE_SYSCALL_ALLOW(recvmsg),					\
	KORE_SYSCALL_ALLOW_ARG(prctl, 0, PR_SET_PDEATHSIG)

#if defined(IDEM_SANITIZE)
/* What the sanitizers' runtime and reports need (sanitize flavor only). */
KORE_SECCOMP_FILTER("app",
	APP_SYSCALLS,
	KORE_SYSCALL_ALLOW(readlink),
	KORE_SYSCALL_ALLOW(readlinkat),
	KORE_SYSCALL_ALLOW(openat),
	KORE_SYSCALL_ALLOW(open),
	KORE_SYSCALL_ALLOW(sigaltstack),
	KORE_SYSCALL_ALLOW(prctl),
	KORE_SYSCALL_ALLOW(sched_yield),
	KORE_SYSCALL_ALLOW(sched_getaffinity),
	KORE_SYSCALL_ALLOW(getrlimit),
	KORE_SYSCALL_ALLOW(prlimit64),
	KORE_SYSCALL_ALLOW(gettid),
	KORE_SYSCALL_ALLOW(tgkill),
	KORE_SYSCALL_ALLOW(rt_sigaction),
	KORE_SYSCALL_ALLOW(rt_sigprocmask),
	KORE_SYSCALL_ALLOW(mprotect),
	KORE_SYSCALL_ALLOW(madvise),
	KORE_SYSCALL_ALLOW(munmap),
	KORE_SYSCALL_ALLOW(mmap),
	KORE_SYSCALL_ALLOW(fstat),
	KORE_SYSCALL_ALLOW(lseek),
	KORE_SYSCALL_ALLOW(pread64),
	KORE_SYSCALL_ALLOW(getcwd)
);
#else
KORE_SECCOMP_FILTER("app",
	APP_SYSCALLS
);
#endif

int	api_init(int);
int	not_found(struct http_request *);
void	kore_parent_configure(int, char **);

static void	bind_server(const char *, const char *);
static void	add_route(const char *, const char *, const char *, int);

void
kore_parent_configure(int argc, char **argv)
{
	/* Line by line into a pipe too, and not again in every worker. */
	fflush(stdout);
	setvbuf(stdout, NULL, _IOLBF, 0);

	settings_load();
	db_url_check();
	metrics_init();
	wakeup_parent_set();
	schema_version_header();

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		fatal("curl_global_init failed");

	if (kore_server_lookup("api") != NULL) {
		/* Refuses to start with a provider that cannot be called. */
		provider_select();
		schema_check_at_start();
		bind_server("api", settings.port);
		routes_register("api");
		problem_routes_register("api");
		docs_routes_register("api");
#if defined(DEV_ROUTES)
		add_route("api", "/dev/canonical-json", "dev_canonical_json",
		    HANDLER_TYPE_STATIC);
		add_route("api", "/dev/problems", "dev_problems",
		    HANDLER_TYPE_STATIC);
#if defined(IDEM_SANITIZE)
		add_route("api", "/dev/sanitizer-canary/heap",
		    "dev_sanitizer_canary", HANDLER_TYPE_STATIC);
		add_route("api", "/dev/sanitizer-canary/ub",
		    "dev_sanitizer_canary", HANDLER_TYPE_STATIC);
#endif
#endif
		add_route("api", "^/", "not_found", HANDLER_TYPE_DYNAMIC);
	} else if (kore_server_lookup("provider") != NULL) {
		bind_server("provider", settings.provider_port);
		add_route("provider", "^/", "not_found", HANDLER_TYPE_DYNAMIC);
	} else {
		fatal("the configuration has neither an api nor a provider "
		    "server block");
	}

	/* Every route, kore.conf's too: a body Kore would not read. */
	framing_guard_routes();
}

/*
 * Runs in each worker: when it starts, and around a reload (see reload.c).
 * Whatever the old image set up is taken down before it goes; the new
 * image finds the settings and the metrics again.
 */
int
api_init(int state)
{
	if (state == KORE_MODULE_UNLOAD) {
		if (reload_unload() != KORE_RESULT_OK)
			return (KORE_RESULT_ERROR);
		jobs_stop();
		db_unload();
		wakeup_stop();
		provider_client_unload();
		auth_unload();
		replay_cache_unload();
		settings_unload();
		return (KORE_RESULT_OK);
	}

	settings_load();
	schema_version_header();
	metrics_attach();
	db_register();
	if (worker != NULL) {
		db_pool_open(DB_POOL_REQUESTS, pgsql_conn_max != 0 ?
		    pgsql_conn_max : DB_REQUESTS_UNLIMITED);
		db_pool_open(DB_POOL_HEALTH, 1);
		db_pool_open(DB_POOL_AUTH, DB_AUTH_CONNS);
	}
	auth_init();
	replay_cache_init();
	provider_select();
	provider_client_init();
	jobs_start();
	wakeup_start();

	return (KORE_RESULT_OK);
}

int
not_found(struct http_request *req)
{
	(void)problem_not_found(req);
	access_log_plain(req, "not_found");

	return (KORE_RESULT_OK);
}

static void
bind_server(const char *name, const char *port)
{
	struct kore_server	*srv;

	srv = kore_server_lookup(name);
	if (!kore_server_bind(srv, settings.host, port, NULL))
		fatal("cannot listen on %s:%s", settings.host, port);

	kore_log(LOG_NOTICE, "%s listening on http://%s:%s", name,
	    settings.host, port);
}

/*
 * Routes added after kore.conf's own, so after the ones it lists.
 */
static void
add_route(const char *server, const char *path, const char *handler,
    int type)
{
	struct kore_server	*srv;
	struct kore_domain	*dom;

	if ((srv = kore_server_lookup(server)) == NULL ||
	    (dom = kore_domain_lookup(srv, "*")) == NULL)
		fatal("no domain * in server %s", server);

	if (!kore_module_handler_new(dom, path, handler, NULL, type))
		fatal("cannot route %s to %s", path, handler);
}
