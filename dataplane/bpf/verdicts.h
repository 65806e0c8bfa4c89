/* Verdict codes: why the dataplane passed, dropped or forwarded a packet.
 * One counter per code (verdict_stats). Mirrored by agent/dataplane/verdicts.py;
 * tests/dataplane/test_dataplane_verdicts.py parses this file and compares, so
 * keep one "#define VERDICT_<NAME> <number>" per line.
 */
#ifndef FABRIC_VERDICTS_H
#define FABRIC_VERDICTS_H

#define VERDICT_PASS_NOT_IPV4 0          /* ARP, IPv6, anything not IPv4: untouched */
#define VERDICT_PASS_NOT_VIP 1           /* IPv4 to an address that is no VIP */
#define VERDICT_PASS_NOT_TCP_UDP 2       /* protocols other than TCP/UDP/ICMP to a VIP, untouched */
#define VERDICT_DROP_TRUNCATED 3         /* Ethernet, IPv4 or L4 header cut short */
#define VERDICT_DROP_IP_OPTIONS 4        /* IPv4 header with options to a VIP */
#define VERDICT_DROP_FRAGMENT 5          /* IPv4 fragment to a VIP (no ports to hash) */
#define VERDICT_PASS_UNKNOWN_PORT 6      /* VIP address, but no service on this port/proto: to the stack */
#define VERDICT_DROP_NO_BACKEND 7        /* service has no backend with weight above 0 */
#define VERDICT_DROP_SNAT_EXHAUSTED 8    /* no free source port for a source-NAT flow */
#define VERDICT_FWD_NEW_FLOW 9           /* SYN (or first UDP datagram): Maglev pick, flow recorded */
#define VERDICT_FWD_ESTABLISHED 10       /* connection table hit */
#define VERDICT_REPLY_SNAT 11            /* reply of a source-NAT flow, reverse-NATed in XDP */
#define VERDICT_FWD_MISS_RECORDED 12     /* non-SYN miss: forwarded by the table, recorded (insert budget) */
#define VERDICT_FWD_UNTRACKED 13         /* RST/FIN miss, or non-SYN miss over the insert budget: forwarded, not recorded */
#define VERDICT_FWD_REPICKED 14          /* flow whose backend left the service (or expired UDP): picked again */
#define VERDICT_DROP_UNTRACKED_SNAT 15   /* unrecorded miss to a source-NAT backend: no port it could use */
#define VERDICT_TC_REPLY 16              /* TC: reply source restored to VIP:port from its reverse entry */
#define VERDICT_REPLY_ICMP_ECHO 17       /* ICMP echo request to a VIP turned into its reply (routed back) */
#define VERDICT_FWD_ICMP_ERROR 18        /* ICMP error about a VIP flow, sent on to its backend */
#define VERDICT_REPLY_ICMP_ERROR 19      /* ICMP error about a packet a client sent a backend, translated for the client */
#define VERDICT_MAX 20

/* How a translated packet left the node (xmit_stats, one counter per code;
 * mirrored by agent.dataplane.Xmit). XDP counts forward packets and source-NAT
 * replies, TC counts replies of local backends. */
#define XMIT_STACK 0          /* forwarding in BPF is off: handed to the kernel stack */
#define XMIT_REDIRECT 1       /* fib lookup resolved: sent out of another device (bpf_redirect) */
#define XMIT_TX 2             /* fib lookup resolved to the ingress device itself: XDP_TX */
#define XMIT_NO_ROUTE 3       /* no forwarding route (local, unreachable, forwarding disabled): stack */
#define XMIT_NO_NEIGH 4       /* route found, neighbour not resolved yet: the stack resolves it */
#define XMIT_FRAG_NEEDED 5    /* larger than the egress MTU: the stack fragments or sends the ICMP error */
#define XMIT_UNKNOWN_DEV 6    /* egress device (or the bridge port of the MAC) not known to take XDP frames */
#define XMIT_TTL 7            /* TTL would expire: the stack sends time exceeded */
#define XMIT_FIB_CACHED 8     /* also counted: redirect or tx decided from fib_cache, no fib lookup */
#define XMIT_MAX 9

#endif
