/* Fabric XDP Maglev load balancer.
 *
 * xdp_maglev (XDP, node ingress): IPv4 TCP/UDP to a VIP:port is DNATed to a
 * backend chosen by the connection table, else by the service's Maglev ring;
 * backends marked BACKEND_SNAT also get source NAT to node_ip. Replies of
 * source-NAT flows (addressed to node_ip:snat_port) are reverse-NATed here too,
 * before the stack would take them as local traffic. ICMP echo to a VIP is
 * answered, ICMP errors about VIP flows are translated (icmp.h). Everything
 * else passes untouched. After NAT (or IPIP encapsulation for dsr-ipip
 * services), with xdp_forward on, bpf_fib_lookup picks the egress (its result
 * cached per CPU and per backend under the agent's fib generation) and the
 * packet leaves by bpf_redirect or XDP_TX with its MACs rewritten; what the
 * fib cannot resolve (no neighbour, over MTU, TTL 1) goes up with XDP_PASS.
 *
 * tc_reverse_nat (TC clsact egress of the same device): replies from backends
 * reached without source NAT get their source put back to VIP:port.
 *
 * Connection lifecycle (docs/dataplane.md):
 *   TCP SYN          picks from the current table, replaces any entry its tuple had
 *   RST / FIN miss   forwarded by the table, never recorded
 *   other miss       forwarded by the table, recorded under a per-CPU insert budget
 *   UDP              recorded; an entry silent for udp_flow_secs is picked again
 *   established      kept while its backend is in the service (draining included),
 *                    picked again once the backend left it
 * A flow has one entry, the forward one (client 5-tuple), which a reply of a
 * nat flow finds from its own addresses (reply_flow: the backend address's
 * services in backend_addrs, each one's VIP:port in service_slots): a new flow
 * costs one LRU insert, as in Katran, and a reply is translated only while the
 * flow's entry names its backend. A source-NAT flow also has a reverse entry
 * (reply 5-tuple: node_ip:snat_port) that holds all its reply needs and claims
 * the port, so losing either entry to LRU eviction costs at most a re-pick,
 * never a wrong translation. An established source-NAT packet checks its
 * reverse entry once per fib generation (and on FIN/RST), so an evicted one is
 * written again within a generation (about a second).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>

#include "verdicts.h"
#include "parse.h"
#include "nat.h"
#include "maps.h"
#include "icmp.h"
#include "xmit.h"

/* Source ports for source-NAT flows: above Linux's default ephemeral range so
 * they do not collide with the node's own connections. A flow's port is a pure
 * function of its 5-tuple and a probe number. */
#define SNAT_PORT_MIN 61000
#define SNAT_PORT_COUNT 4523  /* a prime (61000-65522): any step visits every port */
#define SNAT_TRIES 16
/* slots a pick walks past backends marked draining in a ring not switched yet: a
 * draining backend with half the slots holds a run of k with odds ~2^-k */
#define PICK_TRIES 16
#define NS_PER_SEC 1000000000ULL
#define NO_FIB_CACHE 0xFFFFFFFFu  /* xmit_xdp: a packet with no backend (source-NAT reply) */

/* How a packet that found no (usable) entry is handled. */
#define MISS_RECORD 0     /* SYN, UDP, re-pick of a known flow: always recorded */
#define MISS_BUDGET 1     /* other TCP: recorded while the CPU's insert budget lasts */
#define MISS_NO_RECORD 2  /* RST / FIN: never recorded */

static __always_inline int count(__u32 verdict, int action)
{
    __u64 *n = verdict_stats.lookup(&verdict);
    if (n)
        *n += 1;
    return action;
}

static __always_inline struct config *get_config(void)
{
    __u32 zero = 0;
    return config.lookup(&zero);
}

/* One 32-bit word into a murmur3 state: the rotations carry every input bit
 * into every output bit (a multiply alone only carries bits upward). */
static __always_inline __u32 hash_word(__u32 h, __u32 k)
{
    k *= 0xCC9E2D51u;
    k = (k << 15) | (k >> 17);
    k *= 0x1B873593u;
    h ^= k;
    h = (h << 13) | (h >> 19);
    return h * 5 + 0xE6546B64u;
}

/* murmur3_32 of the 5-tuple. It picks the Maglev slot and the source-NAT
 * probe sequence, so every bit of the tuple must reach every bit of the hash:
 * the hash before this one multiplied the words together without rotating, so
 * the high halves of the address and ports (the client's last two octets, the
 * source port) met in 16 bits of state, and a client population of 10.0.a.b
 * with 64 source ports each fell on 1 value in 64. Flows with one hash share
 * their 16 source-NAT probes: 17 of them to one backend ran out of ports at
 * any occupancy (test_snat_flows_sharing_the_old_hash_get_ports). */
