/* Every map of the dataplane, pinned under PIN_DIR so a restarted agent
 * re-opens the same maps and established flows keep forwarding.
 * PIN_DIR, TABLE_SIZE, MAX_SERVICES, MAX_BACKENDS and FLOW_ENTRIES come from the
 * loader (agent/dataplane/loader.py) as -D flags; the structs below are mirrored
 * by ctypes structures in agent/dataplane/maps.py.
 */
#ifndef FABRIC_MAPS_H
#define FABRIC_MAPS_H

#include "verdicts.h"

#define PIN(name) PIN_DIR "/" #name

#define BACKEND_SNAT 1      /* reach this backend with source NAT to node_ip */
#define BACKEND_DRAINING 2  /* no new flows; established flows continue */
#define BACKEND_IN_USE 4    /* slot of the backends array is allocated */

#define SERVICE_NO_BACKENDS 1  /* every backend has weight 0 or drains */

struct service_key {
    __be32 vip;
    __be16 port;
    __u8 proto;
    __u8 pad;
};

struct service {
    __u32 id;      /* index of the service's two rings: id * 2 + active */
    __u32 active;  /* which of the two rings packets read (0 or 1) */
    __u32 flags;   /* SERVICE_* */
    __u32 pad;
};

struct ring {
    __u32 backend[TABLE_SIZE];  /* Maglev slot -> backend id */
};

struct backend {
    __be32 ip;
    __be16 port;
    __u8 flags;    /* BACKEND_* */
    __u8 weight;   /* 0-32, kept for the operator view and restarts */
    __u32 service; /* service id the backend belongs to */
};

struct backend_stats {
    __u64 packets;
    __u64 bytes;
};

/* A flow as the packet carries it: client -> VIP forwards, backend -> peer replies. */
struct flow_key {
    __be32 src;
    __be32 dst;
    __be16 sport;
    __be16 dport;
    __u8 proto;
    __u8 pad[3];
};

struct flow {
    __u32 backend_id;
    __be32 backend_ip;
    __be16 backend_port;
    __be16 snat_port;  /* 0 when the flow is not source-NATed */
};

struct reverse_flow {
    __be32 vip;
    __be32 client;
    __be16 vport;
    __be16 cport;
    __u32 snat;        /* 1 when the reply arrives at node_ip:snat_port */
};

struct config {
    __be32 node_ip;    /* source address for source-NAT flows; 0 disables SNAT */
    __u32 table_size;  /* TABLE_SIZE the maps were made with; a reload must match */
};

/* services: VIP:port/proto -> service id, active ring and flags */
BPF_TABLE_PINNED("hash", struct service_key, struct service, services, MAX_SERVICES, PIN(services));
/* vips: VIP address -> number of services on it (tells "unknown port" from "not a VIP") */
BPF_TABLE_PINNED("hash", __be32, __u32, vips, MAX_SERVICES, PIN(vips));
/* rings: service id * 2 + slot -> whole Maglev table; the inactive slot is rewritten, then switched */
BPF_TABLE_PINNED("array", __u32, struct ring, rings, MAX_SERVICES * 2, PIN(rings));
/* backends: backend id -> address, port, flags, weight, service */
BPF_TABLE_PINNED("array", __u32, struct backend, backends, MAX_BACKENDS, PIN(backends));
/* backend_stats: backend id -> packets and bytes forwarded, per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, struct backend_stats, backend_stats, MAX_BACKENDS, PIN(backend_stats));
/* verdict_stats: VERDICT_* -> packets, per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, __u64, verdict_stats, VERDICT_MAX, PIN(verdict_stats));
/* flows: client -> VIP 5-tuple -> chosen backend (LRU connection table) */
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct flow, flows, FLOW_ENTRIES, PIN(flows));
/* reverse_flows: backend -> client (or node_ip:snat_port) 5-tuple -> VIP and client to restore */
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct reverse_flow, reverse_flows, FLOW_ENTRIES, PIN(reverse_flows));
/* config: single entry, node-wide settings */
BPF_TABLE_PINNED("array", __u32, struct config, config, 1, PIN(config));

#endif
