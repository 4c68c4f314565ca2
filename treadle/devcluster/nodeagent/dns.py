"""Cluster DNS for the process nodes: Service names to ready endpoint pod IPs.

Pods' ``/etc/resolv.conf`` points at this server on the bridge gateway, with the usual search list
(``<ns>.svc.cluster.local svc.cluster.local cluster.local``, ``ndots:5``). It answers A queries for
``<service>.<namespace>.svc.cluster.local`` with the addresses of the Service's EndpointSlices that
are ready, which the kube-controller-manager maintains from the pod IPs and readiness the agents
report, for headless and ClusterIP Services alike: there is no kube-proxy, so a client connects to
a pod directly and a Service's ``port`` must equal its ``targetPort`` (true of every Service the
operator renders and of the chart's). ``kubernetes.default.svc.cluster.local`` is the agent's proxy
to the API server. Other names get NXDOMAIN: nothing is forwarded off this machine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

log = logging.getLogger(__name__)

DOMAIN = "cluster.local"
TTL_S = 5  # short: endpoints change as pods come and go, and nothing else caches here


def records(
    services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """Fully qualified name (with the trailing dot) -> sorted ready IPv4 addresses (pure)."""
    out: dict[str, set[str]] = {}
    for svc in services:
        meta = svc["metadata"]
        out.setdefault(f"{meta['name']}.{meta['namespace']}.svc.{DOMAIN}.", set())
    for eps in slices:
        meta = eps["metadata"]
        service = meta.get("labels", {}).get("kubernetes.io/service-name")
        if service is None or eps.get("addressType") != "IPv4":
            continue
        name = f"{service}.{meta['namespace']}.svc.{DOMAIN}."
        for endpoint in eps.get("endpoints") or []:
            if endpoint.get("conditions", {}).get("ready", True):
                out.setdefault(name, set()).update(endpoint.get("addresses", []))
    return {name: sorted(ips) for name, ips in out.items()}


def answer(query: dns.message.Message, table: Mapping[str, list[str]]) -> dns.message.Message:
    """The response to one query from ``table`` (pure)."""
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    for question in query.question:
        name = question.name.to_text().lower()
        if name not in table:
            response.set_rcode(dns.rcode.NXDOMAIN)
            continue
        if question.rdtype == dns.rdatatype.A and table[name]:
            response.answer.append(dns.rrset.from_text_list(question.name, TTL_S, "IN", "A", table[name]))
    return response


class Server(asyncio.DatagramProtocol):
    """UDP DNS server over a table the agent replaces as Services and endpoints change."""

    def __init__(self) -> None:
        self.table: dict[str, list[str]] = {}
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return  # not DNS: nothing to answer
        if self.transport is not None:
            self.transport.sendto(answer(query, self.table).to_wire(), addr)
