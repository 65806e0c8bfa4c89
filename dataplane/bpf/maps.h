/* Every map of the dataplane, pinned under PIN_DIR so a restarted agent
 * re-opens the same maps and established flows keep forwarding.
 * PIN_DIR, TABLE_SIZE, MAX_SERVICES, MAX_BACKENDS, FLOW_ENTRIES and
 * LAYOUT_VERSION come from the loader (agent/dataplane/loader.py) as -D flags;
 * BCC turns the structs below into the ctypes Key/Leaf types
 * agent/dataplane/dataplane.py writes. BCC does not check a pinned map's type or
 * size, so the loader compares `meta` with its own layout before it loads.
 *
 * Fast-path budget (docs/dataplane.md): a non-VIP packet costs one array read
 * (vip_filter, which also holds node_ip's bit) and a counter; an established flow
 * one hash lookup (flows) plus array reads, its forwarding decision read from
 * fib_cache (a source-NAT flow, once per fib generation and on FIN/RST, a second
 * one: its reverse entry, which keeps its port claimed); a new flow inserts one
 * entry (a source-NAT flow two: forward and reverse); a nat flow's reply is
 * found by its addresses (backend_addrs, service_slots, then flows).
 */
#ifndef FABRIC_MAPS_H
#define FABRIC_MAPS_H

#include "verdicts.h"

#define PIN(name) PIN_DIR "/" #name

#if MAX_SERVICES > 32
#error "backend_addrs keeps service ids in a 32-bit mask"
#endif
#define BACKEND_ADDRS (MAX_BACKENDS * 2)
#define EGRESS_DEVS 1024
#define BRIDGE_PORTS 16384

/* The two flow tables keep one LRU list per CPU (BPF_F_NO_COMMON_LRU): an insert
 * or a hit touches only its own CPU's list and lock, so CPUs never contend on the
 * LRU, and a flood on one CPU's queue evicts only that CPU's flows. The kernel
 * splits a map's entries evenly over the possible CPUs, so the loader makes each
 * map FLOW_ENTRIES x CPUs (FLOW_MAP_ENTRIES): every CPU's list holds FLOW_ENTRIES,
 * and a flood on one CPU must exceed a whole FLOW_ENTRIES to evict an idle flow
 * there (docs/dataplane.md, per-CPU flow state). */
#ifndef FLOW_LRU_FLAGS
#define FLOW_LRU_FLAGS BPF_F_NO_COMMON_LRU
#endif
#ifndef FLOW_MAP_ENTRIES
#define FLOW_MAP_ENTRIES FLOW_ENTRIES
#endif

#define BACKEND_SNAT 1      /* reach this backend with source NAT to node_ip */
#define BACKEND_DRAINING 2  /* no new flows; established flows continue */
#define BACKEND_IN_USE 4    /* slot of the backends array is allocated */

#define SERVICE_NO_BACKENDS 1  /* every backend has weight 0 or drains */
#define SERVICE_DSR 2          /* forwarding: dsr-ipip (encapsulate to the backend, no DNAT, replies bypass us) */

struct service_key {
    __be32 vip;
    __be16 port;
    __u8 proto;
    __u8 pad;
};

/* service_slots value: the service_key of service id N with pad = 1 while the
 * service exists, all zero otherwise. */
#define SLOT_IN_USE 1

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

#define FLOW_CLOSED 1  /* the client sent FIN or RST: no longer counted as active */
#define FLOW_DSR 2     /* picked while its service was dsr-ipip: encapsulated, never translated */

struct flow {
    __be32 backend_ip;
    __be16 backend_port;
    __be16 snat_port;  /* 0 when the flow is not source-NATed */
    __u16 backend_id;  /* for backend_stats; backends[backend_id] must still be this address */
    __u16 service_id;  /* service_slots[service_id] says whether the service still exists */
    __u16 flags;       /* FLOW_* */
    __u16 rev_gen;     /* source NAT: low 16 bits of fib_gen when its reverse entry was last found or
                        * written: an established packet checks the reverse entry again only once the
                        * generation moved (the agent bumps it at least every second) */
    __u64 last_seen;   /* UDP: bpf_ktime_get_ns() of the last packet (expiry); TCP: 0 (never read) */
};

