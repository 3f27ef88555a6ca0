"""PostgreSQL for the team stack: Debian's package, its own data directory, on 127.0.0.1 only. It refuses to run
as root, so as root every command runs as the `postgres` user (which must be able to traverse the state folder).
One role owns the databases of MLflow, MLflow's auth app and Prefect; its password is set from the secrets file on
every up and reaches psql by environment, never a command line."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from flows.cli.stack.servers import DATABASES, DB_ROLE, HOST, SWEEP_DATABASE, SWEEP_ROLE, base_env, run_checked
from flows.cli.stack.state import SWEEP_DB_SECRET, StackPaths
from tasks.core.env import PG_PASSWORD_ENV, STACK_DIR_ENV
from tasks.core.errors import TorchshipError

POSTGRES_INSTALL = "install it with `make stack-deps` (Debian: apt-get install postgresql)"


def postgres_bin() -> Path:
    """Debian's PostgreSQL binaries (the newest installed version)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise TorchshipError(f"PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): {POSTGRES_INSTALL}.")
    return found[-1].parent


def as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` user (Debian's package creates it)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def owned_by_postgres(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import shutil

        shutil.chown(folder, "postgres", "postgres")
    folder.chmod(0o700)


def start_postgres(paths: StackPaths, port: int, environ: Mapping[str, str]) -> None:
    """initdb on the first up, then pg_ctl start (waits until it accepts connections); nothing if it runs."""
    bindir, data, socket = postgres_bin(), paths.postgres / "data", paths.postgres / "socket"
    env = base_env(environ)
    paths.postgres.mkdir(parents=True, exist_ok=True)
    paths.postgres.chmod(0o711)   # the postgres user must traverse it, and nobody list it
    reachable = subprocess.run(as_postgres(["test", "-x", str(paths.postgres)]), env=env)
    if reachable.returncode != 0:
        raise TorchshipError(f"the postgres user cannot reach {paths.postgres}: a folder above it is closed to "
                             f"others (mode 700?). Put the stack elsewhere: export {STACK_DIR_ENV}=/var/tmp/...")
    owned_by_postgres(socket)
    owned_by_postgres(paths.postgres / "log")
    if not (data / "PG_VERSION").exists():
        owned_by_postgres(data)
        run_checked("initdb", as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                                           "--auth-local=trust", "--auth-host=scram-sha-256", "--no-instructions"]),
                    env)
    if subprocess.run(as_postgres([str(bindir / "pg_ctl"), "status", "-D", str(data)]), env=env,
                      capture_output=True).returncode == 0:
        return
    # A failing statement is never written to the log with its text: the role's password goes through SQL.
    options = f"-c listen_addresses={HOST} -p {port} -k {socket} -c log_min_error_statement=panic"
    log = paths.postgres / "log" / "postgres.log"
    run_checked("pg_ctl start", as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                                             "-o", options, "start"]), env)


def create_databases(paths: StackPaths, port: int, secrets: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """The roles (their passwords set on every up, from the secrets file) and their databases, created when
    missing: torchship's (MLflow, its auth app, Prefect) and the sweep's (its studies). The passwords reach psql by
    environment (`\\getenv`), not its command line."""
    exists = "SELECT 'CREATE {what}' WHERE NOT EXISTS (SELECT FROM {table} WHERE {column} = '{name}')\\gexec\n"
    sql = ""
    for role, secret, databases in ((DB_ROLE, PG_PASSWORD_ENV, DATABASES),
                                    (SWEEP_ROLE, SWEEP_DB_SECRET, (SWEEP_DATABASE,))):
        sql += exists.format(what=f"ROLE {role} LOGIN", table="pg_roles", column="rolname", name=role)
        sql += f"\\getenv password {secret}\nALTER ROLE {role} PASSWORD :'password';\n"
        for database in databases:
            sql += exists.format(what=f"DATABASE {database} OWNER {role}", table="pg_database", column="datname",
                                 name=database)
    command = [str(postgres_bin() / "psql"), "-h", str(paths.postgres / "socket"), "-p", str(port), "-U", "postgres",
               "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-f", "-"]
    passwords = {PG_PASSWORD_ENV: secrets[PG_PASSWORD_ENV], SWEEP_DB_SECRET: secrets[SWEEP_DB_SECRET]}
    run_checked("psql", as_postgres(command), {**base_env(environ), **passwords}, sql)


def postgres_pid(paths: StackPaths) -> int | None:
    """The postmaster's PID while it runs: a pid file left by a crash (or a PID since reused) names none."""
    import psutil

    try:
        pid = int((paths.postgres / "data" / "postmaster.pid").read_text().split()[0])
        return pid if psutil.Process(pid).name() == "postgres" else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def stop_postgres(paths: StackPaths, environ: Mapping[str, str]) -> None:
    """pg_ctl stop -m fast (rolls back open transactions, waits until it is down); nothing if it is not running."""
    data = paths.postgres / "data"
    if postgres_pid(paths) is None:
        return
    run_checked("pg_ctl stop", as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                                            "-t", "60", "stop"]), base_env(environ))
