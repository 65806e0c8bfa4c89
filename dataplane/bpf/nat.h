/* Incremental one's-complement checksum updates (RFC 1624) for XDP, where the
 * skb checksum helpers are not available. All values stay in network order:
 * the one's-complement sum does not care about byte order as long as it is the
 * same for every term.
 */
#ifndef FABRIC_NAT_H
#define FABRIC_NAT_H

static __always_inline __u16 csum_fold32(__u32 sum)
{
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return (__u16)sum;
}

/* Combined updates: sum every field change into one delta, fold once per
 * checksum (RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m')). */
static __always_inline __u32 csum_delta32(__u32 delta, __be32 from, __be32 to)
{
    __u32 nfrom = ~from;
    return delta + (nfrom & 0xffff) + (nfrom >> 16) + (to & 0xffff) + (to >> 16);
}

static __always_inline __u32 csum_delta16(__u32 delta, __be16 from, __be16 to)
{
    return delta + (__u16)~from + to;
}

static __always_inline __u16 csum_apply(__u16 check, __u32 delta)
{
    return ~csum_fold32((__u16)~check + delta);
}

static __always_inline void l4_csum_apply(__u16 *check, __u8 proto, __u32 delta)
{
    if (proto == IPPROTO_UDP && *check == 0)
        return;
    __u16 c = csum_apply(*check, delta);
    *check = (proto == IPPROTO_UDP && c == 0) ? 0xffff : c;
}

/* DNAT: destination address and port, both checksums, one fold each. */
static __always_inline void dnat(struct iphdr *ip, __be16 *dport, __u16 *l4check, __u8 proto, __be32 daddr, __be16 port)
{
    __u32 delta = csum_delta32(0, ip->daddr, daddr);
    ip->daddr = daddr;
    ip->check = csum_apply(ip->check, delta);
    delta = csum_delta16(delta, *dport, port);
    *dport = port;
    l4_csum_apply(l4check, proto, delta);
}

/* DNAT plus SNAT (source address and port) in one pass. */
static __always_inline void dnat_snat(struct iphdr *ip, __be16 *sport, __be16 *dport, __u16 *l4check, __u8 proto,
                                      __be32 saddr, __be16 snat_port, __be32 daddr, __be16 port)
{
    __u32 delta = csum_delta32(0, ip->daddr, daddr);
    delta = csum_delta32(delta, ip->saddr, saddr);
    ip->daddr = daddr;
    ip->saddr = saddr;
    ip->check = csum_apply(ip->check, delta);
    delta = csum_delta16(delta, *dport, port);
    delta = csum_delta16(delta, *sport, snat_port);
    *dport = port;
    *sport = snat_port;
    l4_csum_apply(l4check, proto, delta);
}

#endif
