/* Leaving the node without the kernel stack: after a packet is translated (or
 * encapsulated), bpf_fib_lookup asks the kernel's routing and neighbour tables
 * for the egress device and MACs. When they resolve, XDP sends the frame by
 * bpf_redirect (XDP_TX when the egress is the ingress device) and TC by
 * bpf_redirect; everything the stack must do itself (neighbour resolution,
 * fragmentation or its ICMP error, TTL expiry, devices that cannot take XDP
 * frames) is left to the stack with XDP_PASS / TC_ACT_OK, as before.
 *
 * XDP can only transmit on a device that implements XDP transmit: a bridge
 * does not, so a route through a bridge is sent to the bridge port whose
 * forwarding-database entry holds the next hop's MAC (bridge_ports, written by
 * the agent from the bridge's FDB). A veth transmits XDP frames only when its
 * peer runs NAPI (an XDP program or GRO on the peer): the agent lists a device
 * in egress_devs (agent/dataplane/egress.py), so the lab turns GRO on for them.
 *
 * This header holds what needs no map; the functions that read maps (route,
 * xmit_xdp) live in maglev.c, because BCC rewrites map calls only in the main file.
 */
#ifndef FABRIC_XMIT_H
#define FABRIC_XMIT_H

#ifndef AF_INET
#define AF_INET 2
#endif

struct egress {
    __u32 ifindex;
    __u8 smac[ETH_ALEN];
    __u8 dmac[ETH_ALEN];
};

/* TTL - 1 with the header checksum updated, as the stack's forwarding does. */
static __always_inline void ttl_dec(struct iphdr *ip)
{
    __u32 check = ip->check;
    check += bpf_htons(0x0100);
    ip->check = (__u16)(check + (check >= 0xFFFF));
    ip->ttl -= 1;
}

#endif
