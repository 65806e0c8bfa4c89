/* ICMP for VIP flows (included by maglev.c after maps.h and nat.h).
 *
 * Echo requests to a VIP are answered (rewritten into the reply, routed back). ICMP errors (destination
 * unreachable, fragmentation needed, time exceeded) quote the offending
 * packet's IP header and first 8 L4 bytes; when that quoted packet belongs to a
 * VIP flow the error is translated so the host that sent the quoted packet
 * recognises it:
 *   to the VIP (about a packet the VIP sent a client)  -> its backend       (XDP)
 *   to node_ip (about a source-NATed packet to a backend) -> the client    (XDP)
 *   to a client (about a packet the client sent a backend) -> the VIP view (TC)
 * Every rewrite keeps every checksum right: outer IP, ICMP, quoted IP and the
 * quoted L4 checksum when the quote holds it (updated incrementally, so a
 * truncated quote does not matter).
 */
#ifndef FABRIC_ICMP_H
#define FABRIC_ICMP_H

#include <linux/icmp.h>

#define ICMP_QUOTE_MIN (sizeof(struct icmphdr) + sizeof(struct iphdr) + sizeof(struct l4_ports))

static __always_inline int icmp_is_error(__u8 type)
{
    return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED;
}

/* The quoted packet of an ICMP error: its IP header and ports, bounds checked.
 * 0 when usable (IPv4 without options, TCP or UDP). */
static __always_inline int icmp_quote(struct iphdr *ip, void *data_end, struct icmphdr **icmp,
                                      struct iphdr **inner, struct l4_ports **iports)
{
    if (ip->ihl != 5 || is_fragment(ip))
        return -1;
    struct icmphdr *ic = (void *)(ip + 1);
    if ((void *)ic + ICMP_QUOTE_MIN > data_end)
        return -1;
    if (!icmp_is_error(ic->type))
        return -1;
    struct iphdr *in = (void *)(ic + 1);
    if (in->ihl != 5 || (in->protocol != IPPROTO_TCP && in->protocol != IPPROTO_UDP))
        return -1;
    *icmp = ic;
    *inner = in;
    *iports = (void *)(in + 1);
    return 0;
}

/* Rewrite the quoted packet's addresses and ports (and the outer addresses),
 * fixing all checksums. Direct packet access: used from XDP and TC alike. */
static __always_inline void icmp_rewrite(struct iphdr *ip, struct icmphdr *icmp, struct iphdr *in,
                                         struct l4_ports *ports, void *data_end,
                                         __be32 osrc, __be32 odst,
                                         __be32 isrc, __be16 isport, __be32 idst, __be16 idport)
{
    /* quoted L4 checksum: pseudo header addresses and ports */
    __u32 icmp_delta = 0;
    int off = l4_csum_offset(in->protocol);
    __u16 *l4check = (void *)ports + (off < 0 ? 0 : off);
    if (off >= 0 && (void *)(l4check + 1) <= data_end) {
        __u32 d = csum_delta32(0, in->saddr, isrc);
        d = csum_delta32(d, in->daddr, idst);
        d = csum_delta16(d, ports->source, isport);
        d = csum_delta16(d, ports->dest, idport);
        __u16 before = *l4check;
        l4_csum_apply(l4check, in->protocol, d);
        icmp_delta = csum_delta16(icmp_delta, before, *l4check);
    }
    /* quoted IP header */
    __u32 d = csum_delta32(0, in->saddr, isrc);
    d = csum_delta32(d, in->daddr, idst);
    __u16 before = in->check;
    in->check = csum_apply(in->check, d);
    icmp_delta += d;
    icmp_delta = csum_delta16(icmp_delta, before, in->check);
    icmp_delta = csum_delta16(icmp_delta, ports->source, isport);
    icmp_delta = csum_delta16(icmp_delta, ports->dest, idport);
    in->saddr = isrc;
    in->daddr = idst;
    ports->source = isport;
    ports->dest = idport;
    icmp->checksum = csum_apply(icmp->checksum, icmp_delta);
    /* outer IP header (ICMP has no pseudo header) */
    __u32 od = csum_delta32(0, ip->saddr, osrc);
    od = csum_delta32(od, ip->daddr, odst);
    ip->saddr = osrc;
    ip->daddr = odst;
    ip->check = csum_apply(ip->check, od);
}

/* Echo request to a VIP: turn it into the reply, addressed VIP -> client, and
 * hand it to the kernel, which routes it back like any forwarded packet (TTL
 * decremented there). XDP_TX would skip the stack, but a veth only transmits
 * XDP_TX frames when its peer runs NAPI; routing works on every device. */
static __always_inline int icmp_echo_reply(struct ethhdr *eth, struct iphdr *ip, void *data_end)
{
    if (ip->ihl != 5 || is_fragment(ip))
        return -1;
    struct icmphdr *icmp = (void *)(ip + 1);
    if ((void *)(icmp + 1) > data_end || icmp->type != ICMP_ECHO || icmp->code != 0)
        return -1;
    __be32 vip = ip->daddr;
    ip->daddr = ip->saddr;
    ip->saddr = vip;  /* a swap: the IP checksum is unchanged */
    __u16 *type_code = (void *)icmp;
    __u16 old = *type_code;
    icmp->type = ICMP_ECHOREPLY;
    icmp->checksum = csum_apply(icmp->checksum, csum_delta16(0, old, *type_code));
    return 0;
}

#endif
