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

/* New flow: Maglev pick, then record the flow both ways. */
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
    out->backend_ip = b->ip;
    out->backend_port = b->port;
    out->snat_port = 0;

    struct flow_key reply = {};
    reply.src = b->ip;
    reply.sport = b->port;
    reply.proto = fk->proto;
    struct reverse_flow rev = {};
    rev.vip = fk->dst;
    rev.vport = fk->dport;
    rev.client = fk->src;
    rev.cport = fk->sport;
    if (b->flags & BACKEND_SNAT) {
        __u32 zero = 0;
        struct config *cfg = config.lookup(&zero);
        if (!cfg || !cfg->node_ip) {
            *verdict = VERDICT_DROP_SNAT_EXHAUSTED;
            return -1;
        }
        reply.dst = cfg->node_ip;
        out->snat_port = snat_port(&reply, hash);
        if (!out->snat_port) {
            *verdict = VERDICT_DROP_SNAT_EXHAUSTED;
            return -1;
        }
        rev.snat = 1;
    } else {
        reply.dst = fk->src;
        reply.dport = fk->sport;
    }
    reverse_flows.update(&reply, &rev);
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
    nat_addr(ip, check, 0, rev->client);
    nat_port(&ports->dest, check, ip->protocol, rev->cport);
    nat_addr(ip, check, 1, rev->vip);
    nat_port(&ports->source, check, ip->protocol, rev->vport);
    return 0;
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
    __u32 *is_vip = vips.lookup(&daddr);
    if (!is_vip) {
        /* maybe the reply of a source-NAT flow, addressed to node_ip */
        __u32 zero = 0;
        struct config *cfg = config.lookup(&zero);
        if (!cfg || !cfg->node_ip || daddr != cfg->node_ip || ip->ihl != 5 || is_fragment(ip))
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
    if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
        return count(VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
    /* Options shift the L4 header and fragments lack ports: neither can be
     * hashed consistently, so they never reach a backend. */
    if (ip->ihl != 5)
        return count(VERDICT_DROP_IP_OPTIONS, XDP_DROP);
    if (is_fragment(ip))
        return count(VERDICT_DROP_FRAGMENT, XDP_DROP);

    struct l4_ports *ports = (void *)(ip + 1);
    if ((void *)ports + l4_min_len(ip->protocol) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    __u16 *check = (void *)ports + (ip->protocol == IPPROTO_TCP ? offsetof(struct tcphdr, check)
                                                              : offsetof(struct udphdr, check));
    if ((void *)(check + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);

    struct service_key sk = {};
    sk.vip = daddr;
    sk.port = ports->dest;
    sk.proto = ip->protocol;
    struct service *svc = services.lookup(&sk);
    if (!svc)
        return count(VERDICT_DROP_UNKNOWN_PORT, XDP_DROP);

    struct flow_key fk = {};
    fk.src = ip->saddr;
    fk.dst = daddr;
    fk.sport = ports->source;
    fk.dport = ports->dest;
    fk.proto = ip->protocol;

    __u32 verdict = VERDICT_FWD_ESTABLISHED;
    struct flow chosen = {};
    struct flow *known = flows.lookup(&fk);
    if (known) {
        chosen = *known;
    } else if (new_flow(svc, &fk, &chosen, &verdict) < 0) {
        return count(verdict, XDP_DROP);
    }

    if (chosen.snat_port) {
        __u32 zero = 0;
        struct config *cfg = config.lookup(&zero);
        if (!cfg || !cfg->node_ip)
            return count(VERDICT_DROP_SNAT_EXHAUSTED, XDP_DROP);
        nat_addr(ip, check, 1, cfg->node_ip);
        nat_port(&ports->source, check, fk.proto, chosen.snat_port);
    }
    nat_addr(ip, check, 0, chosen.backend_ip);
    nat_port(&ports->dest, check, fk.proto, chosen.backend_port);
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

    struct flow_key key = {};
    key.src = ip->saddr;
    key.dst = ip->daddr;
    key.sport = ports->source;
    key.dport = ports->dest;
    key.proto = proto;
    struct reverse_flow *rev = reverse_flows.lookup(&key);
    if (!rev || rev->snat)
        return TC_ACT_OK;

    __be32 old_ip = key.src;
    __be32 new_ip = rev->vip;
    __be16 old_port = key.sport;
    __be16 new_port = rev->vport;
    int l4_csum = L4_OFF + (proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) : offsetof(struct udphdr, check));
    /* the skb helpers also handle CHECKSUM_PARTIAL packets from local senders */
    __u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
    bpf_l4_csum_replace(skb, l4_csum, old_ip, new_ip, BPF_F_PSEUDO_HDR | mangled | sizeof(new_ip));
    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip));
    bpf_skb_store_bytes(skb, IP_SRC_OFF, &new_ip, sizeof(new_ip), 0);
    bpf_l4_csum_replace(skb, l4_csum, old_port, new_port, mangled | sizeof(new_port));
    bpf_skb_store_bytes(skb, L4_OFF + offsetof(struct l4_ports, source), &new_port, sizeof(new_port), 0);
    return TC_ACT_OK;
}
