"""State-store backends of the controller, chosen by the ``--store`` URL."""

from __future__ import annotations

from ferrymq.controller.stores.base import ControllerStore


def store_from_url(url: str, identity: str, *, lease_seconds: int = 10) -> ControllerStore:
    """``file:///dir`` | ``etcd://host:port[,host:port...][/prefix]`` | ``kubernetes://namespace/name``."""
    scheme, sep, rest = url.partition("://")
    if not sep or not rest:
        raise ValueError(f"store URL {url!r} must look like file:///dir, etcd://host:port or kubernetes://ns/name")
    if scheme == "file":
        from ferrymq.controller.stores.file import FileStore

        return FileStore(rest, identity)
    if scheme == "etcd":
        from ferrymq.controller.stores.etcd import DEFAULT_PREFIX, EtcdStore

        hosts, slash, prefix = rest.partition("/")
        endpoints = [h.strip() for h in hosts.split(",") if h.strip()]
        if not endpoints:
            raise ValueError(f"store URL {url!r} names no etcd endpoint")
        return EtcdStore(endpoints, identity, prefix=f"/{prefix}" if slash and prefix else DEFAULT_PREFIX,
                         lease_ttl_s=lease_seconds)
    if scheme == "kubernetes":
        from ferrymq.controller.stores.kubernetes import KubernetesStore

        parts = rest.strip("/").split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"store URL {url!r} must be kubernetes://namespace/name")
        return KubernetesStore(parts[0], parts[1], identity, lease_duration_s=lease_seconds)
    raise ValueError(f"unknown store scheme {scheme!r} in {url!r}: use file, etcd or kubernetes")
