/* dsr-ipip, backend side, where the kernel has no IPIP tunnel driver (the
 * lab's namespaces on a kernel built without CONFIG_NET_IPIP): XDP on the
 * backend's own interface strips the outer IPv4 header of IPIP packets
 * addressed to this backend, so the client's packet (to the VIP, which the
 * backend holds on loopback) goes up its stack as sent. A guest with the
 * ipip module uses tunl0 instead (agent/vm/cloud_init.py).
 * DECAP_ADDR (network order) is the backend's own address, from the loader.
 */
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>

int xdp_ipip_decap(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *outer = (void *)(eth + 1);
    if ((void *)(outer + 1) > data_end || outer->protocol != IPPROTO_IPIP || outer->ihl != 5 ||
        outer->daddr != DECAP_ADDR || (outer->frag_off & bpf_htons(0x3FFF)))
        return XDP_PASS;
    struct iphdr *inner = outer + 1;
    if ((void *)(inner + 1) > data_end || inner->version != 4)
        return XDP_PASS;
    /* the Ethernet header moves forward over the outer IP header */
    __u8 macs[2 * ETH_ALEN];
    __builtin_memcpy(macs, eth, sizeof(macs));
    if (bpf_xdp_adjust_head(ctx, (int)sizeof(struct iphdr)))
        return XDP_PASS;
    data = (void *)(long)ctx->data;
    data_end = (void *)(long)ctx->data_end;
    eth = data;
    if ((void *)(eth + 1) > data_end)
        return XDP_DROP;
    __builtin_memcpy(eth, macs, sizeof(macs));
    eth->h_proto = bpf_htons(ETH_P_IP);
    return XDP_PASS;
}
