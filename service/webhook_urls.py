"""Where a webhook may be delivered: no private, loopback or link-local address (SSRF).

A webhook URL is chosen by whoever holds an API key, and the service POSTs to it from inside
its own network. Without a restriction that is a server-side request forgery: a subscription
to ``http://169.254.169.254/...`` (a cloud's metadata service), ``http://localhost:5432`` or
``http://10.0.0.7/admin`` makes the service send requests where the key holder cannot reach.
By default every address a webhook's host resolves to must be globally routable
(:attr:`ipaddress.IPv4Address.is_global`, IPv4-mapped IPv6 addresses judged as IPv4, no
multicast). ``FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1`` (``Settings.webhook_allow_private``) lifts it,
for a receiver on the same host or network (and the test suite's local receiver).

The check runs twice: when the subscription is created (``POST /webhooks`` answers 422 naming
the ``url`` field; a host that does not resolve yet is accepted) and at every delivery, because
DNS may change in between. At delivery the request goes to the very address that was checked
(:func:`pinned_request`: the URL's host replaced by that address, the ``Host`` header and the
TLS server name kept), so a name that resolves to a public address for the check and to a
private one a moment later (DNS rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import socket

import httpx

__all__ = ["ALLOW_PRIVATE_VARIABLE", "WebhookURLRefused", "resolve_webhook_host", "pinned_request"]

ALLOW_PRIVATE_VARIABLE = "FLAUDIT_WEBHOOK_ALLOW_PRIVATE"


class WebhookURLRefused(ValueError):
    """The URL's host is, or resolves to, an address webhooks may not be sent to."""


def _refused(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is not part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def resolve_webhook_host(url: str, *, allow_private: bool, strict: bool) -> list[str]:
    """The addresses ``url``'s host resolves to (an IP literal: itself).

    Raises :class:`WebhookURLRefused` when one of them is not globally routable and
    ``allow_private`` is false, or when the host does not resolve and ``strict`` (at delivery;
    at subscription a name that does not resolve yet is accepted: ``[]``)."""
    parsed = httpx.URL(url)
    host = parsed.host
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, _port(parsed), type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            if strict:
                raise WebhookURLRefused(f"the host {host!r} does not resolve") from exc
            return []
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allow_private:
        refused = [a for a in addresses if _refused(a)]
        if refused:
            named = host if [host] == refused else f"{host} ({', '.join(refused)})"
            raise WebhookURLRefused(
                f"webhook URLs may not point at private, loopback, link-local or other "
                f"non-public addresses: {named}; set {ALLOW_PRIVATE_VARIABLE}=1 on the server "
                "to allow them"
            )
    return addresses


def pinned_request(url: str, *, allow_private: bool) -> tuple[str, dict, dict]:
    """``(url, headers, extensions)`` for an httpx request to ``url`` that connects to the
    first address checked by :func:`resolve_webhook_host` (raises as it does): the host
    replaced by that address, ``Host`` set to the original, and for https the original name
    as the TLS server name (``sni_hostname``: certificate checked against it)."""
    parsed = httpx.URL(url)
    address = resolve_webhook_host(url, allow_private=allow_private, strict=True)[0]
    host_header = parsed.host if parsed.port is None else f"{parsed.host}:{parsed.port}"
    if ":" in parsed.host and parsed.port is None:  # an IPv6 literal
        host_header = f"[{parsed.host}]"
    elif ":" in parsed.host:
        host_header = f"[{parsed.host}]:{parsed.port}"
    extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
    return str(parsed.copy_with(host=address)), {"Host": host_header}, extensions
