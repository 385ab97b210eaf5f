"""Webhook URLs may not point at private, loopback or link-local addresses (SSRF), unless the
server sets FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1: refused at subscription with a 422 naming the
field, and again at delivery, where the request goes to the address that was checked.

The delivery tests give one made-up name (``hooks.flaudit.test``) an address of their choosing
by wrapping ``socket.getaddrinfo`` (every other name resolves as usual): that is how "DNS
changed between the subscription and the delivery" is made to happen on one machine. The
service, its database and the receiver (a real HTTP server on 127.0.0.1) are real.
"""

from __future__ import annotations

import socket

import pytest

from flaudit.service.settings import Settings
from flaudit.service.webhook_urls import WebhookURLRefused, pinned_request, resolve_webhook_host

from .conftest import AUTH, make_client
from .test_webhooks import FAST, Receiver, deliveries, gap_round, put_gap, subscribe, wait_for

NAME = "hooks.flaudit.test"
PUBLIC = "93.184.215.14"  # a globally routable address (never connected to here)

REFUSED = [
    "http://127.0.0.1:8080/hook",
    "http://localhost/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "https://192.168.1.10/hook",
    "http://169.254.169.254/latest/meta-data",  # a cloud's metadata service
    "http://100.64.0.1/hook",  # carrier-grade NAT (shared address space)
    "http://0.0.0.0/hook",
    "http://[::1]/hook",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://[::ffff:10.0.0.1]/hook",  # IPv4-mapped
    "http://224.0.0.1/hook",  # multicast
]


@pytest.mark.parametrize("url", REFUSED)
def test_private_addresses_are_refused(url):
    with pytest.raises(WebhookURLRefused, match="FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1"):
        resolve_webhook_host(url, allow_private=False, strict=False)
    resolve_webhook_host(url, allow_private=True, strict=False)  # allowed when asked


@pytest.mark.parametrize("url", [f"https://{PUBLIC}/hook", "http://[2606:4700::1111]:8443/x"])
def test_public_literals_pass_and_are_pinned_with_their_host(url):
    assert resolve_webhook_host(url, allow_private=False, strict=True)
    target, headers, extensions = pinned_request(url, allow_private=False)
    assert target == url
    assert headers["Host"] in url
    assert ("sni_hostname" in extensions) == url.startswith("https")


def test_an_unresolvable_host_is_accepted_at_subscription_but_not_at_delivery():
    url = "https://hooks.example.invalid/x"  # .invalid never resolves (RFC 6761)
    assert resolve_webhook_host(url, allow_private=False, strict=False) == []
    with pytest.raises(WebhookURLRefused, match="does not resolve"):
        pinned_request(url, allow_private=False)


def test_the_setting_reads_its_variable(monkeypatch):
    assert Settings.from_env().webhook_allow_private is False
    monkeypatch.setenv("FLAUDIT_WEBHOOK_ALLOW_PRIVATE", "1")
    assert Settings.from_env().webhook_allow_private is True


def test_subscribing_a_private_url_is_a_422_naming_the_field(store):
    with make_client(store) as client:
        for url in ("http://127.0.0.1:9/hook", "http://169.254.169.254/latest", "http://[::1]/x"):
            response = client.post("/webhooks", json={"url": url}, headers=AUTH)
            assert response.status_code == 422, response.text
            (error,) = response.json()["detail"]
            assert error["loc"] == ["body", "url"]
            assert "private" in error["msg"] and "FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1" in error["msg"]
        assert client.get("/webhooks", headers=AUTH).json()["items"] == []
        ok = client.post("/webhooks", json={"url": f"https://{PUBLIC}/hook"}, headers=AUTH)
        assert ok.status_code == 201, ok.text
    with make_client(store, webhook_allow_private=True) as client:
        response = client.post("/webhooks", json={"url": "http://127.0.0.1:9/h"}, headers=AUTH)
        assert response.status_code == 201, response.text


@pytest.fixture
def dns(monkeypatch):
    """``dns["address"]`` is what ``hooks.flaudit.test`` resolves to."""
    table = {"address": PUBLIC}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == NAME:
            return real(table["address"], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def test_a_name_that_turns_private_after_subscribing_is_refused_at_delivery(store, dns):
    receiver = Receiver()
    try:
        port = receiver.server.server_address[1]
        settings = {**FAST, "webhook_allow_private": False}
        with make_client(store, **settings) as client:
            subscribe(client, f"http://{NAME}:{port}/hook", events=["gap.recorded"])  # public now
            dns["address"] = "127.0.0.1"  # ... and the receiver on loopback a moment later
            audit_id, headers = gap_round(client, store)
            assert put_gap(client, audit_id, headers, 1).status_code == 200
            rows = wait_for(
                lambda: [d for d in deliveries(client, audit_id) if d["status"] == "failed"], 10.0
            )
            assert len(rows) == 1, deliveries(client, audit_id)
            assert rows[0]["last_error"].startswith("refused: ")
            assert NAME in rows[0]["last_error"]
        assert receiver.requests == []  # nothing reached the loopback receiver
    finally:
        receiver.close()


def test_delivery_goes_to_the_checked_address_with_the_original_host(store, dns):
    receiver = Receiver()
    try:
        port = receiver.server.server_address[1]
        dns["address"] = "127.0.0.1"
        with make_client(store, **FAST) as client:  # private addresses allowed
            subscribe(client, f"http://{NAME}:{port}/hook", events=["gap.recorded"])
            audit_id, headers = gap_round(client, store)
            assert put_gap(client, audit_id, headers, 1).status_code == 200
            got = receiver.wait("gap.recorded", timeout=5.0)
            assert got is not None, deliveries(client, audit_id)
            assert got["headers"]["Host"] == f"{NAME}:{port}"
    finally:
        receiver.close()
