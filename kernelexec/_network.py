"""What code may reach over the network: ``NetworkPolicy`` and the checks the egress proxy makes.

A back end's ``network=`` is ``"none"`` (no network at all, the default), ``"all"`` (the engine's
or host's network, an explicit opt-in) or a ``NetworkPolicy``: the code still has no interface but
loopback, and a proxy on the host (``backends/_egress``) opens only the connections the policy
allows. This module is the policy alone (no sockets): parsing and checking entries, matching a
request's host and port, and judging the addresses a name resolved to.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

from ._errors import InvalidNetworkPolicy, InvalidSecret

#: ``network=`` values besides a policy
NETWORK_MODES = ("none", "all")
#: the ports an entry without one allows: the web's (an API, a package index)
DEFAULT_PORTS = (80, 443)

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, kw_only=True)
class AllowRule:
    """One parsed allowlist entry: a name (``wildcard``: any name below it, not itself), or an
    address; ``port`` None means ``DEFAULT_PORTS``."""

    host: str
    port: int | None
    wildcard: bool = False
    address: Address | None = None

    def ports(self) -> tuple[int, ...]:
        return DEFAULT_PORTS if self.port is None else (self.port,)

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports():
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        name = f"*.{self.host}" if self.wildcard else self.host
        if self.address is not None and self.address.version == 6:
            name = f"[{name}]"
        return name if self.port is None else f"{name}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """An egress allowlist: which hosts the code may reach, through kernelexec's proxy.

    >>> NetworkPolicy(allow=["api.example.org:443", "*.example.net", "127.0.0.1:8080"])

    An entry is ``HOST[:PORT]``: a DNS name, ``*.`` and a name (any name below it), or an IP
    address (IPv6 in brackets). Without a port it allows 80 and 443. Names are resolved on the
    host by the proxy; a name that resolves to a private, loopback, link-local (the cloud metadata
    address) or otherwise special address is refused unless that address (and port) is itself an
    entry, and an IP literal in a request is refused unless it is an entry. An entry that is none
    of these raises ``InvalidNetworkPolicy`` here, at construction.

    The limits bound what one session's code can make the proxy do; past them a connection is
    refused or cut, and the refusal is in the block's ``network_log`` and ``output``.
    """

    allow: Sequence[str] = ()
    #: connections open at once through the proxy; more are refused until some end
    max_connections: int = 64
    #: bytes the code may send over one connection (an upload past it is cut)
    max_upload_bytes: int = 256 * 1024 * 1024
    #: network_log entries kept per block; past it one summary entry counts the rest
    max_log_entries: int = 1000
    #: seconds the proxy waits for a name to resolve and a connection to open
    connect_timeout: float = 10.0
    #: requirements (``"pandas==2.2.*"``) pip installs when the session starts, from the index
    #: the host's pip is configured with: its hosts are allowed for that step only
    packages: Sequence[str] = ()
    #: ``{"OPENAI_API_KEY": Secret(value, hosts=["api.example.org"])}``: the code's environment
    #: gets a placeholder per name; the proxy puts the value in requests to those hosts only
    secrets: Mapping[str, Secret] = field(default_factory=dict, hash=False)
    #: a PEM file of CA certificates the proxy trusts besides the system's when it connects
    #: to a secret's host (a private API's CA); every other connection is a blind tunnel
    upstream_ca: str | None = None
    rules: tuple[AllowRule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.allow, str):
            raise InvalidNetworkPolicy(
                f"allow= takes a list of hosts, not one string: allow=[{self.allow!r}]"
            )
        entries = tuple(self.allow)
        object.__setattr__(self, "allow", entries)
        object.__setattr__(self, "rules", tuple(parse_entry(e) for e in entries))
        if isinstance(self.packages, str):
            raise InvalidNetworkPolicy(f"packages= takes a list: packages=[{self.packages!r}]")
        object.__setattr__(self, "packages", tuple(self.packages))
        for requirement in self.packages:
            # never an option: "--index-url=..." would send pip elsewhere
            if not isinstance(requirement, str) or not re.match(r"^[A-Za-z0-9]", requirement):
                raise InvalidNetworkPolicy(
                    f"{requirement!r} is not a requirement (a name, with a version if wanted)"
                )
        for name in ("max_connections", "max_upload_bytes", "max_log_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidNetworkPolicy(f"{name} must be a positive integer, not {value!r}")
        if not 0 < self.connect_timeout < 3600:
            raise InvalidNetworkPolicy(
                f"connect_timeout must be between 0 and 3600 s, not {self.connect_timeout!r}"
            )
        object.__setattr__(self, "secrets", _check_secrets(self, self.secrets))
        if self.upstream_ca is not None and not os.path.isfile(self.upstream_ca):
            raise InvalidNetworkPolicy(f"upstream_ca {self.upstream_ca!r} is not a file")

    def with_hosts(self, extra: Iterable[str]) -> NetworkPolicy:
        """This policy with more entries (a package index's hosts, for a session's install)."""
        return NetworkPolicy(
            allow=[*self.allow, *extra],
            max_connections=self.max_connections,
            max_upload_bytes=self.max_upload_bytes,
            max_log_entries=self.max_log_entries,
            connect_timeout=self.connect_timeout,
            packages=self.packages,
            secrets=self.secrets,
            upstream_ca=self.upstream_ca,
        )

    def check_request(self, host: str, port: int) -> str | None:
        """Why a request for ``host:port`` is refused before any lookup, or None to go on."""
        if not 0 < port < 65536:
            return f"port {port} is not a port"
        address = parse_address(host)
        if address is not None:
            if self._address_allowed(address, port):
                return None
            return (
                f"{host} is an IP address; only addresses in the allowlist may be used "
                f"(allowed: {self.describe()})"
            )
        name = normalize_name(host)
        if name is None:
            return f"{host!r} is not a host name"
        if any(rule.address is None and rule.matches(name, port) for rule in self.rules):
            return None
        return f"{name}:{port} is not in the allowlist (allowed: {self.describe()})"

    def check_resolved(self, host: str, port: int, address: Address) -> str | None:
        """Why connecting to ``address`` (what ``host`` resolved to) is refused, or None."""
        if address.is_global and not _special(address):
            return None
        if self._address_allowed(address, port):
            return None
        return (
            f"{host} resolves to {address}, a private, loopback, link-local or reserved "
            "address; such an address is reached only when it is itself in the allowlist"
        )

    def describe(self) -> str:
        return ", ".join(str(rule) for rule in self.rules) or "nothing"

    def _address_allowed(self, address: Address, port: int) -> bool:
        return any(rule.address == address and port in rule.ports() for rule in self.rules)


def check_network(value: object) -> str | NetworkPolicy:
    """A back end's ``network=`` as ``"none"``, ``"all"`` or a policy (``False``/``True`` are the
    old spellings of the first two); ``InvalidNetworkPolicy`` otherwise."""
    if value is False or value is None:
        return "none"
    if value is True:
        return "all"
    if isinstance(value, NetworkPolicy) or value in NETWORK_MODES:
        return value
    raise InvalidNetworkPolicy(
        f'network= is "none", "all" or a NetworkPolicy(allow=[...]), not {value!r}'
    )


class NetworkSetting:
    """What a ``network=`` field means, for the options that carry one (``DockerOptions``,
    ``SandboxOptions``): read once here, so both back ends answer alike."""

    network: bool | str | NetworkPolicy

    @property
    def full_network(self) -> bool:
        """Whether the code joins the engine's or host's network (``network="all"``)."""
        return check_network(self.network) == "all"

    @property
    def egress_policy(self) -> NetworkPolicy | None:
        """The allowlist the egress proxy enforces, when ``network`` is one."""
        mode = check_network(self.network)
        return mode if isinstance(mode, NetworkPolicy) else None


def parse_entry(entry: object) -> AllowRule:
    """One allowlist entry, checked; ``InvalidNetworkPolicy`` saying what is wrong."""
    if not isinstance(entry, str):
        raise InvalidNetworkPolicy(f"an allowlist entry is a string HOST[:PORT], not {entry!r}")
    text = entry.strip()
    if "://" in text or "/" in text or "@" in text or not text:
        raise InvalidNetworkPolicy(
            f"allowlist entry {entry!r} is not a host: write HOST[:PORT] "
            "(e.g. 'api.example.org:443', '*.example.net', '127.0.0.1:8080'), no scheme or path"
        )
    host, port = _split_port(text, entry)
    address = parse_address(host)
    if address is not None:
        return AllowRule(host=str(address), port=port, address=address)
    wildcard = host.startswith("*.")
    name = normalize_name(host[2:] if wildcard else host)
    if name is None or (wildcard and "." not in name):
        raise InvalidNetworkPolicy(
            f"allowlist entry {entry!r} is not a host: {host!r} is neither a DNS name, a '*.' "
            "wildcard over one (at least two labels) nor an IP address"
        )
    return AllowRule(host=name, port=port, wildcard=wildcard)


def _split_port(text: str, entry: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if parse_address(host) is None or (rest and not rest.startswith(":")):
            raise InvalidNetworkPolicy(f"allowlist entry {entry!r}: bad bracketed address")
        return host, _port(rest[1:], entry) if rest else None
    if text.count(":") > 1:
        raise InvalidNetworkPolicy(
            f"allowlist entry {entry!r}: write an IPv6 address in brackets, '[::1]:8080'"
        )
    host, colon, port = text.partition(":")
    return host, _port(port, entry) if colon else None


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidNetworkPolicy(f"allowlist entry {entry!r}: {text!r} is not a port (1-65535)")
    return int(text)


def parse_address(host: str) -> Address | None:
    """``host`` as an IP address (brackets, a zone or an IPv4-mapped IPv6 form unwrapped), or
    None when it is not one. Shorthand IPv4 forms (``127.1``, ``0x7f.1``) are not names either:
    ``normalize_name`` refuses them, so they can never slip past as one."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def normalize_name(host: str) -> str | None:
    """A DNS name in lower case without a trailing dot, or None when ``host`` is not one (an
    all-numeric last label is an address in disguise: ``127.1``, ``2130706433``)."""
    name = host.lower().rstrip(".")
    if not name or len(name) > 253:
        return None
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        return None
    if re.fullmatch(r"[0-9]+|0x[0-9a-f]+", labels[-1]):
        return None
    return name


