#!/usr/bin/env bash
# Starts a local PostgreSQL for the storage tests' second database and prints the URL to export as
# KERNELLOOP_TEST_DATABASE_URL (the tests wipe that database). Prints nothing if it cannot.
set -uo pipefail
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null 2>&1 || exit 0
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
pg_lsclusters -h | grep -q "^$version main" || pg_createcluster "$version" main >/dev/null 2>&1
pg_ctlcluster "$version" main start >/dev/null 2>&1
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
su postgres -c "psql -q -p $port -c \"DROP DATABASE IF EXISTS kltest\" -c \"DROP ROLE IF EXISTS kl\" -c \"CREATE ROLE kl LOGIN PASSWORD 'kl'\" -c \"CREATE DATABASE kltest OWNER kl\"" >/dev/null 2>&1 || exit 0
echo "postgresql+psycopg://kl:kl@127.0.0.1:$port/kltest"
