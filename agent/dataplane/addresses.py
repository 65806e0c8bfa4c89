"""Parsing operator input (VIP:PORT/PROTO, IP:PORT) and encoding it the way the
BPF maps store it (network byte order in memory, read by ctypes as little-endian
integers on this host)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from common.errors import InvalidInput

PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}


@dataclass(frozen=True, order=True)
class ServiceAddress:
    vip: str
    port: int
    proto: str

    def __str__(self) -> str:
        return f"{self.vip}:{self.port}/{self.proto}"


def parse_ipv4(text: str, what: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except (ipaddress.AddressValueError, ValueError):
        raise InvalidInput(f"{what} must be an IPv4 address, got {text!r}") from None


def check_port(port: object, what: str) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidInput(f"{what} must be a port 1-65535, got {port!r}")
    return port


def service_address(vip: str, port: int, proto: str) -> ServiceAddress:
    name = proto.lower() if isinstance(proto, str) else proto
    if name not in PROTOCOLS:
        raise InvalidInput(f"protocol must be tcp or udp, got {proto!r}")
    return ServiceAddress(parse_ipv4(vip, "VIP"), check_port(port, "VIP port"), name)


def parse_service_spec(text: str) -> ServiceAddress:
    """'VIP:PORT/PROTO' (proto defaults to tcp)."""
    addr, _, proto = text.partition("/")
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidInput(f"service must look like VIP:PORT/PROTO, got {text!r}")
    return service_address(host, int(port), proto or "tcp")


def parse_backend(text: str) -> tuple[str, int]:
    """'IP:PORT' -> (ip, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidInput(f"backend must look like IP:PORT, got {text!r}")
    return parse_ipv4(host, "backend address"), check_port(int(port), "backend port")


def ip_to_map(ip: str) -> int:
    return int.from_bytes(socket.inet_aton(ip), "little")


def ip_from_map(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "little"))


def port_to_map(port: int) -> int:
    return socket.htons(port)


def port_from_map(value: int) -> int:
    return socket.ntohs(value)