def _special(address: Address) -> bool:
    """Global by the registry yet never a public service's address (NAT64, 6to4, Teredo wrap
    an IPv4 address that may be private)."""
    if isinstance(address, ipaddress.IPv6Address):
        return (
            address.teredo is not None
            or address.sixtofour is not None
            or (address in ipaddress.IPv6Network("64:ff9b::/96"))
        )
    return address.is_multicast or address.is_reserved


# -- secrets the code never sees -------------------------------------------------------------
#: names kernelexec itself sets in the code's environment under a policy: never a secret's
RESERVED_NAMES = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "PIP_PROXY", "PIP_CERT", "PIP_TARGET",
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
        "HOME", "PATH", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH",
    }
)  # fmt: skip
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class Secret:
    """A value the code may use but never sees: ``Secret(value, hosts=["api.example.org"])``.

    Given to ``NetworkPolicy(secrets={"NAME": Secret(...)})``, the code's environment holds a
    placeholder under ``NAME`` (unguessable, new each session); the egress proxy puts ``value``
    in place of the placeholder in the request line and headers of requests to ``hosts`` (each
    ``HOST[:PORT]`` as in the allowlist, and each allowed by it), and nowhere else. Its repr
    never shows the value.
    """

    value: str = field(repr=False)
    _: KW_ONLY
    hosts: Sequence[str] = ()
    rules: tuple[AllowRule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not self.value:
            raise InvalidSecret("a Secret's value must be a non-empty string")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in self.value) or not self.value.isascii():
            # it goes into an HTTP header: a line break would let it add headers of its own
            raise InvalidSecret("a Secret's value must be printable ASCII (it goes into headers)")
        if isinstance(self.hosts, str) or not self.hosts:
            raise InvalidSecret(
                f"a Secret needs a list of hosts it may be sent to, hosts=[...], not {self.hosts!r}"
            )
        object.__setattr__(self, "hosts", tuple(self.hosts))
        try:
            rules = tuple(parse_entry(host) for host in self.hosts)
        except InvalidNetworkPolicy as exc:
            raise InvalidSecret(f"a Secret's host: {exc}") from None
        object.__setattr__(self, "rules", rules)

    def __repr__(self) -> str:
        return f"Secret(<hidden>, hosts={list(self.hosts)!r})"

    def carried_by(self, host: str, port: int) -> bool:
        """Whether a request to ``host:port`` gets this secret's value."""
        address = parse_address(host)
        if address is not None:
            return any(r.address == address and port in r.ports() for r in self.rules)
        name = normalize_name(host)
        return name is not None and any(
            r.address is None and r.matches(name, port) for r in self.rules
        )


