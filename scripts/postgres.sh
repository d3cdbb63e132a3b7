#!/usr/bin/env bash
# Start the local Debian PostgreSQL cluster (no systemd needed) and make sure the
# role the tests use exists. Idempotent. Prints the URL to use, and nothing else, on
# stdout: callers capture it, so every other message goes to stderr.
set -euo pipefail
ROLE=${VMPLACER_PG_ROLE:-vmplacer}
PASSWORD=${VMPLACER_PG_PASSWORD:-vmplacer}
if [[ $(id -u) -ne 0 ]]; then
  echo "postgres: run as root to start the local cluster" >&2
  exit 1
fi
version=$(pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $1}')
cluster=$(pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $2}')
if [[ -z $version ]]; then
  version=$(ls /usr/lib/postgresql | sort -n | tail -1)
  cluster=main
  pg_createcluster "$version" "$cluster" >&2
fi
if ! pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1==v && $2==c {print $4}' | grep -q online; then
  pg_ctlcluster "$version" "$cluster" start >&2
fi
for _ in $(seq 1 50); do
  if su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
su postgres -c "psql -qAt" <<SQL >/dev/null
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  END IF;
END \$\$;
SQL
port=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1==v && $2==c {print $3}')
echo "postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$port/postgres"
