/* Fabric XDP Maglev load balancer.
 *
 * xdp_maglev (XDP, node ingress): IPv4 TCP/UDP to a VIP:port is DNATed to a
 * backend chosen by the connection table, else by the service's Maglev ring;
 * backends marked BACKEND_SNAT also get source NAT to node_ip. Replies of
 * source-NAT flows (addressed to node_ip:snat_port) are reverse-NATed here too,
 * before the stack would take them as local traffic. Everything else passes
 * untouched. After NAT the packet goes up with XDP_PASS so the kernel's routing
 * picks the egress device and MAC.
 *
 * tc_reverse_nat (TC clsact egress of the same device): replies from backends
 * reached without source NAT get their source put back to VIP:port.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>

#include "verdicts.h"
#include "parse.h"
#include "nat.h"
#include "maps.h"

/* Source ports for source-NAT flows: above Linux's default ephemeral range so
 * they do not collide with the node's own connections. */
#define SNAT_PORT_MIN 61000
#define SNAT_PORT_COUNT 4536
#define SNAT_TRIES 4

static __always_inline int count(__u32 verdict, int action)
{
    __u64 *n = verdict_stats.lookup(&verdict);
    if (n)
        *n += 1;
    return action;
}

static __always_inline __u32 flow_hash(struct flow_key *k)
{
    __u32 h = k->src * 0x9E3779B1u;
    h ^= k->dst;
    h *= 0x85EBCA6Bu;
    h ^= ((__u32)k->sport << 16) | k->dport;
    h *= 0xC2B2AE35u;
    h ^= k->proto;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    return h;
}

/* Pick a free node_ip source port for a new source-NAT flow, 0 if none. */
static __always_inline __be16 snat_port(struct flow_key *reply, __u32 hash)
{
    #pragma unroll
    for (int i = 0; i < SNAT_TRIES; i++) {
        __u16 port = SNAT_PORT_MIN + (hash + i * 7919u) % SNAT_PORT_COUNT;
        reply->dport = bpf_htons(port);
        if (!reverse_flows.lookup(reply))
            return reply->dport;
    }
    return 0;
}

static __always_inline void account(__u32 backend_id, __u64 bytes)
{
    struct backend_stats *s = backend_stats.lookup(&backend_id);
    if (s) {
        s->packets += 1;
        s->bytes += bytes;
    }
}

/* New flow: Maglev pick, then record it (and, for source NAT, the reverse
 * entry the reply is found by). Replies of flows without source NAT need no
 * reverse entry: tc_reverse_nat finds the forward entry through backend_addrs. */
static __always_inline int new_flow(struct service *svc, struct flow_key *fk, struct flow *out, __u32 *verdict)
{
    if (svc->flags & SERVICE_NO_BACKENDS) {
        *verdict = VERDICT_DROP_NO_BACKEND;
        return -1;
    }
    __u32 hash = flow_hash(fk);
    __u32 ring_id = svc->id * 2 + (svc->active & 1);
    struct ring *ring = rings.lookup(&ring_id);
    if (!ring) {
        *verdict = VERDICT_DROP_NO_BACKEND;
        return -1;
    }
    __u32 slot = hash % TABLE_SIZE;
    /* the verifier loses the modulo's bound; hide it from the compiler and check */
    asm volatile("" : "+r"(slot));
    if (slot >= TABLE_SIZE) {
        *verdict = VERDICT_DROP_NO_BACKEND;
        return -1;
    }
    __u32 backend_id = ring->backend[slot];
    struct backend *b = backends.lookup(&backend_id);
    if (!b || !(b->flags & BACKEND_IN_USE)) {
        *verdict = VERDICT_DROP_NO_BACKEND;
        return -1;
    }
    out->backend_id = backend_id;
    out->service_id = svc->id;
    out->backend_ip = b->ip;
    out->backend_port = b->port;
    out->snat_port = 0;

    if (b->flags & BACKEND_SNAT) {
        __u32 zero = 0;
        struct config *cfg = config.lookup(&zero);
        if (!cfg || !cfg->node_ip) {
            *verdict = VERDICT_DROP_SNAT_EXHAUSTED;
            return -1;
        }
        struct flow_key reply = {};
        reply.src = b->ip;
        reply.sport = b->port;
        reply.proto = fk->proto;
        reply.dst = cfg->node_ip;
        out->snat_port = snat_port(&reply, hash);
        if (!out->snat_port) {
            *verdict = VERDICT_DROP_SNAT_EXHAUSTED;
            return -1;
        }
        struct reverse_flow rev = {};
        rev.vip = fk->dst;
        rev.vport = fk->dport;
        rev.client = fk->src;
        rev.cport = fk->sport;
        rev.snat = 1;
        reverse_flows.update(&reply, &rev);
    }
    flows.update(fk, out);
    *verdict = VERDICT_FWD_NEW_FLOW;
    return 0;
}