/* Reverse entry: keyed by the reply's 5-tuple (backend -> client, or backend ->
 * node_ip:snat_port), it holds everything the reply needs, so a reply is
 * translated even when the forward entry was evicted. It records the whole
 * forward flow (client, cport, vip, vport; proto from the key), so a surviving
 * entry is recognised as its own flow's and never handed to another flow. */
struct reverse_flow {
    __be32 vip;
    __be32 client;
    __be16 vport;
    __be16 cport;
    __u32 snat;        /* 1: the reply arrives at node_ip:snat_port (only source-NAT flows have one) */
};

/* Backend address as a reply carries it as source (TC reply path). */
struct backend_addr {
    __be32 ip;
    __be16 port;
    __u16 pad;
};

/* One bit per VIP address (and one for node_ip, whose source-NAT replies XDP
 * translates) hashed into VIP_FILTER_BITS: a clear bit proves "neither" with one
 * array read; a set bit is confirmed by the exact maps. */
#define VIP_FILTER_BITS 4096
#define VIP_FILTER_MULT 0x9E3779B1u
#define VIP_FILTER_SHIFT 20  /* 32 - log2(VIP_FILTER_BITS) */

struct vip_filter {
    __u64 words[VIP_FILTER_BITS / 64];
};

/* Written only by attach or an explicit setting (never by a mere opener). */
struct config {
    __be32 node_ip;          /* source address for source-NAT flows; 0 disables SNAT */
    __u32 table_size;        /* TABLE_SIZE the maps were made with (also in meta) */
    __u32 udp_flow_secs;     /* UDP entries silent this long are picked again; 0 = UDP_FLOW_SECS_DEFAULT */
    __u32 miss_inserts;      /* non-SYN misses recorded per CPU per second; 0 = MISS_INSERTS_DEFAULT */
    __u32 flags;             /* CONFIG_* */
};
#define CONFIG_XDP_FORWARD 1  /* translated packets leave by fib lookup + redirect, not through the stack */
#define UDP_FLOW_SECS_DEFAULT 30
#define MISS_INSERTS_DEFAULT 10000

/* meta: what layout made these pins; the loader refuses to reuse pins of another. */
struct meta {
    __u32 layout_version;
    __u32 table_size;
    __u32 flow_entries;
    __u32 max_services;
    __u32 max_backends;
};

/* Per-CPU insert budget for non-SYN misses (flood throttle). */
struct insert_budget {
    __u64 window_start;  /* ns */
    __u64 used;
};

/* Connection-table misses of one service: a SYN (or first UDP datagram) that
 * picked, and a non-SYN packet that found no entry (eviction, flood, restart). */
struct flow_misses {
    __u64 syn;
    __u64 other;
};

/* services: VIP:port/proto -> service id, active ring and flags */
BPF_TABLE_PINNED("hash", struct service_key, struct service, services, MAX_SERVICES, PIN(services));
/* vips: VIP address -> number of services on it (tells "unknown port" from "not a VIP") */
BPF_TABLE_PINNED("hash", __be32, __u32, vips, MAX_SERVICES, PIN(vips));
/* vip_filter: single entry, bitmap of hashed VIP addresses (cheap "not a VIP" test) */
BPF_TABLE_PINNED("array", __u32, struct vip_filter, vip_filter, 1, PIN(vip_filter));
/* service_slots: service id -> its service_key (pad = SLOT_IN_USE) while it exists */
BPF_TABLE_PINNED("array", __u32, struct service_key, service_slots, MAX_SERVICES, PIN(service_slots));
/* rings: service id * 2 + slot -> whole Maglev table; the inactive slot is rewritten, then switched */
BPF_TABLE_PINNED("array", __u32, struct ring, rings, MAX_SERVICES * 2, PIN(rings));
/* backends: backend id -> address, port, flags, weight, service */
BPF_TABLE_PINNED("array", __u32, struct backend, backends, MAX_BACKENDS, PIN(backends));
/* backend_stats: backend id -> packets and bytes forwarded, per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, struct backend_stats, backend_stats, MAX_BACKENDS, PIN(backend_stats));
/* verdict_stats: VERDICT_* -> packets, per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, __u64, verdict_stats, VERDICT_MAX, PIN(verdict_stats));
/* flows: client -> VIP 5-tuple -> chosen backend and service (LRU connection table) */
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct flow, flows, FLOW_MAP_ENTRIES, PIN(flows), FLOW_LRU_FLAGS);
/* backend_addrs: backend IP:port -> bitmask of the service ids it belongs to now, draining
 * included (an established flow whose backend id changed hands checks membership here, a nat
 * reply finds its flow's service here; MAX_SERVICES <= 32) */
