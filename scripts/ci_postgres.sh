#!/usr/bin/env bash
# Starts a local PostgreSQL for the storage tests' second database and prints the URL to export as
# KERNELLOOP_TEST_DATABASE_URL (the tests wipe that database). When it cannot, it prints no URL, says why on
# stderr (a line starting `ci_postgres:`) and exits 1: .ci/run then fails, naming PostgreSQL.
set -uo pipefail
fail() {
  echo "ci_postgres: $*" >&2
  exit 1
}
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  out=$( (apt-get update -qq && apt-get install -y -qq postgresql) 2>&1) ||
    fail "could not install postgresql (apt-get install postgresql): $(tail -n 3 <<<"$out")"
fi
version=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
[ -n "$version" ] || fail "no PostgreSQL server under /usr/lib/postgresql"
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
  out=$(pg_createcluster "$version" main 2>&1) || fail "pg_createcluster $version main failed: $(tail -n 3 <<<"$out")"
fi
if ! pg_ctlcluster "$version" main status >/dev/null 2>&1; then
  out=$(pg_ctlcluster "$version" main start 2>&1) || fail "pg_ctlcluster $version main start failed: $(tail -n 3 <<<"$out")"
fi
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
[ -n "$port" ] || fail "pg_lsclusters shows no port for cluster $version main"
sql="psql -q -p $port -c \"DROP DATABASE IF EXISTS kltest\" -c \"DROP ROLE IF EXISTS kl\""
sql="$sql -c \"CREATE ROLE kl LOGIN PASSWORD 'kl'\" -c \"CREATE DATABASE kltest OWNER kl\""
out=$(su postgres -c "$sql" 2>&1) || fail "could not create the role kl and the database kltest: $(tail -n 3 <<<"$out")"
echo "postgresql+psycopg://kl:kl@127.0.0.1:$port/kltest"