/* Reply to node_ip:snat_port from a source-NAT backend: restore VIP -> client. */
static __always_inline int snat_reply(struct iphdr *ip, struct l4_ports *ports, __u16 *check)
{
    struct flow_key key = {};
    key.src = ip->saddr;
    key.dst = ip->daddr;
    key.sport = ports->source;
    key.dport = ports->dest;
    key.proto = ip->protocol;
    struct reverse_flow *rev = reverse_flows.lookup(&key);
    if (!rev || !rev->snat)
        return -1;
    dnat_snat(ip, &ports->source, &ports->dest, check, ip->protocol, rev->vip, rev->vport, rev->client, rev->cport);
    return 0;
}

/* A clear bit proves daddr is no VIP; a set bit may be a hash collision. */
static __always_inline int vip_filter_hit(__be32 daddr)
{
    __u32 zero = 0;
    struct vip_filter *f = vip_filter.lookup(&zero);
    if (!f)
        return 1;
    __u32 bit = ((__u32)daddr * VIP_FILTER_MULT) >> VIP_FILTER_SHIFT;
    return (f->words[bit >> 6] >> (bit & 63)) & 1;
}

/* IPv4 to an address that is no VIP: the reply of a source-NAT flow when
 * addressed to node_ip, else the node's own or routed traffic, untouched. */
static __always_inline int not_vip(struct iphdr *ip, void *data_end)
{
    __u32 zero = 0;
    struct config *cfg = config.lookup(&zero);
    if (!cfg || !cfg->node_ip || ip->daddr != cfg->node_ip || ip->ihl != 5 || is_fragment(ip))
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    struct l4_ports *ports = (void *)(ip + 1);
    int csum_off = l4_csum_offset(ip->protocol);
    if ((void *)ports + l4_min_len(ip->protocol) > data_end || csum_off < 0)
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    __u16 *check = (void *)ports + csum_off;
    if ((void *)(check + 1) > data_end)
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    if (snat_reply(ip, ports, check) < 0)
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    return count(VERDICT_REPLY_SNAT, XDP_PASS);
}

/* The destination passed the filter: a VIP gets `verdict`, a collision is not_vip. */
static __always_inline int vip_verdict(struct iphdr *ip, void *data_end, __u32 verdict, int action)
{
    __be32 daddr = ip->daddr;
    if (!vips.lookup(&daddr))
        return not_vip(ip, data_end);
    return count(verdict, action);
}

