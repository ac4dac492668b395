"""Security on (`warden dev --secure`): TLS to the router verified against the cluster's CA,
the client named by a bearer token or by its own certificate; no credential (or a wrong
token) is UnauthenticatedError; a plaintext client or a client that does not trust the CA
cannot connect at all."""

import itertools
from pathlib import Path
from typing import Iterator

import pytest

import warden
from cluster import SecureDev, wait_until
from warden import Client, TlsConfig

_unique = itertools.count(1)


@pytest.fixture(scope="module")
def secure_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureDev]:
    """A `warden dev --secure` cluster on free ports, once it serves root's token."""
    dev = SecureDev(tmp_path_factory.mktemp("secure"))
    try:
        def serves() -> bool:
            # The files are read again at every probe: warden dev may still be writing them.
            token = dev.token()
            tls = TlsConfig.from_files(dev.tls_dir / "ca.pem")
            try:
                with Client([dev.router_addr], tls=tls, token=token, connect_timeout_s=1, request_timeout_s=2) as client:
                    client.sync()
                return True
            except warden.WardenError:
                return False

        wait_until("warden dev --secure serves", serves, timeout_s=90)
        yield dev
    finally:
        dev.stop()


def test_token_and_certificate_clients(secure_dev: SecureDev) -> None:
    """root's bearer token over TLS (CA only) and root's client certificate both work for
    the namespace, sessions and locks."""
    tls_dir: Path = secure_dev.tls_dir
    path = f"/teams/payments/py-{next(_unique)}"
    # The endpoint's own host (127.0.0.1) is what the router's certificate is checked for.
    ca_only = TlsConfig.from_files(tls_dir / "ca.pem")
    with Client([secure_dev.router_addr], tls=ca_only, token=secure_dev.token()) as client:
        client.create(path, b"secret")
        assert client.get(path).data == b"secret"
        with client.session(ttl_s=5) as session, session.lock(f"{path}-lock") as guard:
            assert guard.fencing_token > 0
    certificate = TlsConfig.from_files(tls_dir / "ca.pem", tls_dir / "client-root.pem", tls_dir / "client-root.key", "localhost")
    with Client([secure_dev.router_addr], tls=certificate) as client:
        assert client.get(path).data == b"secret"
        client.delete(path)


def test_missing_or_wrong_credentials(secure_dev: SecureDev) -> None:
    """TLS without a credential, or with a token naming nobody, is refused typed; a client
    that does not speak TLS, or expects another name of the router, never connects; bad TLS
    arguments are refused before connecting."""
    tls_dir = secure_dev.tls_dir
    ca_only = TlsConfig.from_files(tls_dir / "ca.pem", server_name="localhost")
    with Client([secure_dev.router_addr], tls=ca_only) as anonymous:
        with pytest.raises(warden.UnauthenticatedError) as refused:
            anonymous.get("/teams")
        assert refused.value.code == warden.ErrorCode.UNAUTHENTICATED
    with Client([secure_dev.router_addr], tls=ca_only, token="0" * 64) as stranger:
        with pytest.raises(warden.UnauthenticatedError):
            stranger.get("/teams")
    with pytest.raises(warden.TransportError):
        Client([secure_dev.router_addr], connect_timeout_s=1)
    # The router's certificate names loopback (localhost, 127.0.0.1, ::1), not this name.
    misnamed = TlsConfig.from_files(tls_dir / "ca.pem", server_name="router.elsewhere.example")
    with pytest.raises(warden.TransportError):
        Client([secure_dev.router_addr], tls=misnamed, token=secure_dev.token(), connect_timeout_s=1)
    with pytest.raises(warden.InvalidArgumentError):
        TlsConfig.from_files(tls_dir / "ca.pem", cert=tls_dir / "client-root.pem")