static __always_inline __u32 flow_hash(struct flow_key *k)
{
    __u32 h = hash_word(0, k->src);
    h = hash_word(h, k->dst);
    h = hash_word(h, ((__u32)k->sport << 16) | k->dport);
    h ^= k->proto;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

static __always_inline void account(__u32 backend_id, __u64 bytes)
{
    struct backend_stats *s = backend_stats.lookup(&backend_id);
    if (s) {
        s->packets += 1;
        s->bytes += bytes;
    }
}

/* The 5-tuple a packet carries (key of `flows` for a forward packet, of
 * `reverse_flows` for a reply). */
static __always_inline void packet_key(struct flow_key *key, struct iphdr *ip, struct l4_ports *ports)
{
    key->src = ip->saddr;
    key->dst = ip->daddr;
    key->sport = ports->source;
    key->dport = ports->dest;
    key->proto = ip->protocol;
}

/* The 5-tuple of the packet answering a quoted one (an ICMP error quotes the
 * packet it is about; its flow is the other direction). */
static __always_inline void answer_key(struct flow_key *key, struct iphdr *in, struct l4_ports *iports)
{
    key->src = in->daddr;
    key->dst = in->saddr;
    key->sport = iports->dest;
    key->dport = iports->source;
    key->proto = in->protocol;
}

/* Whether a reverse entry is this source-NAT flow's. */
static __always_inline int rev_is_flow(struct reverse_flow *r, struct flow_key *fk)
{
    return r->snat && r->client == fk->src && r->cport == fk->sport && r->vip == fk->dst && r->vport == fk->dport;
}

static __always_inline void rev_of(struct reverse_flow *rev, struct flow_key *fk)
{
    rev->vip = fk->dst;
    rev->vport = fk->dport;
    rev->client = fk->src;
    rev->cport = fk->sport;
    rev->snat = 1;
}

/* The reply 5-tuple of a source-NAT flow (its reverse entry's key) but the
 * port, which the caller probes. */
static __always_inline void reply_key(struct flow_key *reply, struct flow_key *fk, struct flow *f, __be32 node_ip)
{
    reply->src = f->backend_ip;
    reply->sport = f->backend_port;
    reply->proto = fk->proto;
    reply->dst = node_ip;
}

/* The VIP:port a reply of a nat flow without source NAT (backend -> client)
 * leaves from: the service among its backend address's (backend_addrs) whose
 * flow from this client (`flows`, the forward entry) names this backend, in
 * *vip and *vport. -1 for anything else: no such flow (never recorded, evicted,
 * re-picked to another backend: the next forward packet records it again), a
 * source-NAT or dsr-ipip flow, or the backend's own traffic (a probe's answer). */
static __always_inline int reply_flow(struct flow_key *reply, __be32 *vip, __be16 *vport)
{
    struct backend_addr ba = {};
    ba.ip = reply->src;
    ba.port = reply->sport;
    __u32 *members = backend_addrs.lookup(&ba);
    if (!members)
        return -1;
    __u32 mask = *members;
    struct flow_key fk = {};
    fk.src = reply->dst;
    fk.sport = reply->dport;
    fk.proto = reply->proto;
#pragma clang loop unroll(disable)
    for (__u32 id = 0; id < MAX_SERVICES && mask; id++, mask >>= 1) {
        if (!(mask & 1))
            continue;
        __u32 sid = id;
        struct service_key *slot = service_slots.lookup(&sid);
        if (!slot || slot->pad != SLOT_IN_USE || slot->proto != reply->proto)
            continue;
        fk.dst = slot->vip;
        fk.dport = slot->port;
        struct flow *f = flows.lookup(&fk);
        if (f && f->backend_ip == reply->src && f->backend_port == reply->sport && !f->snat_port &&
            !(f->flags & FLOW_DSR)) {
            *vip = slot->vip;
            *vport = slot->port;
            return 0;
        }
    }
    return -1;
}

/* Probe i of a flow: double hashing, start and step both from the flow hash,
 * so two flows that meet on one port part again at the next probe. With one
 * step for every flow the probes were a linear probe on one cycle: a flow that
 * met a taken port ran along every flow queued there, and a backend half full
 * failed 1 claim in 250 instead of 1 in 40000. */
static __always_inline __be16 snat_probe(__u32 hash, __u32 i)
{
    __u32 step = 1 + (hash >> 16) % (SNAT_PORT_COUNT - 1);
    return bpf_htons(SNAT_PORT_MIN + (hash % SNAT_PORT_COUNT + i * step) % SNAT_PORT_COUNT);
}

/* The port of this flow's own surviving reverse entry on its probe sequence, or 0. */
static __always_inline __be16 snat_find(struct flow_key *fk, struct flow_key *reply, __u32 hash)
{
#pragma clang loop unroll(disable)
    for (__u32 i = 0; i < SNAT_TRIES; i++) {
        reply->dport = snat_probe(hash, i);
        struct reverse_flow *have = reverse_flows.lookup(reply);
        if (have && rev_is_flow(have, fk))
            return reply->dport;
    }
    return 0;
}

/* Claim the first free port of the probe sequence with BPF_NOEXIST (two CPUs
 * can never both take one), or 0 when every probe is taken. */
static __always_inline __be16 snat_claim(struct flow_key *fk, struct flow_key *reply, __u32 hash)
{
    struct reverse_flow rev = {};
    rev_of(&rev, fk);
#pragma clang loop unroll(disable)
    for (__u32 i = 0; i < SNAT_TRIES; i++) {
        reply->dport = snat_probe(hash, i);
        if (reverse_flows.insert(reply, &rev) == 0)
            return reply->dport;
        struct reverse_flow *have = reverse_flows.lookup(reply);
        if (have && rev_is_flow(have, fk))  /* claimed by this flow on another CPU */
            return reply->dport;
    }
    return 0;
}

/* -- leaving the node (xmit.h) -- */

static __always_inline void xmit_count(__u32 code)
{
    __u64 *n = xmit_stats.lookup(&code);
    if (n)
        *n += 1;
}

static __always_inline int xdp_forwarding(struct config *cfg)
{
    return cfg && (cfg->flags & CONFIG_XDP_FORWARD);
}

/* Where a packet from src to dst leaves: XMIT_REDIRECT with *out filled, or
 * the XMIT_* reason it stays with the stack. `xdp`: the egress must take XDP
 * frames (TC can redirect to any device, bridges included). tot_len: the L3
 * length to check against the egress MTU (0: the skb's own, GSO aware). */
static __always_inline __u32 route(void *ctx, __u8 ttl, __u8 tos, __u8 proto, __be32 src, __be32 dst,
                                   __u16 tot_len, __u32 in_ifindex, int xdp, struct egress *out)
{
    if (ttl <= 1)
        return XMIT_TTL;
    struct bpf_fib_lookup fib = {};
    fib.family = AF_INET;
    fib.tos = tos;
    fib.l4_protocol = proto;
    fib.tot_len = tot_len;
    fib.ipv4_src = src;
    fib.ipv4_dst = dst;
    fib.ifindex = in_ifindex;
    long rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
    if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
        return XMIT_NO_NEIGH;
    if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
        return XMIT_FRAG_NEEDED;
    if (rc != BPF_FIB_LKUP_RET_SUCCESS)
        return XMIT_NO_ROUTE;
    __u32 oif = fib.ifindex;
    if (xdp) {
        __u32 *kind = egress_devs.lookup(&oif);
        if (!kind)
            return XMIT_UNKNOWN_DEV;
        if (*kind == EGRESS_BRIDGE) {
            struct port_key pk = {};
            pk.bridge = oif;
            __builtin_memcpy(pk.mac, fib.dmac, ETH_ALEN);
            __u32 *port = bridge_ports.lookup(&pk);
            if (!port)
                return XMIT_UNKNOWN_DEV;
            oif = *port;
        } else if (*kind != EGRESS_DIRECT) {
            return XMIT_UNKNOWN_DEV;
        }
    }
    out->ifindex = oif;
    __builtin_memcpy(out->smac, fib.smac, ETH_ALEN);
    __builtin_memcpy(out->dmac, fib.dmac, ETH_ALEN);
    return XMIT_REDIRECT;
}

/* The cached forwarding decision for `cache_id` (a backend id; NO_FIB_CACHE:
 * none), when it still holds for this packet. */
static __always_inline struct fib_entry *fib_cached(__u32 cache_id, __u32 gen, __be32 dst, __u16 len,
                                                    __u32 in_ifindex)
{
    if (cache_id >= MAX_BACKENDS || !gen)
        return 0;
    struct fib_entry *c = fib_cache.lookup(&cache_id);
    if (c && c->gen == gen && c->dst == dst && c->in_ifindex == in_ifindex && len <= c->max_len)
        return c;
    return 0;
}

static __always_inline __u32 fib_gen_now(void)
{
    __u32 zero = 0;
    __u32 *g = fib_gen.lookup(&zero);
    return g ? *g : 0;
}

static __always_inline void fib_remember(__u32 cache_id, __u32 gen, __be32 dst, __u16 len, __u32 in_ifindex,
                                         struct egress *e)
{
    if (cache_id >= MAX_BACKENDS || !gen)
        return;
    struct fib_entry *c = fib_cache.lookup(&cache_id);
    if (!c)
        return;
    /* a miss with everything else equal means len > max_len: the fib accepted a longer packet */
    c->gen = gen;
    c->dst = dst;
    c->in_ifindex = in_ifindex;
    c->oif = e->ifindex;
    c->max_len = len;
    __builtin_memcpy(c->smac, e->smac, ETH_ALEN);
    __builtin_memcpy(c->dmac, e->dmac, ETH_ALEN);
}

/* The XDP action for a translated packet (eth/ip point into ctx's frame).
 * cache_id: the backend it goes to (its fib result is cached per CPU), or NO_FIB_CACHE;
 * gen: fib_gen_now(), read once per packet. */
static __always_inline int xmit_xdp(struct xdp_md *ctx, struct ethhdr *eth, struct iphdr *ip, struct config *cfg,
                                    __u32 cache_id, __u32 gen)
{
    if (!xdp_forwarding(cfg)) {
        xmit_count(XMIT_STACK);
        return XDP_PASS;
    }
    if (ip->ttl <= 1) {
        xmit_count(XMIT_TTL);
        return XDP_PASS;
    }
    __u16 len = bpf_ntohs(ip->tot_len);
    __u32 in_ifindex = ctx->ingress_ifindex;
    __u32 oif;
    struct fib_entry *c = fib_cached(cache_id, gen, ip->daddr, len, in_ifindex);
    if (c) {
        oif = c->oif;
        __builtin_memcpy(eth->h_dest, c->dmac, ETH_ALEN);
        __builtin_memcpy(eth->h_source, c->smac, ETH_ALEN);
        xmit_count(XMIT_FIB_CACHED);
    } else {
        struct egress e = {};
        __u32 why = route(ctx, ip->ttl, ip->tos, ip->protocol, ip->saddr, ip->daddr, len, in_ifindex, 1, &e);
        if (why != XMIT_REDIRECT) {
            xmit_count(why);
            return XDP_PASS;
        }
        fib_remember(cache_id, gen, ip->daddr, len, in_ifindex, &e);
        oif = e.ifindex;
        __builtin_memcpy(eth->h_dest, e.dmac, ETH_ALEN);
        __builtin_memcpy(eth->h_source, e.smac, ETH_ALEN);
    }
    ttl_dec(ip);
    if (oif == in_ifindex) {
        xmit_count(XMIT_TX);
        return XDP_TX;
    }
    xmit_count(XMIT_REDIRECT);
    return bpf_redirect(oif, 0);
}

/* Non-SYN packets may record a flow only within the CPU's budget per second. */
static __always_inline int take_insert_budget(struct config *cfg)
{
    __u32 zero = 0;
    struct insert_budget *b = insert_budget.lookup(&zero);
    if (!b)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    if (now - b->window_start >= NS_PER_SEC) {
        b->window_start = now;
        b->used = 0;
    }
    __u64 limit = cfg && cfg->miss_inserts ? cfg->miss_inserts : MISS_INSERTS_DEFAULT;
    if (b->used >= limit)
        return 0;
    b->used += 1;
    return 1;
}

/* Maglev pick from the service's active ring; a draining or freed backend met
 * there (the ring switch follows the backend writes) sends the pick on to the
 * next slot. 0 with *out filled, or -1. */
static __always_inline int pick(struct service *svc, __u32 hash, struct flow *out)
{
    if (svc->flags & SERVICE_NO_BACKENDS)
        return -1;
    __u32 ring_id = svc->id * 2 + (svc->active & 1);
    struct ring *ring = rings.lookup(&ring_id);
    if (!ring)
        return -1;
    __u32 slot = hash % TABLE_SIZE;
#pragma clang loop unroll(disable)
    for (int i = 0; i < PICK_TRIES; i++) {
        /* the verifier loses the modulo's bound; hide it from the compiler and check */
        asm volatile("" : "+r"(slot));
        if (slot >= TABLE_SIZE)
            return -1;
        __u32 backend_id = ring->backend[slot];
        struct backend *b = backends.lookup(&backend_id);
        if (b && (b->flags & BACKEND_IN_USE) && !(b->flags & BACKEND_DRAINING)) {
            out->backend_id = backend_id;
            out->service_id = svc->id;
            out->backend_ip = b->ip;
            out->backend_port = b->port;
            out->snat_port = (b->flags & BACKEND_SNAT) ? 1 : 0;  /* the port comes later */
            out->flags = (svc->flags & SERVICE_DSR) ? FLOW_DSR : 0;
            return 0;
        }
        slot = slot + 1 == TABLE_SIZE ? 0 : slot + 1;
    }
    return -1;
}

/* No usable entry: pick from the table and, by `mode`, record the flow (and a
 * source-NAT flow's reverse entry). Returns the verdict to count, with *out the flow to
 * forward by, or a DROP verdict. */
static __always_inline __u32 miss(struct service *svc, struct flow_key *fk, struct flow *out, int mode,
                                  struct config *cfg, __u32 verdict, __u32 gen, int syn)
{
    __u32 hash = flow_hash(fk);
    if (pick(svc, hash, out) < 0)
        return VERDICT_DROP_NO_BACKEND;
    if (fk->proto == IPPROTO_UDP)  /* only UDP flows expire; a TCP flow never reads its clock */
        out->last_seen = bpf_ktime_get_ns();
    out->rev_gen = gen;  /* every recorded source-NAT flow's reverse entry is found or written below */
    if (out->flags & FLOW_DSR) {
        /* replies bypass the node: no reverse entry, no source NAT */
        out->snat_port = 0;
        if (mode == MISS_NO_RECORD || (mode == MISS_BUDGET && !take_insert_budget(cfg)))
            return VERDICT_FWD_UNTRACKED;
        flows.update(fk, out);
        return verdict;
    }
    struct flow_key reply = {};
    if (out->snat_port) {
        if (!cfg || !cfg->node_ip)
            return VERDICT_DROP_SNAT_EXHAUSTED;
        out->snat_port = 0;
        reply_key(&reply, fk, out, cfg->node_ip);
        /* this flow's own surviving reverse entry: same port, so the backend
         * sees the same connection; recording it again needs no budget. A SYN
         * starts a new connection: it skips the search (up to SNAT_TRIES cold
         * lookups) and claims, which still takes its own entry where it meets one */
        out->snat_port = syn ? 0 : snat_find(fk, &reply, hash);
        if (out->snat_port) {
            if (mode != MISS_NO_RECORD)
                flows.update(fk, out);
            return mode == MISS_NO_RECORD ? VERDICT_FWD_UNTRACKED : verdict;
        }
        if (mode == MISS_NO_RECORD || (mode == MISS_BUDGET && !take_insert_budget(cfg)))
            return VERDICT_DROP_UNTRACKED_SNAT;  /* a reply could not be translated back */
        out->snat_port = snat_claim(fk, &reply, hash);
        if (!out->snat_port)
            return VERDICT_DROP_SNAT_EXHAUSTED;
        flows.update(fk, out);
        return verdict;
    }
    if (mode == MISS_NO_RECORD)
        return VERDICT_FWD_UNTRACKED;
    if (mode == MISS_BUDGET && !take_insert_budget(cfg))
        return VERDICT_FWD_UNTRACKED;
    flows.update(fk, out);  /* its replies find it by their addresses (reply_flow) */
    return verdict;
}

/* Established source-NAT flow: make sure its reverse entry is still there and
 * its own (an evicted one is written again; a port that another flow took
 * meanwhile is given up for a fresh one). 0, or -1 when no port is left. */
static __always_inline int check_reverse(struct flow_key *fk, struct flow *f, struct config *cfg)
{
    struct flow_key reply = {};
    __be32 node_ip = cfg ? cfg->node_ip : 0;
    if (!node_ip)
        return -1;
    reply_key(&reply, fk, f, node_ip);
    reply.dport = f->snat_port;
    struct reverse_flow *have = reverse_flows.lookup(&reply);
    if (have && rev_is_flow(have, fk))
        return 0;
    struct reverse_flow rev = {};
    rev_of(&rev, fk);
    if (!have && reverse_flows.insert(&reply, &rev) == 0)
        return 0;
    __u32 hash = flow_hash(fk);
    __be16 port = snat_find(fk, &reply, hash);
    if (!port)
        port = snat_claim(fk, &reply, hash);
    if (!port)
        return -1;
    f->snat_port = port;
    return 0;
}

/* A source-NAT flow's check_reverse once per fib generation (gen, which the
 * agent bumps at least every second; 0: on every packet) and on every FIN/RST
 * (`always`, so a connection's close handshake never waits on the next
 * generation): within one generation the flow's reverse entry was found or
 * written already, and the flow's replies keep it recently used in the LRU. An
 * entry evicted meanwhile is written again by the first forward packet of the
 * next generation. Other flows have no reverse entry. */
static __always_inline int keep_reverse(struct flow_key *fk, struct flow *f, struct config *cfg, __u32 gen,
                                        int always)
{
    if (!f->snat_port)
        return 0;
    if (gen && !always && f->rev_gen == (__u16)gen)
        return 0;
    if (check_reverse(fk, f, cfg) < 0)
        return -1;
    f->rev_gen = gen;
    return 0;
}

/* Whether an established flow's backend still belongs to its service. */
static __always_inline int backend_member(struct flow *f)
{
    __u32 id = f->backend_id;
    struct backend *b = backends.lookup(&id);
    if (b && (b->flags & BACKEND_IN_USE) && b->ip == f->backend_ip && b->port == f->backend_port &&
        b->service == f->service_id)
        return 1;
    /* the id changed hands (service re-created): ask by address */
    struct backend_addr ba = {};
    ba.ip = f->backend_ip;
    ba.port = f->backend_port;
    __u32 *mask = backend_addrs.lookup(&ba);
    return mask && f->service_id < 32 && ((*mask >> f->service_id) & 1);
}

/* Reply to node_ip:snat_port from a source-NAT backend: restore VIP -> client. */
static __always_inline int snat_reply(struct iphdr *ip, struct l4_ports *ports, __u16 *check)
{
    struct flow_key key = {};
    packet_key(&key, ip, ports);
    struct reverse_flow *rev = reverse_flows.lookup(&key);
    if (!rev || !rev->snat)
        return -1;
    dnat_snat(ip, &ports->source, &ports->dest, check, ip->protocol, rev->vip, rev->vport, rev->client, rev->cport);
    return 0;
}

/* ICMP error from a source-NAT backend about a packet the node sent it. */
static __always_inline int snat_icmp_error(struct iphdr *ip, void *data_end)
{
    struct icmphdr *icmp;
    struct iphdr *in;
    struct l4_ports *iports;
    if (icmp_quote(ip, data_end, &icmp, &in, &iports) < 0)
        return -1;
    struct flow_key key = {};
    answer_key(&key, in, iports);
    struct reverse_flow *rev = reverse_flows.lookup(&key);
    if (!rev || !rev->snat)
        return -1;
    __be32 osrc = ip->saddr == in->daddr ? rev->vip : ip->saddr;
    icmp_rewrite(ip, icmp, in, iports, data_end, osrc, rev->client, rev->client, rev->cport, rev->vip, rev->vport);
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
static __always_inline int not_vip(struct xdp_md *ctx, struct ethhdr *eth, struct iphdr *ip, void *data_end,
                                   struct config *cfg)
{
    if (!cfg || !cfg->node_ip || ip->daddr != cfg->node_ip || ip->ihl != 5 || is_fragment(ip))
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
    if (ip->protocol == IPPROTO_ICMP) {
        if (snat_icmp_error(ip, data_end) < 0)
            return count(VERDICT_PASS_NOT_VIP, XDP_PASS);
        return count(VERDICT_REPLY_ICMP_ERROR, XDP_PASS);
    }
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
    return count(VERDICT_REPLY_SNAT, xmit_xdp(ctx, eth, ip, cfg, NO_FIB_CACHE, fib_gen_now()));
}

/* The destination passed the filter: a VIP gets `verdict`, a collision is not_vip. */
static __always_inline int vip_verdict(struct xdp_md *ctx, struct ethhdr *eth, struct iphdr *ip, void *data_end,
                                       __u32 verdict, int action)
{
    __be32 daddr = ip->daddr;
    if (!vips.lookup(&daddr))
        return not_vip(ctx, eth, ip, data_end, get_config());
    return count(verdict, action);
}

/* ICMP to a VIP: echo answered; an error about a VIP flow goes to its backend. */
static __always_inline int icmp_to_vip(struct xdp_md *ctx, struct ethhdr *eth, struct iphdr *ip, void *data_end)
{
    __be32 daddr = ip->daddr;
    if (!vips.lookup(&daddr))
        return not_vip(ctx, eth, ip, data_end, get_config());
    if (icmp_echo_reply(eth, ip, data_end) == 0)
        return count(VERDICT_REPLY_ICMP_ECHO, XDP_PASS);
    struct icmphdr *icmp;
    struct iphdr *in;
    struct l4_ports *iports;
    if (icmp_quote(ip, data_end, &icmp, &in, &iports) < 0 || in->saddr != daddr)
        return count(VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
    /* the quoted packet went VIP -> client: its flow is client -> VIP */
    struct flow_key fk = {};
    answer_key(&fk, in, iports);
    struct flow *f = flows.lookup(&fk);
    if (!f)
        return count(VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
    __be32 idst = fk.src;
    __be16 idport = fk.sport;
    if (f->snat_port) {
        struct config *cfg = get_config();
        if (!cfg || !cfg->node_ip)
            return count(VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
        idst = cfg->node_ip;
        idport = f->snat_port;
    }
    icmp_rewrite(ip, icmp, in, iports, data_end, ip->saddr, f->backend_ip, f->backend_ip, f->backend_port, idst,
                 idport);
    return count(VERDICT_FWD_ICMP_ERROR, XDP_PASS);
}

/* dsr-ipip: the packet goes to the backend unchanged inside an outer IPv4
 * header (protocol 4). The outer source is the client's address, so the
 * backend's reverse-path check and RSS see the client; the backend decapsulates
 * (tunl0), owns the VIP on loopback and answers the client directly. */
static __always_inline int dsr_out(struct xdp_md *ctx, struct flow *f, struct config *cfg, __u32 verdict, __u32 gen)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *inner = (void *)(eth + 1);
    if ((void *)(inner + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    __u8 macs[2 * ETH_ALEN];
    __builtin_memcpy(macs, eth, sizeof(macs));
    __be32 client = inner->saddr;
    __u8 tos = inner->tos;
    __u16 inner_len = bpf_ntohs(inner->tot_len);
    if (bpf_xdp_adjust_head(ctx, -(int)sizeof(struct iphdr)))
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    data = (void *)(long)ctx->data;
    data_end = (void *)(long)ctx->data_end;
    eth = data;
    struct iphdr *outer = (void *)(eth + 1);
    if ((void *)(outer + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    __builtin_memcpy(eth, macs, sizeof(macs));
    eth->h_proto = bpf_htons(ETH_P_IP);
    outer->version = 4;
    outer->ihl = 5;
    outer->tos = tos;
    outer->tot_len = bpf_htons(inner_len + sizeof(struct iphdr));
    outer->id = 0;
    outer->frag_off = 0;
    outer->ttl = 64;
    outer->protocol = IPPROTO_IPIP;
    outer->check = 0;
    outer->saddr = client;
    outer->daddr = f->backend_ip;
    __u16 *w = (void *)outer;
    __u32 sum = 0;
#pragma clang loop unroll(full)
    for (int i = 0; i < 10; i++)
        sum += w[i];
    outer->check = ~csum_fold32(sum);
    return count(verdict, xmit_xdp(ctx, eth, outer, cfg, f->backend_id, gen));
}

int xdp_maglev(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;

    /* The cheapest test first: IPv4 whose destination has a clear filter bit is
     * neither a VIP nor node_ip. Tested before anything else is parsed, while
     * only the packet bounds are live, so the compiler spills nothing on the
     * path most of a node's traffic takes (8.9 ns against 10.5 with the checks
     * below first; bare XDP_PASS 7.5). Everything else takes the checks below. */
    if (data + ETH_HLEN + sizeof(struct iphdr) <= data_end &&
        *(__be16 *)(data + offsetof(struct ethhdr, h_proto)) == bpf_htons(ETH_P_IP) &&
        !vip_filter_hit(*(__be32 *)(data + ETH_HLEN + offsetof(struct iphdr, daddr))))
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);

    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    if (eth->h_proto != bpf_htons(ETH_P_IP))
        return count(VERDICT_PASS_NOT_IPV4, XDP_PASS);
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end)
        return count(VERDICT_DROP_TRUNCATED, XDP_DROP);
    /* IPv4 whose destination's filter bit is set: a VIP, node_ip, or a collision */
    __be32 daddr = ip->daddr;
    struct config *cfg = get_config();
    if (cfg && cfg->node_ip && daddr == cfg->node_ip)  /* never a VIP (put_service refuses it) */
        return not_vip(ctx, eth, ip, data_end, cfg);
    /* From here on the address may still be a filter collision: every exit
     * other than a connection-table or service hit confirms it in vips. */
    __u8 proto = ip->protocol;
    if (proto == IPPROTO_ICMP)
        return icmp_to_vip(ctx, eth, ip, data_end);
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        return vip_verdict(ctx, eth, ip, data_end, VERDICT_PASS_NOT_TCP_UDP, XDP_PASS);
    /* Options shift the L4 header and fragments lack ports: neither can be
     * hashed consistently, so they never reach a backend. */
    if (ip->ihl != 5)
        return vip_verdict(ctx, eth, ip, data_end, VERDICT_DROP_IP_OPTIONS, XDP_DROP);
    if (is_fragment(ip))
        return vip_verdict(ctx, eth, ip, data_end, VERDICT_DROP_FRAGMENT, XDP_DROP);

    struct l4_ports *ports = (void *)(ip + 1);
    if ((void *)ports + l4_min_len(proto) > data_end)
        return vip_verdict(ctx, eth, ip, data_end, VERDICT_DROP_TRUNCATED, XDP_DROP);
    __u16 *check = (void *)ports + l4_csum_offset(proto);
    if ((void *)(check + 1) > data_end)
        return vip_verdict(ctx, eth, ip, data_end, VERDICT_DROP_TRUNCATED, XDP_DROP);

    struct flow_key fk = {};
    packet_key(&fk, ip, ports);

    int syn = 0, closing = 0;
    if (proto == IPPROTO_TCP) {
        struct tcphdr *tcp = (void *)ports;  /* l4_min_len checked the whole header */
        syn = tcp->syn && !tcp->ack;
        closing = tcp->rst || tcp->fin;
    }

    struct service *svc = 0;
    __u32 gen = fib_gen_now();
    __u32 verdict = VERDICT_FWD_ESTABLISHED;
    int mode = proto == IPPROTO_UDP ? MISS_RECORD : closing ? MISS_NO_RECORD : MISS_BUDGET;
    struct flow chosen = {};
    /* a SYN always picks from the current table: an entry its tuple had is stale */
    struct flow *known = syn ? 0 : flows.lookup(&fk);
    if (known) {
        /* established: the service must still exist (a deleted service stops
         * forwarding its flows); its slot says so without a hash lookup */
        __u32 sid = known->service_id;
        struct service_key *slot = service_slots.lookup(&sid);
        if (!slot || slot->vip != daddr || slot->port != fk.dport || slot->proto != proto ||
            slot->pad != SLOT_IN_USE) {
            struct service_key sk = {};
            sk.vip = daddr;
            sk.port = fk.dport;
            sk.proto = proto;
            svc = services.lookup(&sk);
            if (!svc)
                return vip_verdict(ctx, eth, ip, data_end, VERDICT_PASS_UNKNOWN_PORT, XDP_PASS);
            known->service_id = svc->id;  /* re-created under another id: keep the flow */
        }
        int expired = 0;
        if (proto == IPPROTO_UDP) {  /* only UDP reads the clock: TCP flows end by FIN/RST or eviction */
            __u64 now = bpf_ktime_get_ns();
            __u64 udp_ns = (cfg && cfg->udp_flow_secs ? cfg->udp_flow_secs : UDP_FLOW_SECS_DEFAULT) * NS_PER_SEC;
            expired = now - known->last_seen > udp_ns;
            known->last_seen = now;
        }
        if (expired || !backend_member(known)) {
            known = 0;  /* its backend left the service, or the UDP flow went silent: pick again */
            verdict = VERDICT_FWD_REPICKED;
            if (mode == MISS_BUDGET)
                mode = MISS_RECORD;  /* a known flow, not a flood */
        } else {
            if (closing)
                known->flags |= FLOW_CLOSED;
            if (keep_reverse(&fk, known, cfg, gen, closing) < 0)
                return count(VERDICT_DROP_SNAT_EXHAUSTED, XDP_DROP);
            chosen = *known;
        }
    }
    if (!known) {
        if (!svc) {
            struct service_key sk = {};
            sk.vip = daddr;
            sk.port = fk.dport;
            sk.proto = proto;
            svc = services.lookup(&sk);
        }
        if (!svc)
            return vip_verdict(ctx, eth, ip, data_end, VERDICT_PASS_UNKNOWN_PORT, XDP_PASS);
        __u32 sid = svc->id;
        struct flow_misses *m = flow_misses.lookup(&sid);
        if (m) {
            if (syn)
                m->syn += 1;
            else
                m->other += 1;
        }
        if (verdict != VERDICT_FWD_REPICKED)
            verdict = syn || proto == IPPROTO_UDP ? VERDICT_FWD_NEW_FLOW : VERDICT_FWD_MISS_RECORDED;
        if (syn)
            mode = MISS_RECORD;
        verdict = miss(svc, &fk, &chosen, mode, cfg, verdict, gen, syn);
        if (verdict == VERDICT_DROP_NO_BACKEND || verdict == VERDICT_DROP_SNAT_EXHAUSTED ||
            verdict == VERDICT_DROP_UNTRACKED_SNAT)
            return count(verdict, XDP_DROP);
    }

    account(chosen.backend_id, data_end - data);
    if (chosen.flags & FLOW_DSR)
        return dsr_out(ctx, &chosen, cfg, verdict, gen);
    if (chosen.snat_port) {
        if (!cfg || !cfg->node_ip)
            return count(VERDICT_DROP_SNAT_EXHAUSTED, XDP_DROP);
        dnat_snat(ip, &ports->source, &ports->dest, check, proto, cfg->node_ip, chosen.snat_port,
                  chosen.backend_ip, chosen.backend_port);
    } else {
        dnat(ip, &ports->dest, check, proto, chosen.backend_ip, chosen.backend_port);
    }
    return count(verdict, xmit_xdp(ctx, eth, ip, cfg, chosen.backend_id, gen));
}

#define IP_OFF ETH_HLEN
#define IP_CSUM_OFF (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF (IP_OFF + offsetof(struct iphdr, saddr))
#define L4_OFF (IP_OFF + sizeof(struct iphdr))

/* Put a reply's source back to VIP:port (skb helpers: they also handle
 * CHECKSUM_PARTIAL packets from local senders). Packet pointers are stale after. */
static __always_inline void restore_vip(struct __sk_buff *skb, __u8 proto, __be32 old_ip, __be16 old_port,
                                        __be32 new_ip, __be16 new_port)
{
    int l4_csum = L4_OFF + l4_csum_offset(proto);
    __u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
    bpf_l4_csum_replace(skb, l4_csum, old_ip, new_ip, BPF_F_PSEUDO_HDR | mangled | sizeof(new_ip));
    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip));
    bpf_skb_store_bytes(skb, IP_SRC_OFF, &new_ip, sizeof(new_ip), 0);
    bpf_l4_csum_replace(skb, l4_csum, old_port, new_port, mangled | sizeof(new_port));
    bpf_skb_store_bytes(skb, L4_OFF + offsetof(struct l4_ports, source), &new_port, sizeof(new_port), 0);
}

/* An ICMP error leaving for a client about a packet that client sent to a
 * backend (path MTU, unreachable): quote and source become the VIP's. */
static __always_inline int tc_icmp_error(struct __sk_buff *skb)
{
    if (bpf_skb_pull_data(skb, ETH_HLEN + sizeof(struct iphdr) + ICMP_QUOTE_MIN + 20) < 0)
        bpf_skb_pull_data(skb, ETH_HLEN + sizeof(struct iphdr) + ICMP_QUOTE_MIN);
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return TC_ACT_OK;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end)
        return TC_ACT_OK;
    struct icmphdr *icmp;
    struct iphdr *in;
    struct l4_ports *iports;
    if (icmp_quote(ip, data_end, &icmp, &in, &iports) < 0)
        return TC_ACT_OK;
    struct flow_key key = {};
    answer_key(&key, in, iports);
    __be32 vip;
    __be16 vport;
    if (reply_flow(&key, &vip, &vport) < 0)
        return TC_ACT_OK;
    __be32 osrc = ip->saddr == in->daddr ? vip : ip->saddr;
    icmp_rewrite(ip, icmp, in, iports, data_end, osrc, ip->daddr, in->saddr, iports->source, vip, vport);
    return count(VERDICT_REPLY_ICMP_ERROR, TC_ACT_OK);
}

/* The IPv4 header of a TC packet that may be a reply (no options, no fragment), or 0. */
static __always_inline struct iphdr *tc_ipv4(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return 0;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end || ip->ihl != 5 || is_fragment(ip))
        return 0;
    return ip;
}

/* A TCP/UDP reply of a nat flow without source NAT: 0 with its VIP:port
 * (reply_flow) in *vip and *vport and *ports set; or -1. */
static __always_inline int nat_reply(struct __sk_buff *skb, struct iphdr *ip, struct l4_ports **ports, __be32 *vip,
                                     __be16 *vport)
{
    void *data_end = (void *)(long)skb->data_end;
    if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
        return -1;
    struct l4_ports *p = (void *)(ip + 1);
    if ((void *)(p + 1) > data_end)
        return -1;
    *ports = p;
    struct flow_key key = {};
    packet_key(&key, ip, p);
    return reply_flow(&key, vip, vport);
}

int tc_reverse_nat(struct __sk_buff *skb)
{
    struct iphdr *ip = tc_ipv4(skb);
    if (!ip)
        return TC_ACT_OK;
    if (ip->protocol == IPPROTO_ICMP)
        return tc_icmp_error(skb);
    /* A VIP as the source: translated already (tc_reply_redirect on the bridge,
     * which redirected it out of this device), or a dsr-ipip backend's own reply;
     * no nat backend holds a VIP address. Two hot reads instead of a reverse-table
     * miss, which is cold for every reply of a short connection. */
    __be32 saddr = ip->saddr;
    if (vip_filter_hit(saddr) && vips.lookup(&saddr))
        return TC_ACT_OK;
    struct l4_ports *ports = 0;
    __be32 vip;
    __be16 vport;
    if (nat_reply(skb, ip, &ports, &vip, &vport) < 0 || !ports)
        return TC_ACT_OK;
    restore_vip(skb, ip->protocol, ip->saddr, ports->source, vip, vport);
    return count(VERDICT_TC_REPLY, TC_ACT_OK);
}

/* tc_reply_redirect (TC clsact ingress of the bridges local backends sit
 * behind): a reply of a flow without source NAT is translated here and sent
 * straight out of the client-facing device when the fib lookup resolves; else
 * it goes on untouched and tc_reverse_nat translates it on the way out. */
int tc_reply_redirect(struct __sk_buff *skb)
{
    struct config *cfg = get_config();
    if (!xdp_forwarding(cfg))
        return TC_ACT_OK;
    struct iphdr *ip = tc_ipv4(skb);
    if (!ip)
        return TC_ACT_OK;
    struct l4_ports *ports = 0;
    __be32 vip;
    __be16 vport;
    if (nat_reply(skb, ip, &ports, &vip, &vport) < 0 || !ports)
        return TC_ACT_OK;
    __u8 proto = ip->protocol;
    struct egress e = {};
    __u32 why = route(skb, ip->ttl, ip->tos, proto, vip, ip->daddr, 0, skb->ifindex, 0, &e);
    if (why != XMIT_REDIRECT) {
        xmit_count(why);
        return TC_ACT_OK;  /* untouched: the egress program translates it after the stack */
    }
    __be16 old_ttl_proto = *(__be16 *)&ip->ttl;
    __be16 new_ttl_proto = old_ttl_proto;
    ((__u8 *)&new_ttl_proto)[0] -= 1;
    restore_vip(skb, proto, ip->saddr, ports->source, vip, vport);
    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ttl_proto, new_ttl_proto, sizeof(new_ttl_proto));
    bpf_skb_store_bytes(skb, IP_OFF + offsetof(struct iphdr, ttl), &new_ttl_proto, sizeof(new_ttl_proto), 0);
    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), e.dmac, ETH_ALEN, 0);
    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), e.smac, ETH_ALEN, 0);
    xmit_count(XMIT_REDIRECT);
    count(VERDICT_TC_REPLY, 0);
    return bpf_redirect(e.ifindex, 0);
}
