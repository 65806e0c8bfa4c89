/* Header parsing with every bound checked against data_end. */
#ifndef FABRIC_PARSE_H
#define FABRIC_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

/* Ports sit at the same offsets in TCP and UDP headers. */
struct l4_ports {
    __be16 source;
    __be16 dest;
};

static __always_inline int is_fragment(struct iphdr *ip)
{
    return (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
}

/* Offset of the L4 checksum from the start of the L4 header, or -1. */
static __always_inline int l4_csum_offset(__u8 proto)
{
    if (proto == IPPROTO_TCP)
        return offsetof(struct tcphdr, check);
    if (proto == IPPROTO_UDP)
        return offsetof(struct udphdr, check);
    return -1;
}

/* Bytes the L4 header must have before we touch it (checksum included). */
static __always_inline int l4_min_len(__u8 proto)
{
    return proto == IPPROTO_TCP ? sizeof(struct tcphdr) : sizeof(struct udphdr);
}

#endif
