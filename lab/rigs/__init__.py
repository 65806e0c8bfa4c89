"""Rigs the lab, the scripts and the tests share: servers on loopback, etcd members, namespaces, fuzzers."""