int xdp_maglev(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;

    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    if (eth->h_proto != bpf_htons(ETH_P_IP))
        return count(VERDICT_PASS_NOT_IPV4, XDP_PASS);
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);

    __be32 daddr = ip->daddr;
    if (!vip_filter_hit(daddr))
        return not_vip(ip, data_end);
    /* From here on the address may still be a filter collision: every exit
     * other than a connection-table or service hit confirms it in vips. */
    __u8 proto = ip->protocol;
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        return vip_verdict(ip, data_end, VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
    /* Options shift the L4 header and fragments lack ports: neither can be
     * hashed consistently, so they never reach a backend. */
    if (ip->ihl != 5)
        return vip_verdict(ip, data_end, VERDICT_DROP_IP_OPTIONS, XDP_DROP);
    if (is_fragment(ip))
        return vip_verdict(ip, data_end, VERDICT_DROP_FRAGMENT, XDP_DROP);

    struct l4_ports *ports = (void *)(ip + 1);
    if ((void *)ports + l4_min_len(proto) > data_end)
        return vip_verdict(ip, data_end, VERDICT_DROP_TRUNCATED, XDP_DROP);
    __u16 *check = (void *)ports + l4_csum_offset(proto);
    if ((void *)(check + 1) > data_end)
        return vip_verdict(ip, data_end, VERDICT_DROP_TRUNCATED, XDP_DROP);

    struct flow_key fk = {};
    fk.src = ip->saddr;
    fk.dst = daddr;
    fk.sport = ports->source;
    fk.dport = ports->dest;
    fk.proto = proto;

    struct service_key sk = {};
    sk.vip = daddr;
    sk.port = fk.dport;
    sk.proto = proto;

    __u32 verdict = VERDICT_FWD_ESTABLISHED;
    struct flow chosen;
    struct flow *known = flows.lookup(&fk);
    if (known) {
        /* established: the service must still exist (a deleted service stops
         * forwarding its flows); its slot says so without a hash lookup */
        __u32 sid = known->service_id;
        struct service_key *slot = service_slots.lookup(&sid);
        if (!slot || slot->vip != daddr || slot->port != fk.dport || slot->proto != proto ||
            slot->pad != SLOT_IN_USE) {
            struct service *svc = services.lookup(&sk);
            if (!svc)
                return vip_verdict(ip, data_end, VERDICT_DROP_UNKNOWN_PORT, XDP_DROP);
            known->service_id = svc->id;  /* re-created under another id: keep the flow */
        }
        chosen = *known;
    } else {
        struct service *svc = services.lookup(&sk);
        if (!svc)
            return vip_verdict(ip, data_end, VERDICT_DROP_UNKNOWN_PORT, XDP_DROP);
        if (new_flow(svc, &fk, &chosen, &verdict) < 0)
            return count(verdict, XDP_DROP);
    }

    if (chosen.snat_port) {
        __u32 zero = 0;
        struct config *cfg = config.lookup(&zero);
        if (!cfg || !cfg->node_ip)
            return count(VERDICT_DROP_SNAT_EXHAUSTED, XDP_DROP);
        dnat_snat(ip, &ports->source, &ports->dest, check, proto, cfg->node_ip, chosen.snat_port,
                  chosen.backend_ip, chosen.backend_port);
    } else {
        dnat(ip, &ports->dest, check, proto, chosen.backend_ip, chosen.backend_port);
    }
    account(chosen.backend_id, data_end - data);
    return count(verdict, XDP_PASS);
}

#define IP_OFF ETH_HLEN
#define IP_CSUM_OFF (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF (IP_OFF + offsetof(struct iphdr, saddr))
#define L4_OFF (IP_OFF + sizeof(struct iphdr))

int tc_reverse_nat(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end || ip->ihl != 5 || is_fragment(ip))
        return TC_ACT_OK;
    __u8 proto = ip->protocol;
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        return TC_ACT_OK;
    struct l4_ports *ports = (void *)(ip + 1);
    if ((void *)(ports + 1) > data_end)
        return TC_ACT_OK;

    /* A reply of a flow without source NAT: its source is a backend address;
     * backend_addrs names the services that address serves (or served), and the
     * flow table must hold client -> that VIP:port on exactly this backend. */
    struct backend_addr ba = {};
    ba.ip = ip->saddr;
    ba.port = ports->source;
    __u32 *mask = backend_addrs.lookup(&ba);
    if (!mask)
        return TC_ACT_OK;
    __u32 services_left = *mask;
    struct flow_key key = {};
    key.src = ip->daddr;
    key.sport = ports->dest;
    key.proto = proto;
    __be32 new_ip = 0;
    __be16 new_port = 0;
    for (__u32 sid = 0; sid < MAX_SERVICES && services_left; sid++, services_left >>= 1) {
        if (!(services_left & 1))
            continue;
        __u32 id = sid;
        struct service_key *slot = service_slots.lookup(&id);
        if (!slot || slot->pad != SLOT_IN_USE || slot->proto != proto)
            continue;
        key.dst = slot->vip;
        key.dport = slot->port;
        struct flow *f = flows.lookup(&key);
        if (f && !f->snat_port && f->backend_ip == ba.ip && f->backend_port == ba.port) {
            new_ip = slot->vip;
            new_port = slot->port;
            break;
        }
    }
    if (!new_ip)
        return TC_ACT_OK;

    __be32 old_ip = ba.ip;
    __be16 old_port = ba.port;
    int l4_csum = L4_OFF + l4_csum_offset(proto);
    /* the skb helpers also handle CHECKSUM_PARTIAL packets from local senders */
    __u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
    bpf_l4_csum_replace(skb, l4_csum, old_ip, new_ip, BPF_F_PSEUDO_HDR | mangled | sizeof(new_ip));
    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip));
    bpf_skb_store_bytes(skb, IP_SRC_OFF, &new_ip, sizeof(new_ip), 0);
    bpf_l4_csum_replace(skb, l4_csum, old_port, new_port, mangled | sizeof(new_port));
    bpf_skb_store_bytes(skb, L4_OFF + offsetof(struct l4_ports, source), &new_port, sizeof(new_port), 0);
    return TC_ACT_OK;
}
