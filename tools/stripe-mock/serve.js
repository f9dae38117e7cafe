// Starts stripe-stateful-mock (pinned in package.json) on 127.0.0.1:$PORT
// only: its own cli.js listens on every address. Says where it listens, and
// exits 0 on SIGINT and SIGTERM, as the project's other servers do.
"use strict";

const log = require("loglevel");
const { createExpressApp } = require("stripe-stateful-mock");

log.setLevel(process.env.LOG_LEVEL || "warn");

const port = Number(process.env.PORT || 8889);
const server = createExpressApp().listen(port, "127.0.0.1", () => {
	console.log(`stripe-stateful-mock on http://127.0.0.1:${port}`);
});
server.on("error", (err) => {
	console.error(`stripe-stateful-mock: ${err.message}`);
	process.exit(1);
});

for (const signal of ["SIGINT", "SIGTERM"]) {
	process.on(signal, () => process.exit(0));
}
