/*
 * The release this code is (CHANGELOG.md, RELEASES): every answer carries
 * it (Idem-Version), /healthz's body names it, the log says it at start.
 * scripts/ read it from here (lib.sh's release_version).
 */

#ifndef __H_RELEASE_H
#define __H_RELEASE_H

#define IDEM_RELEASE		"1.1.0"

#endif
