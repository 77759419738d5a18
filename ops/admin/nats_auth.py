"""NATS authorization for crr, generated from the catalog and a host list (`crr nats-config`).

Identities and what each may do (docs/contract.md, "Subjects and streams": the subject is the
identity, and NATS authorization vouches for it):

* `host.<host>` (one per host, the agent): publish
  `crr.v1.{report,inventory,health}.host.<host>.*` — minus the subjects of
  external reporters that own host-scope values — and the catalog-following
  pieces;
* `reporter.<r>` (one per external reporter: the SDK, `crr external run`):
  `crr.v1.{report,inventory,health}.cluster.<r>`, plus
  `crr.v1.*.host.*.<r>` when `r` owns host-scope resources, and the
  catalog-following pieces;
* `projector`: `crr.v1.snapshot.>`, `crr.v1.deadletter`, create and read
  the two streams;
* `view` (scheduler view, CLI listings, REST API, replay): nothing but
  reading CRR_SNAPSHOT and CRR_EVENTS (ephemeral consumers, direct get);
* `admin`: `crr.v1.catalog`, `crr.v1.admin.>` (`crr hosts forget`) and the
  whole JetStream API (`crr catalog apply`, stream provisioning, purging a
  forgotten host's events).

"Catalog-following pieces" — the least a JetStream publish-with-ack plus an
ordered consumer on `crr.v1.snapshot.catalog` need: subscribe `_INBOX.>`
(acks, API replies and the consumer's deliveries), publish
`$JS.API.CONSUMER.{CREATE,INFO,DELETE}` on CRR_SNAPSHOT and the consumer's
flow-control replies `$JS.FC.CRR_SNAPSHOT.>`.  Nothing else: no stream
creation, no `crr.v1.catalog`, no other host's subjects.  The tests run the
agent, the SDK, the projector, the CLI and the view on a real server with
exactly these permissions.

Credentials: nkeys by default (the server config holds only public keys;
ed25519 verification is cheap, so 10k agents reconnecting after a server
restart cost little), or users with bcrypt-hashed passwords (`--auth
password`; bcrypt is deliberately slow: ~0.1-0.2 s per identity to generate
at the default cost 11, and the same CPU on the server per connect).
Credential files are written mode 0600 in a 0700 directory; existing ones
are kept (re-running with more hosts does not invalidate deployed keys).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from crr.bus.server import NatsServer
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.distribution import install_hint
from crr.schemas.errors import CrrError
from crr.schemas.subjects import (
    ADMIN_ALL,
    CATALOG,
    DEADLETTER,
    EVENT_TYPES,
    EVENTS_STREAM,
    SNAPSHOT_ALL,
    SNAPSHOT_CATALOG,
    SNAPSHOT_STREAM,
    STATUS_PARTITIONS,
    cluster_event_filter,
    host_event_filter,
    token,
)

AuthMode = Literal["nkey", "password"]

INBOX = "_INBOX.>"
DEFAULT_BCRYPT_COST = 11
CONFIG_NAME = "auth.conf"
EXAMPLE_CATALOG = Path(__file__).resolve().parent / "examples" / "resources.yaml"


@dataclass(frozen=True)
class NatsUser:
    """One NATS user: its file stem, role, and allowed (and denied) subjects."""

    name: str
    role: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = (INBOX,)
    publish_deny: tuple[str, ...] = ()


def _read_stream(stream: str, filters: Sequence[str] | None = None) -> list[str]:
    """Publish permissions to read `stream` with ephemeral/ordered consumers and direct get.

    `filters` narrows the named-consumer create subject (`CREATE.<stream>.<name>.<filter>`)
    to those filter subjects; nats-py's ordered consumer uses the unnamed form.
    """
    create = [f"$JS.API.CONSUMER.CREATE.{stream}"]
    create += ([f"$JS.API.CONSUMER.CREATE.{stream}.*.{f}" for f in filters] if filters
               else [f"$JS.API.CONSUMER.CREATE.{stream}.>"])
    return [
        *create,
        f"$JS.API.CONSUMER.INFO.{stream}.*",
        f"$JS.API.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _read_stream_fully(stream: str) -> list[str]:
    return [*_read_stream(stream), f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>"]


FOLLOW_CATALOG = tuple(_read_stream(SNAPSHOT_STREAM, [SNAPSHOT_CATALOG]))


def _external_host_reporters(catalog: Catalog) -> list[str]:
    return sorted({r.reporter for r in catalog.resources.values()
                   if r.scope == "host" and r.reporter in catalog.reporters
                   and catalog.reporters[r.reporter].type == "external"})


def host_identity(host: str, catalog: Catalog) -> NatsUser:
    """The agent on `host`: its own host subjects only (not an external reporter's)."""
    t = token(host)
    deny = tuple(host_event_filter(host=host, reporter=r)
                 for r in _external_host_reporters(catalog))
    return NatsUser(
        name=f"host.{t}", role="host",
        publish=(*(host_event_filter(k, host) for k in EVENT_TYPES), *FOLLOW_CATALOG),
        publish_deny=deny)


def reporter_identity(reporter: str, catalog: Catalog) -> NatsUser:
    """An external reporter: its cluster subjects (+ host subjects if it owns host-scope values)."""
    t = token(reporter)
    subjects = [cluster_event_filter(k, reporter) for k in EVENT_TYPES]
    if reporter in _external_host_reporters(catalog):
        subjects += [host_event_filter(k, reporter=reporter) for k in EVENT_TYPES]
    return NatsUser(name=f"reporter.{t}", role="reporter",
                    publish=(*subjects, *FOLLOW_CATALOG))


def simulator_identity(hosts: Iterable[str]) -> NatsUser:
    """One connection publishing for many (simulated) hosts: `crr demo`, `crr sim`."""
    pubs = [host_event_filter(k, h) for h in hosts for k in EVENT_TYPES]
    return NatsUser(name="simulator", role="simulator", publish=(*pubs, *FOLLOW_CATALOG))


PROJECTOR = NatsUser(
    name="projector", role="projector",
    publish=(SNAPSHOT_ALL, DEADLETTER, "$JS.API.INFO",
             *(f"$JS.API.STREAM.{op}.{s}" for op in ("CREATE", "UPDATE")
               for s in (EVENTS_STREAM, SNAPSHOT_STREAM)),
             *_read_stream_fully(EVENTS_STREAM), *_read_stream_fully(SNAPSHOT_STREAM)),
    # Partitions hear each other's status writes (see crr.projector.service: covered_seq).
    subscribe=(INBOX, STATUS_PARTITIONS))
VIEW = NatsUser(
    name="view", role="view",
    publish=("$JS.API.INFO", "$JS.API.STREAM.NAMES",
             *_read_stream_fully(SNAPSHOT_STREAM), *_read_stream_fully(EVENTS_STREAM)))
ADMIN = NatsUser(name="admin", role="admin",
                 publish=(CATALOG, ADMIN_ALL, "$JS.API.>", "$JS.FC.>"))


def identities(
    catalog: Catalog, hosts: Iterable[str], *, simulated_hosts: Sequence[str] = ()
) -> list[NatsUser]:
    """Every identity for `catalog` and `hosts`: roles first, then reporters, then hosts."""
    out = [PROJECTOR, VIEW, ADMIN]
    out += [reporter_identity(r, catalog) for r, spec in sorted(catalog.reporters.items())
            if spec.type == "external"]
    out += [host_identity(h, catalog) for h in sorted(set(hosts))]
    if simulated_hosts:
        out.append(simulator_identity(simulated_hosts))
    return out


# -- credentials ------------------------------------------------------------------------


def _write_secret(path: Path, text: str) -> None:
    """Write `text` to `path` with mode 0600 from the start (no window with wider rights)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)  # the mode must not depend on the umask
    os.replace(tmp, path)


def require_auth_extra(mode: AuthMode = "nkey") -> None:
    """CrrError with the install hint unless the `auth` extra's module for `mode` imports.

    Checked before anything is written, so a missing package leaves no half-made files.
    """
    name = "nkeys" if mode == "nkey" else "bcrypt"
    try:
        importlib.import_module(name)
    except ImportError:
        raise CrrError(f"{name} is not installed ({'nkey' if mode == 'nkey' else 'password'} "
                       f"credentials need the auth extra): {install_hint('auth')}") from None


def _nkey_user(path: Path) -> str:
    """The public key of the user seed in `path`, creating the seed file if missing."""
    # Optional dependency (`nats-config` only); the package ships no type hints.
    import nkeys  # type: ignore[import-untyped]  # noqa: PLC0415

    if path.exists():
        seed = bytearray(path.read_bytes().strip())
    else:
        seed = bytearray(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
        _write_secret(path, seed.decode() + "\n")
    kp = nkeys.from_seed(seed)
    public = str(kp.public_key.decode())
    kp.wipe()
    return public


def _password_user(path: Path, user: str, cost: int) -> str:
    """The bcrypt hash of the password in `path` (created if missing) for the server config."""
    import bcrypt  # noqa: PLC0415 - optional dependency, `--auth password` only

    password: str | None = None
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "password":
                password = value.strip()
    if not password:
        password = secrets.token_urlsafe(24)
        _write_secret(path, f"# crr NATS credentials ({user}); keep private\n"
                            f"user: {user}\npassword: {password}\n")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    # nats-server recognises bcrypt by the `$2a$` prefix; bcrypt writes `$2b$` (same algorithm).
    return "$2a$" + hashed[4:] if hashed.startswith("$2b$") else hashed


@dataclass
class AuthBundle:
    """What `generate` wrote: the server's authorization file, one credentials file per identity."""

    config: Path
    creds: dict[str, Path] = field(default_factory=dict)
    """Identity name (`admin`, `view`, `projector`, `host.<h>`, `reporter.<r>`) → file."""
    mode: AuthMode = "nkey"

    def for_host(self, host: str) -> Path:
        """The credentials file of the agent on `host`."""
        return self.creds[f"host.{token(host)}"]

    def for_reporter(self, reporter: str) -> Path:
        """The credentials file of external reporter `reporter`."""
        return self.creds[f"reporter.{token(reporter)}"]


def _permissions(ident: NatsUser) -> dict[str, object]:
    publish: dict[str, object] = {"allow": list(ident.publish)}
    if ident.publish_deny:
        publish["deny"] = list(ident.publish_deny)
    return {"publish": publish, "subscribe": {"allow": list(ident.subscribe)}}


def generate(
    catalog: Catalog,
    hosts: Iterable[str],
    out_dir: str | Path,
    *,
    mode: AuthMode = "nkey",
    bcrypt_cost: int = DEFAULT_BCRYPT_COST,
    simulated_hosts: Sequence[str] = (),
) -> AuthBundle:
    """Write `out_dir/auth.conf` (an `authorization {}` block) and `out_dir/creds/<identity>`.

    Include the block from the server configuration (`include "auth.conf"`).
    Existing credentials files are reused, so keys already deployed stay valid.
    """
    require_auth_extra(mode)
    out = Path(out_dir)
    creds_dir = out / "creds"
    creds_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    os.chmod(creds_dir, 0o700)
    bundle = AuthBundle(config=out / CONFIG_NAME, mode=mode)
    users: list[dict[str, object]] = []
    for ident in identities(catalog, hosts, simulated_hosts=simulated_hosts):
        entry: dict[str, object]
        if mode == "nkey":
            path = creds_dir / f"{ident.name}.nk"
            entry = {"nkey": _nkey_user(path)}
        else:
            path = creds_dir / f"{ident.name}.userpass"
            entry = {"user": ident.name, "password": _password_user(path, ident.name, bcrypt_cost)}
        entry["permissions"] = _permissions(ident)
        users.append(entry)
        bundle.creds[ident.name] = path
    # JSON is valid nats-server configuration syntax, and quotes every subject safely.
    body = json.dumps({"users": users}, indent=1)
    _write_secret(bundle.config, "# generated by `crr nats-config`; include it from the "
                  "server configuration\nauthorization " + body + "\n")
    return bundle


# -- TLS for tests and demos ------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost."""

    ca: Path
    cert: Path
    key: Path


def make_test_certificates(directory: str | Path) -> Certificates:
    """A throw-away CA and server certificate (the `openssl` CLI); for tests and demos only."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CrrError("openssl not found: it is needed to make a test certificate")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.pem", "server.key",
                                                  "server.csr", "server.pem"))
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=crr test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", ext],
    ]
    for step in steps:
        run = subprocess.run([openssl, *map(str, step)], capture_output=True, check=False)
        if run.returncode != 0:
            tail = run.stderr.decode(errors="replace")[-300:]
            raise CrrError(f"openssl {step[0]} failed: {tail}")
    for p in (ca_key, key):
        p.chmod(0o600)
    return Certificates(ca=ca, cert=cert, key=key)


# -- the secure demo --------------------------------------------------------------------


@dataclass
class SecureDemo:
    """A running nats-server with generated authorization, and who connects with what."""

    server: NatsServer
    url: str
    bundle: AuthBundle
    tls_ca: Path | None = None

    def creds(self, identity: str) -> str:
        """The credentials file of `identity` (`admin`, `projector`, `view`, `host.<h>`…)."""
        return str(self.bundle.creds[identity])

    def stop(self) -> None:
        """Stop the server (the store directory is the caller's)."""
        self.server.stop()


def server_config(bundle: AuthBundle, certificates: Certificates | None = None) -> str:
    """A nats-server configuration that includes the authorization (and TLS when given)."""
    lines = [f"include {json.dumps(bundle.config.name)}"]
    if certificates is not None:
        lines.append("tls " + json.dumps({"cert_file": str(certificates.cert),
                                          "key_file": str(certificates.key), "timeout": 5}))
    return "\n".join(lines) + "\n"


async def secure_demo_setup(
    store_dir: str | Path,
    *,
    catalog: Catalog | None = None,
    hosts: Sequence[str] = (),
    simulated_hosts: Sequence[str] = (),
    tls: bool = False,
    mode: AuthMode = "nkey",
    bcrypt_cost: int = 4,
) -> SecureDemo:
    """Generate authorization + credentials under `store_dir`, start nats-server with it.

    `catalog` defaults to the bundled example; `hosts` get agent identities,
    `simulated_hosts` one shared `simulator` identity.  `tls=True` adds a
    throw-away CA and serves `tls://` (clients pass `tls_ca`).  The caller
    stops the server (`demo.stop()`).
    """
    require_auth_extra(mode)
    store = Path(store_dir)
    if catalog is None:
        catalog = await asyncio.to_thread(load_catalog, EXAMPLE_CATALOG)
    auth_dir = store / "auth"
    bundle = await asyncio.to_thread(generate, catalog, hosts, auth_dir, mode=mode,
                                     bcrypt_cost=bcrypt_cost, simulated_hosts=simulated_hosts)
    certificates = await asyncio.to_thread(make_test_certificates, store / "tls") if tls else None
    conf = auth_dir / "server.conf"
    conf.write_text(server_config(bundle, certificates))
    server = NatsServer(store / "nats", port=0, config_file=conf)
    await asyncio.to_thread(server.start)
    url = f"{'tls' if tls else 'nats'}://127.0.0.1:{server.port}"
    return SecureDemo(server=server, url=url, bundle=bundle,
                      tls_ca=certificates.ca if certificates else None)
