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

static __always_inline __u16 csum_replace32(__u16 check, __be32 from, __be32 to)
{
    __u32 sum = (__u16)~check;
    __u32 nfrom = ~from;
    sum += (nfrom & 0xffff) + (nfrom >> 16);
    sum += (to & 0xffff) + (to >> 16);
    return ~csum_fold32(sum);
}

static __always_inline __u16 csum_replace16(__u16 check, __be16 from, __be16 to)
{
    __u32 sum = (__u16)~check;
    sum += (__u16)~from;
    sum += to;
    return ~csum_fold32(sum);
}

/* UDP's checksum 0 means "none"; keep it so, and never produce 0 from a real one. */
static __always_inline void l4_csum_replace32(__u16 *check, __u8 proto, __be32 from, __be32 to)
{
    if (proto == IPPROTO_UDP && *check == 0)
        return;
    __u16 c = csum_replace32(*check, from, to);
    *check = (proto == IPPROTO_UDP && c == 0) ? 0xffff : c;
}

static __always_inline void l4_csum_replace16(__u16 *check, __u8 proto, __be16 from, __be16 to)
{
    if (proto == IPPROTO_UDP && *check == 0)
        return;
    __u16 c = csum_replace16(*check, from, to);
    *check = (proto == IPPROTO_UDP && c == 0) ? 0xffff : c;
}

/* Rewrite the IPv4 source (or destination) address and fix both checksums. */
static __always_inline void nat_addr(struct iphdr *ip, __u16 *l4check, int source, __be32 to)
{
    __be32 from = source ? ip->saddr : ip->daddr;
    if (source)
        ip->saddr = to;
    else
        ip->daddr = to;
    ip->check = csum_replace32(ip->check, from, to);
    /* the pseudo-header covers both addresses */
    l4_csum_replace32(l4check, ip->protocol, from, to);
}

static __always_inline void nat_port(__be16 *port, __u16 *l4check, __u8 proto, __be16 to)
{
    __be16 from = *port;
    *port = to;
    l4_csum_replace16(l4check, proto, from, to);
}

#endif
