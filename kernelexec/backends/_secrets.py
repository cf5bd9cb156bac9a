"""Secrets the code never sees: placeholders, their substitution, TLS for secret hosts only.

Under ``NetworkPolicy(secrets={"NAME": Secret(value, hosts=[...])})`` the code's environment
holds ``NAME=kx-secret-NAME-<random>``: a placeholder made per session (per ``Egress``). The
egress proxy (``_egress``) calls in here:

* ``rewrite_head``: a request's line and headers, the placeholders of the secrets that the
  request's host carries replaced by their values; any other placeholder stays as it is and is
  reported (withheld), so code cannot send a secret elsewhere by sending its placeholder there.
* ``carries``: a ``CONNECT`` to a host that carries a secret is terminated here with a session CA
  made per ``Egress`` (``server_context``), and the proxy connects upstream with normal
  verification (``upstream_context``: the system's trust store plus ``upstream_ca``). Every
  other ``CONNECT`` stays a blind tunnel: its TLS contents are never inspected.
* ``Redactor``: what such a host answers, a value echoed back (``/headers``) replaced by as many
  ``*`` (same length: ``Content-Length`` and chunk sizes stay right). Plain text only: an echo
  that is compressed or encoded (gzip, base64) is not recognised.

The CA's private key exists only in this process's memory (and, for the instant ``ssl`` loads
it, in a private 0700 folder of the host's temp dir, never the work dir); the code gets the CA's
certificate only, in a file it cannot write. The CA is name-constrained to the secret hosts.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import secrets as _random
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .._network import NetworkPolicy, Secret

#: where a container's copy of the CA bundle is written (``/tmp`` is sticky: the code's uid can
#: neither change nor replace a file the relay's uid owns)
CONTAINER_BUNDLE = "/tmp/kernelexec-ca.pem"
#: the variables that make the code's TLS clients trust the session CA
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass(kw_only=True)
class Rewritten:
    """A request head after substitution, and which secrets it sent or withheld (names)."""

    head: bytes
    sent: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)


class SessionSecrets:
    """One session's placeholders, CA and TLS contexts (made once, at the ``Egress``'s start)."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self.secrets: dict[str, Secret] = dict(policy.secrets)
        self.placeholders = {
            name: f"kx-secret-{name}-{_random.token_hex(16)}" for name in self.secrets
        }
        self.ca_pem, self.server_context = _session_ca(self.secrets)
        self.upstream_context = ssl.create_default_context()
        if policy.upstream_ca is not None:
            self.upstream_context.load_verify_locations(cafile=policy.upstream_ca)
        self.upstream_context.set_alpn_protocols(["http/1.1"])

    def carries(self, host: str, port: int) -> bool:
        """Whether some secret goes to ``host:port`` (its CONNECTs are terminated here)."""
        return any(secret.carried_by(host, port) for secret in self.secrets.values())

    def rewrite_head(self, head: bytes, host: str, port: int) -> Rewritten:
        """``head`` with the placeholders of ``host:port``'s secrets replaced by their values."""
        out = Rewritten(head=head)
        for name, secret in self.secrets.items():
            placeholder = self.placeholders[name].encode()
            if placeholder not in out.head:
                continue
            if secret.carried_by(host, port):
                out.head = out.head.replace(placeholder, secret.value.encode())
                out.sent.append(name)
            else:
                out.withheld.append(name)
        return out

    def redactor(self, host: str, port: int) -> Redactor | None:
        """A filter for what ``host:port`` answers, when it holds any secret's value."""
        values = [s.value.encode() for s in self.secrets.values() if s.carried_by(host, port)]
        return Redactor(values) if values else None

    def environment(self, bundle: str) -> dict[str, str]:
        """The code's variables: the placeholders, and the CA bundle at ``bundle`` trusted."""
        env = dict(self.placeholders)
        env.update({name: bundle for name in CA_VARIABLES})
        env["NODE_EXTRA_CA_CERTS"] = bundle  # node adds it to its own store
        return env

    def bundle(self) -> bytes:
        """The session CA's certificate followed by the host's system trust store: what the
        code trusts (other hosts' certificates still verify, through the blind tunnels)."""
        system = b""
        for path in [ssl.get_default_verify_paths().cafile, *_SYSTEM_BUNDLES]:
            if path and os.path.isfile(path):
                system = Path(path).read_bytes()
                break
        return self.ca_pem + b"\n" + system


def write_bundle(secrets: SessionSecrets, folder: Path) -> Path:
    """The CA bundle as a read-only file in ``folder`` (the egress folder: not the work dir)."""
    path = folder / "ca-bundle.pem"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    with os.fdopen(fd, "wb") as file:
        file.write(secrets.bundle())
    os.chmod(path, 0o444)
    return path


#: run in a container as the relay's uid: writes the session CA plus the container's own trust
#: store to CONTAINER_BUNDLE, read-only (``python3 -I -S -c SCRIPT PEM``)
CONTAINER_BUNDLE_SCRIPT = r"""
import os, sys
system = b""
for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
    if os.path.isfile(path):
        system = open(path, "rb").read()
        break
target = sys.argv[2]
fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
os.write(fd, sys.argv[1].encode() + b"\n" + system)
os.close(fd)
"""


class Redactor:
    """Replaces each value by as many ``*`` in a byte stream fed in pieces (a value split
    across two pieces is found: the last ``len - 1`` bytes wait for the next piece)."""

    def __init__(self, values: list[bytes]) -> None:
        self._values = sorted(set(values), key=len, reverse=True)
        self._keep = max(len(v) for v in self._values) - 1
        self._carry = b""
        self.hits = 0

    def feed(self, data: bytes) -> bytes:
        text = self._carry + data
        for value in self._values:
            if value in text:
                self.hits += text.count(value)
                text = text.replace(value, b"*" * len(value))
        cut = max(0, len(text) - self._keep)
        self._carry = text[cut:]
        return text[:cut]

    def flush(self) -> bytes:
        out, self._carry = self._carry, b""
        return out


def _session_ca(secrets: dict[str, Secret]) -> tuple[bytes, ssl.SSLContext]:
    """A new CA (name-constrained to the secret hosts) and a server context presenting one
    certificate for all of them, signed by it. Returns the CA certificate's PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names: list[x509.GeneralName] = []
    permitted: list[x509.GeneralName] = []
    for secret in secrets.values():
        for rule in secret.rules:
            if rule.address is not None:
                names.append(x509.IPAddress(rule.address))
                permitted.append(x509.IPAddress(ipaddress.ip_network(rule.address)))
            else:
                names.append(x509.DNSName(f"*.{rule.host}" if rule.wildcard else rule.host))
                permitted.append(x509.DNSName(rule.host))  # the name and every name below
    names, permitted = list(dict.fromkeys(names)), list(dict.fromkeys(permitted))
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"kernelexec session CA {_random.token_hex(4)}")]
    )
    # Even a copy of this CA could vouch for no other host than the secrets' own.
    constraints = x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None)
    key_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(constraints, critical=True)
        .add_extension(key_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kernelexec secret host")])
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_alpn_protocols(["http/1.1"])  # the proxy reads HTTP/1.1 heads, never h2
    _load_chain(context, leaf.public_bytes(pem) + ca_cert.public_bytes(pem), key_pem)
    return ca_cert.public_bytes(pem), context


def _load_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """``ssl`` loads a key from a file only: a private folder, the file gone at once."""
    folder = tempfile.mkdtemp(prefix="kernelexec-tls-")  # 0700, the host's temp dir
    try:
        cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
        context.load_cert_chain(cert_path, key_path)
    finally:
        for name in ("cert.pem", "key.pem"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
