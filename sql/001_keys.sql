-- Clients and the idempotency keys shared by both strategies.

-- Formats are checked with a length and an unbounded character class:
-- PostgreSQL's regex engine expands a bounded repetition such as {1,255}
-- into as many copies, which made one key check cost 0.1 ms.
create table if not exists clients (
	client_id	text primary key
			check (length(client_id) <= 64 and
			    client_id ~ '^[A-Za-z0-9._-]+$'),
	token_sha256	text not null unique
			check (length(token_sha256) = 64 and
			    token_sha256 ~ '^[0-9a-f]+$'),
	created_at	timestamptz not null default now()
);

comment on table clients is
    'API clients. A bearer token is stored only as its SHA-256 (hex).';

-- Hot tables carry client_id without a foreign key: it comes from the
-- authenticated token, and a foreign key would make every insert lock the
-- client's row, which serialises a busy client on multixacts.
create table if not exists idempotency_keys (
	client_id	text not null,
	idem_key	text not null check (length(idem_key) <= 255 and
			    idem_key ~ '^[!-~]+$'),
	operation	text not null,
	fingerprint	text not null check (length(fingerprint) = 64 and
			    fingerprint ~ '^[0-9a-f]+$'),
	status		text not null check (status in ('in_progress', 'done')),
	lease_id	bigint not null default 0 check (lease_id >= 0),
	locked_until	timestamptz,
	request		jsonb,
	status_code	int check (status_code between 100 and 599),
	response	text,
	created_at	timestamptz not null default now(),
	finished_at	timestamptz,
	primary key (client_id, idem_key),
	check ((status = 'done') = (status_code is not null and
	    response is not null and finished_at is not null))
);

comment on table idempotency_keys is
    'One row per (client, Idempotency-Key). The transactional strategy '
    'writes it in the same transaction as the business rows, so it is only '
    'ever seen done. The lease strategy takes it first as in_progress with a '
    'lease (locked_until) and a fencing token (lease_id), then saves the '
    'outcome. response holds the exact bytes replayed to retries.';
comment on column idempotency_keys.operation is
    'What the key was used for (orders.create, payments.create, ...): the '
    'same key for another operation is a mismatch, like another fingerprint.';
comment on column idempotency_keys.lease_id is
    'Fencing token: incremented by every take-over; a worker may complete or '
    'release the key only with the lease_id it took.';
comment on column idempotency_keys.request is
    'The fields that define a payment, kept so that the recovery job can '
    'finish an abandoned one.';

-- Neither index covers a column the end of a transactional request
-- changes (status, status_code, response, finished_at), so that saving the
-- response is a HOT update of the row the request inserted.
create index if not exists idempotency_keys_created
    on idempotency_keys (created_at);
create index if not exists idempotency_keys_leased
    on idempotency_keys (locked_until) where locked_until is not null;

-- What a retry of a finished key gets: the saved response, or 'mismatch'
-- when the key was first used for another request. After an insert that
-- waited it must run as a separate statement, which reads with a fresh
-- snapshot. Stable, so that PL/pgSQL callers get it inlined.
create or replace function idempotency_replay(p_client text, p_key text,
    p_operation text, p_fingerprint text)
returns table (outcome text, status_code int, response text)
language sql stable as $$
	select case when k.operation = p_operation and
		    k.fingerprint = p_fingerprint then 'replayed'
		    else 'mismatch' end,
	       k.status_code, k.response
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
$$;

comment on function idempotency_replay(text, text, text, text) is
    'The answer to a retry of a finished key: replayed or mismatch.';

create or replace function idempotency_finish(p_client text, p_key text,
    p_status_code int, p_response text)
returns void
language plpgsql as $$
begin
	update idempotency_keys
	   set status = 'done', status_code = p_status_code,
	       response = p_response, finished_at = now()
	 where client_id = p_client and idem_key = p_key;
end;
$$;

comment on function idempotency_finish(text, text, int, text) is
    'Saves the outcome of a key taken in the same transaction.';