def secrets_from_environment(
    specs: Sequence[str], environ: Mapping[str, str] | None = None
) -> dict[str, Secret]:
    """``--secret NAME@HOST[:PORT][,HOST...]`` (the CLI's and the MCP server's): each value read
    from the variable ``NAME`` of kernelexec's own environment, never from the command line."""
    env = os.environ if environ is None else environ
    found: dict[str, Secret] = {}
    for spec in specs:
        name, at, hosts = spec.partition("@")
        if not at or not name or not hosts:
            raise InvalidSecret(
                f"--secret {spec!r}: write NAME@HOST[:PORT][,HOST...]; the value is read from "
                "the environment variable NAME"
            )
        if name not in env:
            raise InvalidSecret(f"--secret {name}: the variable {name} is not set here")
        found[name] = Secret(env[name], hosts=[h.strip() for h in hosts.split(",")])
    return found


def describe_secrets(policy: NetworkPolicy) -> str:
    """How many secrets a policy holds and for which hosts (names and hosts, never values)."""
    if not policy.secrets:
        return "secrets: none"
    parts = [f"{name} -> {', '.join(s.hosts)}" for name, s in policy.secrets.items()]
    return f"secrets: {len(parts)} ({'; '.join(parts)})"


def _check_secrets(policy: NetworkPolicy, secrets: object) -> Mapping[str, Secret]:
    if not isinstance(secrets, Mapping):
        raise InvalidSecret(f'secrets= takes a mapping {{"NAME": Secret(...)}}, not {secrets!r}')
    for name, secret in secrets.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidSecret(f"{name!r} is not an environment variable name for a secret")
        if name.upper() in RESERVED_NAMES or name.upper().endswith("_PROXY"):
            raise InvalidSecret(f"{name!r} is a name kernelexec sets itself; choose another")
        if not isinstance(secret, Secret):
            raise InvalidSecret(f"secrets[{name!r}] must be a Secret(value, hosts=[...])")
        for rule in secret.rules:
            if not _allowed(policy, rule):
                raise InvalidSecret(
                    f"secret {name!r} names {rule}, which the allowlist does not allow "
                    f"(allowed: {policy.describe()}): add it to allow= first"
                )
    # a copy of its own (a plain dict: policies are deep-copied and pickled by some callers)
    return dict(secrets)


def _allowed(policy: NetworkPolicy, rule: AllowRule) -> bool:
    """Whether the policy allows what ``rule`` names (a secret host without a port: on at
    least one of 80 and 443; requests elsewhere are refused before any secret is considered)."""
    for port in rule.ports():
        if rule.wildcard:
            if any(
                r.wildcard
                and (rule.host == r.host or rule.host.endswith("." + r.host))
                and port in r.ports()
                for r in policy.rules
            ):
                return True
        elif policy.check_request(rule.host, port) is None:
            return True
    return False
