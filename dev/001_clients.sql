-- Development and test clients. Loaded by make db, make run and make test;
-- never by the migrations in sql/.
insert into clients (client_id, token_sha256)
values ('shop-1', encode(sha256('dev-shop-1'), 'hex')),
       ('shop-2', encode(sha256('dev-shop-2'), 'hex'))
on conflict (client_id) do update set token_sha256 = excluded.token_sha256;