BPF_TABLE_PINNED("hash", struct backend_addr, __u32, backend_addrs, BACKEND_ADDRS, PIN(backend_addrs));
/* reverse_flows: a source-NAT flow's reply 5-tuple (backend -> node_ip:snat_port) -> the flow to restore */
BPF_TABLE_PINNED("lru_hash", struct flow_key, struct reverse_flow, reverse_flows, FLOW_MAP_ENTRIES, PIN(reverse_flows),
                 FLOW_LRU_FLAGS);
/* config: single entry, node-wide settings (attach or an explicit setting writes it) */
BPF_TABLE_PINNED("array", __u32, struct config, config, 1, PIN(config));
/* meta: single entry, the layout these pins were made with (written once, at creation) */
BPF_TABLE_PINNED("array", __u32, struct meta, meta, 1, PIN(meta));
/* insert_budget: single entry per CPU, non-SYN misses recorded in the current second */
BPF_TABLE_PINNED("percpu_array", __u32, struct insert_budget, insert_budget, 1, PIN(insert_budget));
/* flow_misses: service id -> connection-table misses (SYN / other), per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, struct flow_misses, flow_misses, MAX_SERVICES, PIN(flow_misses));

/* egress_devs value: how a device the fib lookup names can take a packet from XDP. */
#define EGRESS_DIRECT 1  /* takes XDP frames itself (veth with NAPI on its peer, tap, NIC) */
#define EGRESS_BRIDGE 2  /* a bridge (no XDP transmit): redirect to the port that holds the MAC */

/* bridge_ports key: a MAC behind a bridge, as the bridge's forwarding database knows it. */
struct port_key {
    __u32 bridge;   /* ifindex of the bridge */
    __u8 mac[6];
    __u16 pad;
};

/* egress_devs: ifindex -> EGRESS_* for the devices of the node's namespace (the agent writes it) */
BPF_TABLE_PINNED("hash", __u32, __u32, egress_devs, EGRESS_DEVS, PIN(egress_devs));
/* bridge_ports: bridge ifindex + MAC -> ifindex of the bridge port behind which the MAC sits */
BPF_TABLE_PINNED("hash", struct port_key, __u32, bridge_ports, BRIDGE_PORTS, PIN(bridge_ports));
/* xmit_stats: XMIT_* -> packets, per CPU (how translated packets left the node) */
BPF_TABLE_PINNED("percpu_array", __u32, __u64, xmit_stats, XMIT_MAX, PIN(xmit_stats));

/* The forwarding decision for one backend, kept per CPU so an established
 * packet skips bpf_fib_lookup and the device / bridge-port lookups. Valid while
 * fib_gen still holds `gen` (the agent bumps it when routes, neighbours, links or
 * the bridge FDB change, and every FIB_CACHE_SECS), for the same destination and
 * ingress device, and for packets no longer than the longest the fib accepted
 * (its MTU check). TTL is checked per packet. */
struct fib_entry {
    __u32 gen;         /* fib_gen when filled; never matches while fib_gen is 0 */
    __be32 dst;        /* the address looked up (the backend; the outer destination for dsr-ipip) */
    __u32 in_ifindex;  /* ingress device of the lookup */
    __u32 oif;         /* where the frame goes (a bridge port for a route through a bridge) */
    __u16 max_len;     /* longest tot_len the fib accepted under this gen */
    __u8 smac[6];
    __u8 dmac[6];
    __u16 pad;
};

/* fib_cache: backend id -> its last resolved forwarding decision, per CPU */
BPF_TABLE_PINNED("percpu_array", __u32, struct fib_entry, fib_cache, MAX_BACKENDS, PIN(fib_cache));
/* fib_gen: single entry, the generation fib_cache entries must carry (0: cache off) */
BPF_TABLE_PINNED("array", __u32, __u32, fib_gen, 1, PIN(fib_gen));

#endif
